"""Losses and metrics of acceptance predictors (DESIGN §2, §3), DDP-safe via torchmetrics.

Predictions ``s_t = σ(logit_t)`` against soft targets ``a_t ∈ [0, 1]``; every metric but
``weighted_bce`` scores the acceptance probability ``σ(logit_t + log(w_rej / w_acc))``
(:func:`prior_shift`, folded into the exported head):

* ``weighted_bce``: ``-Σ[w_acc a log s + w_rej (1-a) log(1-s)] / Σ[w_acc a + w_rej (1-a)]``;
* ``binary_kl``: mean ``KL(Bern(a) ‖ Bern(s))`` (unweighted; the paper's evaluation metric), and
  the same for the constant predictor ``s = mean train label``;
* ``auroc``: of ``s_t`` against sampled outcomes ``o_t = 1[u_t < a_t]`` (fixed seed, see
  :mod:`accept_heads.training.training_data`), which in expectation equals the AUROC with ``a_t`` as soft weights;
  NaN (undefined) when every outcome is the same;
* ``ece``: expected calibration error over 15 equal-width bins of ``s``, against the soft ``a``
  (``Σ_b |Σ_{t∈b} s_t − Σ_{t∈b} a_t| / N``; the expected gap w.r.t. sampled outcomes);
* ``mean_pred`` / ``mean_label``.

The SV profile's information measures (bits) are :mod:`accept_heads.measure.information`'s.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn.functional import logsigmoid
from torchmetrics import MeanMetric, Metric, SumMetric
from torchmetrics.classification import BinaryAUROC


def weighted_bce(logits: Tensor, labels: Tensor, w_acc: float, w_rej: float) -> Tensor:
    """Weighted binary cross-entropy with soft labels (DESIGN §2), numerically stable in logits."""
    weights = w_acc * labels + w_rej * (1 - labels)
    nll = -(w_acc * labels * logsigmoid(logits) + w_rej * (1 - labels) * logsigmoid(-logits))
    return nll.sum() / weights.sum().clamp_min(1e-12)


def prior_shift(w_acc: float, w_rej: float) -> float:
    """``log(w_rej / w_acc)``: what weighted BCE takes off the acceptance log-odds (DESIGN §2).

    The minimiser of the weighted loss at soft label ``a`` has odds ``(w_acc / w_rej)·a / (1 − a)``,
    so adding this shift to a trained head's logit gives the acceptance probability's logit.
    """
    return math.log(w_rej / w_acc)


def binary_kl(labels: Tensor, logits: Tensor) -> Tensor:
    """Per-element ``KL(Bern(a) ‖ Bern(σ(logit)))`` in nats (``0 log 0 = 0``)."""
    return (
        torch.xlogy(labels, labels)
        + torch.xlogy(1 - labels, 1 - labels)
        - labels * logsigmoid(logits)
        - (1 - labels) * logsigmoid(-logits)
    )


class SoftCalibrationError(Metric):
    """Binned expected calibration error of probabilities against soft targets."""

    full_state_update = False

    def __init__(self, n_bins: int = 15) -> None:
        super().__init__()
        self.n_bins = n_bins
        for name in ("pred_sum", "label_sum", "count"):
            self.add_state(name, default=torch.zeros(n_bins, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, probs: Tensor, labels: Tensor) -> None:
        bins = (probs.detach() * self.n_bins).long().clamp(0, self.n_bins - 1)
        self.pred_sum += torch.bincount(bins, probs.detach().double(), self.n_bins)
        self.label_sum += torch.bincount(bins, labels.double(), self.n_bins)
        self.count += torch.bincount(bins, minlength=self.n_bins).double()

    def compute(self) -> Tensor:
        return ((self.pred_sum - self.label_sum).abs().sum() / self.count.sum().clamp_min(1)).float()


class AcceptanceMetrics(nn.Module):
    """All head metrics of one split; ``compute()`` returns ``{prefix + name: value}``.

    ``constant`` (the mean train label) adds ``binary_kl_constant``; ``auroc_thresholds=None``
    keeps every prediction for an exact AUROC, an int bins it (constant memory).
    """

    def __init__(
        self, prefix: str, w_acc: float, w_rej: float, constant: float | None = None, auroc_thresholds: int | None = None
    ) -> None:
        super().__init__()
        self.prefix, self.w_acc, self.w_rej, self.constant = prefix, w_acc, w_rej, constant
        self.bce_num, self.bce_den = SumMetric(), SumMetric()
        self.kl, self.kl_constant = MeanMetric(), MeanMetric()
        self.mean_pred, self.mean_label = MeanMetric(), MeanMetric()
        self.auroc = BinaryAUROC(thresholds=auroc_thresholds)
        self.accepted, self.outcomes = SumMetric(), SumMetric()  # AUROC is undefined with one class
        self.ece = SoftCalibrationError()

    @torch.no_grad()
    def update(self, logits: Tensor, labels: Tensor, outcomes: Tensor) -> None:
        """Add a batch of logits with their soft labels and sampled 0/1 outcomes."""
        if logits.numel() == 0:
            return
        logits, labels = logits.detach().float(), labels.float()
        weights = self.w_acc * labels + self.w_rej * (1 - labels)
        self.bce_num.update(weighted_bce(logits, labels, self.w_acc, self.w_rej) * weights.sum())
        self.bce_den.update(weights.sum())
        logits = logits + prior_shift(self.w_acc, self.w_rej)  # the acceptance probability's logit from here on
        self.kl.update(binary_kl(labels, logits))
        if self.constant is not None:
            constant_logit = torch.logit(torch.tensor(self.constant, device=logits.device).clamp(1e-6, 1 - 1e-6))
            self.kl_constant.update(binary_kl(labels, constant_logit.expand_as(labels)))
        probs = torch.sigmoid(logits)
        self.mean_pred.update(probs)
        self.mean_label.update(labels)
        self.auroc.update(probs, outcomes.long())
        self.accepted.update(outcomes.float().sum())
        self.outcomes.update(torch.tensor(float(outcomes.numel()), device=outcomes.device))
        self.ece.update(probs, labels)

    def compute(self) -> dict[str, Tensor]:
        values = {
            "weighted_bce": self.bce_num.compute() / self.bce_den.compute().clamp_min(1e-12),
            "binary_kl": self.kl.compute(),
            "auroc": self._auroc(),
            "ece": self.ece.compute(),
            "mean_pred": self.mean_pred.compute(),
            "mean_label": self.mean_label.compute(),
        }
        if self.constant is not None:
            values["binary_kl_constant"] = self.kl_constant.compute()
        return {self.prefix + name: value.float() for name, value in values.items()}

    def _auroc(self) -> Tensor:
        accepted, total = self.accepted.compute(), self.outcomes.compute()
        if accepted == 0 or accepted == total:
            return torch.tensor(float("nan"))
        return self.auroc.compute()

    def reset(self) -> None:
        for metric in self.children():
            metric.reset()


def outcome_calibration(probs: Tensor, outcomes: Tensor) -> dict[str, float]:
    """Estimates ``probs[N]`` against 0/1 ``outcomes[N]``: ``auroc`` (NaN with one class), ``ece`` (15 bins, as
    above) and ``brier`` (mean squared error)."""
    probs, outcomes = probs.float(), outcomes.float()
    ece = SoftCalibrationError()
    ece.update(probs, outcomes)
    auroc = BinaryAUROC()
    auroc.update(probs, outcomes.long())
    one_class = bool(outcomes.min() == outcomes.max())
    return {"auroc": math.nan if one_class else float(auroc.compute()), "ece": float(ece.compute()),
            "brier": float(((probs - outcomes) ** 2).mean())}
