"""Training-free acceptance sources and stops: what the engines estimate acceptance with, at no training cost.

Each source gives ``P̂_i`` for the latest candidate from the draft's own output, so it composes with any stop
rule of :mod:`decode.stop_rules` in a :class:`decode.policies.StopPolicy` (DESIGN §2, "Training-free sources"):

- :class:`DraftConfidence`: the draft's top probability ``max q_i`` (HF's and llama.cpp's confidence);
- :class:`EntropyBound`: AdaEDL's entropy bound ``1 − sqrt(γ·H(q_i))``;
- :class:`OnlineMargin`: vLLM's online logistic on the draft's top-2 log-probability margin, one intercept and
  slope per position, refitted on the decoder's own verified rounds (:class:`MarginLogistic`).

:class:`SVIP` is the per-token entropy stop of SVIP (stop once ``sqrt(H(q_i))`` exceeds ``h``), as
:class:`decode.policies.Confidence` is the per-token confidence stop.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from decode.draft_round import Decision, DraftRound
from decode.head import head_features
from decode.policies import AcceptanceSource, Policy
from decode.sampling import Sampling


def draft_entropy(sampling: Sampling, q_logits: Tensor) -> float:
    """``H(q)`` in nats of the draft's confidence-type distribution (:meth:`Sampling.feature_probs`)."""
    q = sampling.feature_probs(q_logits)
    return float(head_features(q, q.argmax(-1), ("entropy",))[..., 0])


def top2_margin(sampling: Sampling, q_logits: Tensor) -> float:
    """``log q(top 1) − log q(top 2)`` of the draft's confidence-type distribution: its top-2 logit margin."""
    top = sampling.feature_probs(q_logits).topk(2, dim=-1).values.clamp_min(1e-30).log()
    return float(top[..., 0] - top[..., 1])


class DraftConfidence(AcceptanceSource):
    """``P̂_i = max q_i``: the draft's top probability, read once ``y_i`` is proposed."""

    def estimate(self, state: DraftRound) -> float:
        return float(state.sampling.feature_probs(state.latest.step.q_logits).max())


class EntropyBound(AcceptanceSource):
    """AdaEDL's lower bound on the acceptance probability, ``P̂_i = max(0, 1 − sqrt(γ·H(q_i)))`` (``H`` in nats).

    AdaEDL stops once the bound falls below a threshold it adapts online; here the bound is a source, so the stop is
    any stop rule (a threshold on ``Π`` chosen on dev, or the goodput stop).
    """

    def __init__(self, gamma: float = 1.0) -> None:
        if gamma <= 0:
            raise ValueError(f"EntropyBound needs gamma > 0, got {gamma}")
        self.gamma = gamma

    def estimate(self, state: DraftRound) -> float:
        return max(0.0, 1.0 - math.sqrt(self.gamma * draft_entropy(state.sampling, state.latest.step.q_logits)))


class MarginLogistic:
    """Per-position logistic regressions ``P̂_i = σ(a_i + b_i·m)`` on the top-2 margin ``m``, fitted online.

    Observations are the decoder's verified candidates: candidate ``i`` of a round is a positive when accepted, the
    first rejected one a negative, and those after it unobserved (their acceptance is conditional on the prefix's).
    Every ``refit_every`` rounds each position with ``min_count`` observations of both outcomes is refitted on all of
    its observations (Newton's method on the log-loss with a small ridge on the slope); the other positions use the
    fit pooled over every position. Before the first fit ``P̂`` is the acceptance rate observed so far, starting at ½
    (vLLM verifies everything while it warms up; here the source decides how far to draft, so it needs an estimate).
    State is kept across generations, as an engine keeps it across requests.
    """

    def __init__(self, refit_every: int = 100, min_count: int = 20, ridge: float = 1e-4) -> None:
        if refit_every < 1 or min_count < 2 or ridge < 0:
            raise ValueError(f"MarginLogistic needs refit_every >= 1, min_count >= 2 and ridge >= 0, got "
                             f"{refit_every}, {min_count}, {ridge}")
        self.refit_every, self.min_count, self.ridge = refit_every, min_count, ridge
        self.observations: dict[int, list[tuple[float, bool]]] = {}
        self.accepted, self.observed = 0, 0
        self.coefficients: dict[int, tuple[float, float]] = {}  # position → (a, b); 0 → the pooled fit
        self.rounds_since_fit = 0

    def predict(self, i: int, margin: float) -> float:
        """``P̂`` of a candidate at position ``i`` with top-2 margin ``margin``."""
        a, b = self.coefficients.get(i, self.coefficients.get(0, (math.nan, 0.0)))
        if math.isnan(a):
            return (self.accepted + 1) / (self.observed + 2)
        return 1.0 / (1.0 + math.exp(-(a + b * margin)))

    def observe(self, i: int, margin: float, accepted: bool) -> None:
        """Record the outcome of a verified candidate at position ``i``."""
        self.observations.setdefault(i, []).append((margin, accepted))
        self.accepted, self.observed = self.accepted + accepted, self.observed + 1

    def end_round(self) -> None:
        """Count a verified round; refit every ``refit_every`` rounds."""
        self.rounds_since_fit += 1
        if self.rounds_since_fit >= self.refit_every:
            self.refit()

    def refit(self) -> None:
        """Fit every position with enough observations of both outcomes, and the pooled fit."""
        self.rounds_since_fit = 0
        pooled = [obs for column in self.observations.values() for obs in column]
        fitted = {0: pooled} | self.observations
        for i, column in fitted.items():
            if len(column) >= self.min_count and 0 < sum(label for _, label in column) < len(column):
                self.coefficients[i] = fit_logistic(column, self.ridge)


