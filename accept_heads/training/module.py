"""LightningModule training a SpecDec++ acceptance head on top of a frozen draft model."""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
import torch
from torch import Tensor

from accept_heads.training.features import DraftFeatures
from accept_heads.training.goodput_loss import GoodputObjective, RoundCosts
from accept_heads.training.metrics import AcceptanceMetrics, prior_shift, weighted_bce
from ahconf.schema import LossConfig, OptimConfig
from data_gen.schedule import warmup_cosine
from decode.costs import LatencyShape
from decode.head import AcceptanceHead


@dataclass
class HeadBatch:
    """A batch's loss positions ``[M]``, each at its every depth ``D`` (a feature draft's rounds; none otherwise)."""

    hidden: Tensor  # [M, (D,) H] the head's input states
    features: Tensor | None  # [M, (D,) F] its scalar features
    labels: Tensor  # [M(, D)] soft acceptance targets (NaN: no round reaches the position at that depth)
    outcomes: Tensor  # [M(, D)] sampled 0/1 outcomes
    rows: Tensor  # [M] the batch row (or the split's row) of each position
    positions: Tensor  # [M] its position in that row (consecutive positions: one round's candidates)


class HeadModule(L.LightningModule):
    """Trains ``head`` with the weighted BCE (and, with ``loss.goodput_weight > 0``, the goodput objective of
    :mod:`accept_heads.training.goodput_loss`); only the head's parameters are optimised and checkpointed.

    ``encoder`` runs the frozen draft on mixed batches (``None`` when training from a feature
    cache, whose batches already hold ``hidden`` / ``features``). ``constant`` is the mean train
    label, reported as the constant predictor's dev binary KL.
    """

    def __init__(
        self,
        head: AcceptanceHead,
        encoder: DraftFeatures | None,
        loss: LossConfig,
        optim: OptimConfig,
        constant: float,
    ) -> None:
        super().__init__()
        self.head = head
        self.encoder = encoder
        self.loss_config, self.optim_config = loss, optim
        self.goodput = goodput_objective(loss)
        self.train_metrics = AcceptanceMetrics("train/", loss.w_acc, loss.w_rej, auroc_thresholds=200)
        self.val_metrics = AcceptanceMetrics("val/", loss.w_acc, loss.w_rej, constant=constant)

    def inputs(self, batch: dict[str, Tensor]) -> HeadBatch:
        """The batch's head inputs, labels and outcomes at its loss positions (each position's every depth)."""
        if "hidden" in batch:
            return HeadBatch(batch["hidden"], batch.get("features"), batch["label"], batch["outcome"],
                             batch["entry_row"], batch["entry_position"])
        self.encoder.to(self.device)
        hidden, features = self.encoder(batch)
        mask = batch["loss_mask"]
        rows, positions = mask.nonzero(as_tuple=True)
        return HeadBatch(hidden, features, batch["label"][mask], batch["outcome"][mask], rows, positions)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, HeadBatch]:
        """Float logits ``[M(, D)]`` of a batch, with its inputs."""
        inputs = self.inputs(batch)
        return self.head(inputs.hidden, inputs.features).float(), inputs

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        logits, inputs = self(batch)
        kept = ~inputs.labels.isnan()
        labels, outcomes = inputs.labels[kept], inputs.outcomes[kept]
        loss = weighted_bce(logits[kept], labels, self.loss_config.w_acc, self.loss_config.w_rej)
        if self.goodput is not None:
            probabilities = torch.sigmoid(logits + prior_shift(self.loss_config.w_acc, self.loss_config.w_rej))
            stop = self.goodput(probabilities, inputs.labels, inputs.rows, inputs.positions)
            if stop is not None:
                self.log("train/goodput_loss", stop, batch_size=max(1, labels.numel()))
                loss = loss + self.loss_config.goodput_weight * stop
        self.train_metrics.update(logits[kept], labels, outcomes)
        self.log("train/loss", loss, prog_bar=True, batch_size=max(1, labels.numel()))
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=1)
        return loss

    def on_train_epoch_end(self) -> None:
        self.log_dict(self.train_metrics.compute(), sync_dist=True)  # already synced: silences Lightning's hint
        self.train_metrics.reset()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits, inputs = self(batch)
        kept = ~inputs.labels.isnan()
        self.val_metrics.update(logits[kept], inputs.labels[kept], inputs.outcomes[kept])

    def on_validation_epoch_end(self) -> None:
        values = self.val_metrics.compute()
        self.log("val/binary_kl", values.pop("val/binary_kl"), prog_bar=True, sync_dist=True)
        self.log("val/auroc", values.pop("val/auroc"), prog_bar=True, sync_dist=True)
        self.log_dict(values, sync_dist=True)
        self.val_metrics.reset()

    def configure_optimizers(self) -> dict:
        cfg = self.optim_config
        optimizer = torch.optim.AdamW(self.head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        total = int(self.trainer.estimated_stepping_batches)
        warmup = min(cfg.warmup_steps, max(0, total - 1))
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, warmup, total, cfg.min_lr_ratio)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def fold_prior_shift(head: AcceptanceHead, loss: LossConfig) -> float:
    """Make ``head`` predict acceptance probabilities: add the weighted loss's :func:`prior_shift` to
    its output bias (a no-op for ``w_acc = w_rej``); returns the shift."""
    shift = prior_shift(loss.w_acc, loss.w_rej)
    with torch.no_grad():
        head.out.bias += shift
    return shift


def goodput_objective(loss: LossConfig) -> GoodputObjective | None:
    """The goodput term ``loss`` asks for (None: the BCE alone)."""
    if not loss.goodput_weight:
        return None
    costs = RoundCosts(loss.goodput_draft_cost, LatencyShape(tuple(loss.goodput_verify_shape)))
    return GoodputObjective(costs, loss.goodput_k, loss.goodput_temperature)
