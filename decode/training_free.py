"""Training-free acceptance sources and stops: what the engines estimate acceptance with, at no training cost.

Each source gives ``P̂_i`` for the latest candidate from the draft's own output, so it composes with any stop
rule of :mod:`decode.stop_rules` in a :class:`decode.policies.StopPolicy` (DESIGN §2, "Training-free sources"):

- :class:`DraftConfidence`: the draft's top probability ``max q_i`` (HF's and llama.cpp's confidence);
- :class:`EntropyBound`: AdaEDL's entropy bound ``1 − sqrt(γ·H(q_i))``;
- :class:`OnlineMargin`: vLLM's online logistic on the draft's top-2 log-probability margin, one intercept and
  slope per position, refitted on the decoder's own verified rounds (:class:`MarginLogistic`).

:class:`SVIP` is the per-token entropy stop of SVIP (stop once ``sqrt(H(q_i))`` exceeds ``h``), as
:class:`decode.policies.Confidence` is the per-token confidence stop; :class:`RefitConfidence` is transformers'
confidence stop on ``q_i(y_i)`` with its threshold refitted on the verified rounds (ROC, :func:`roc_threshold`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from decode.draft_round import Decision, DraftRound
from decode.head import head_features
from decode.policies import AcceptanceSource, Policy, draft_top_probability
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
        return draft_top_probability(state)


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


def roc_threshold(probs: np.ndarray, matches: np.ndarray, miss_cost: float = 3.0) -> float | None:
    """The threshold ``τ`` on ``probs`` minimising ``FPR + miss_cost · FNR`` of the rule ``p ≥ τ`` against
    ``matches`` (transformers' refit of its assistant confidence threshold; None without both outcomes). Candidates
    are each observed probability and ``+∞`` (predict nothing); ties go to the higher ``τ``."""
    positives, negatives = int(matches.sum()), int((1 - matches).sum())
    if not positives or not negatives:
        return None
    order = np.argsort(-probs, kind="stable")
    ranked, hits = probs[order], matches[order]
    last = np.r_[np.nonzero(np.diff(ranked))[0], len(ranked) - 1]  # the end of each run of equal probabilities
    tpr = np.r_[0.0, np.cumsum(hits)[last] / positives]
    fpr = np.r_[0.0, np.cumsum(1 - hits)[last] / negatives]
    thresholds = np.r_[np.inf, ranked[last]]
    return float(thresholds[int(np.argmin(fpr + miss_cost * (1 - tpr)))])


class RefitConfidence(Policy):
    """transformers' confidence stop with its threshold refitted: stop drafting after ``y_i`` once the draft's
    probability of it, ``q_i(y_i)``, falls below ``τ``; after every round ``τ`` is refitted on every verified
    candidate so far (accepted, or the first rejected) by :func:`roc_threshold` (a missed acceptance costs three
    false ones, as in transformers). It starts at ``tau`` (transformers' default 0.4) and learns across the
    generations of one decoder; a batch's rows share it.
    """

    dynamic = True

    def __init__(self, tau: float = 0.4, k_max: int = 20) -> None:
        if not 0.0 <= tau <= 1.0 or k_max < 1:
            raise ValueError(f"RefitConfidence needs tau in [0, 1] and k_max >= 1, got tau={tau}, k_max={k_max}")
        self.k_max = k_max
        self.fit = ConfidenceHistory(tau)
        self.probs: list[float] = []  # this round's q_i(y_i)

    def k_cap(self) -> int:
        return self.k_max

    def start_round(self) -> None:
        self.probs = []

    def round_estimates(self) -> list[float]:
        return self.probs

    def after_propose(self, state: DraftRound) -> Decision:
        candidate = state.latest
        prob = float(state.sampling.feature_probs(candidate.step.q_logits)[candidate.token])
        self.probs = [*self.probs, prob]
        return Decision.STOP if prob < self.fit.tau else Decision.CONTINUE

    def end_round(self, drafted: int, verified: int, accepted: int) -> None:
        observed = min(verified, accepted + 1, len(self.probs))
        self.fit.add(self.probs[:observed], [j < accepted for j in range(observed)])

    def __repr__(self) -> str:
        return f"RefitConfidence(tau={self.fit.tau:.3g}, k_max={self.k_max})"


class ConfidenceHistory:
    """The verified candidates' ``q(y)`` and outcomes so far, and the threshold refitted on them."""

    def __init__(self, tau: float) -> None:
        self.tau = tau
        self.probs: list[float] = []
        self.matches: list[int] = []

    def add(self, probs: list[float], accepted: list[bool]) -> None:
        """Record a round's verified candidates and refit ``τ`` (kept where one outcome is still missing)."""
        self.probs += probs
        self.matches += [int(a) for a in accepted]
        tau = roc_threshold(np.asarray(self.probs), np.asarray(self.matches, dtype=float))
        if tau is not None:
            self.tau = tau


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