def fit_logistic(observations: list[tuple[float, bool]], ridge: float = 1e-4, steps: int = 50) -> tuple[float, float]:
    """``(a, b)`` minimising the mean log-loss of ``σ(a + b·m)`` plus ``ridge·b²/2`` (Newton's method, float64)."""
    data = torch.tensor([(1.0, margin) for margin, _ in observations], dtype=torch.float64)
    labels = torch.tensor([float(label) for _, label in observations], dtype=torch.float64)
    penalty = torch.diag(torch.tensor([0.0, ridge], dtype=torch.float64))
    mean = labels.mean().clamp(1e-6, 1 - 1e-6)
    weights = torch.tensor([math.log(mean / (1 - mean)), 0.0], dtype=torch.float64)
    n = len(labels)
    for _ in range(steps):
        probs = torch.sigmoid(data @ weights)
        gradient = data.T @ (probs - labels) / n + penalty @ weights
        hessian = (data.T * (probs * (1 - probs))) @ data / n + penalty + 1e-12 * torch.eye(2, dtype=torch.float64)
        step = torch.linalg.solve(hessian, gradient)
        weights = weights - step
        if float(step.abs().max()) < 1e-10:
            break
    return float(weights[0]), float(weights[1])


class OnlineMargin(AcceptanceSource):
    """vLLM's acceptance estimate for a draft without a confidence head: :class:`MarginLogistic` on the draft's
    top-2 margin, learning from this decoder's own verified rounds (no training data).

    A batch's rows share one fit (:meth:`fresh`) and each keeps its round's margins.
    """

    def __init__(self, fit: MarginLogistic | None = None) -> None:
        self.fit = fit if fit is not None else MarginLogistic()
        self.margins: dict[int, float] = {}

    def fresh(self) -> OnlineMargin:
        return OnlineMargin(self.fit)

    def estimate(self, state: DraftRound) -> float:
        margin = top2_margin(state.sampling, state.latest.step.q_logits)
        self.margins[state.i] = margin
        return self.fit.predict(state.i, margin)

    def end_round(self, verified: int, accepted: int) -> None:
        for i in range(1, min(verified, accepted + 1) + 1):
            if i in self.margins:
                self.fit.observe(i, self.margins[i], i <= accepted)
        self.margins = {}
        self.fit.end_round()


class SVIP(Policy):
    """SVIP's stop: after ``y_i``, stop drafting once ``sqrt(H(q_i)) > h`` (``y_i`` is kept; ``H`` in nats)."""

    dynamic = True

    def __init__(self, h: float = 1.0, k_max: int = 20) -> None:
        if h < 0 or k_max < 1:
            raise ValueError(f"SVIP needs h >= 0 and k_max >= 1, got h={h}, k_max={k_max}")
        self.h, self.k_max = h, k_max

    def k_cap(self) -> int:
        return self.k_max

    def after_propose(self, state: DraftRound) -> Decision:
        entropy = draft_entropy(state.sampling, state.latest.step.q_logits)
        return Decision.STOP if math.sqrt(entropy) > self.h else Decision.CONTINUE

    def __repr__(self) -> str:
        return f"SVIP(h={self.h}, k_max={self.k_max})"
