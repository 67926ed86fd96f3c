"""Length schedules: policies that decide from the draft alone, or from the rounds so far, without an acceptance
source (DESIGN §6).

:class:`Fixed`, :class:`TargetOnly` and HF's :class:`Heuristic` decide before drafting; :class:`Confidence` is the
per-token confidence stop (llama.cpp's ``max q_i < τ``), :class:`RefitConfidence` transformers' confidence stop on
``q_i(y_i)`` with its threshold refitted on the verified rounds (ROC, :func:`roc_threshold`), and :class:`SVIP` the
per-token entropy stop of SVIP (stop once ``sqrt(H(q_i))`` exceeds ``h``).
"""

from __future__ import annotations

import math

import numpy as np

from decode.draft_round import Decision, DraftRound
from decode.policies.base import DEFAULT_K_MAX, Policy
from decode.policies.sources import draft_entropy, draft_top_probability


class Fixed(Policy):
    """Always draft ``k`` candidates."""

    def __init__(self, k: int = 5) -> None:
        if k < 1:
            raise ValueError(f"Fixed(k) needs k >= 1, got {k}")
        self.k = k

    def k_cap(self) -> int:
        return self.k

    def __repr__(self) -> str:
        return f"Fixed(k={self.k})"


class TargetOnly(Policy):
    """Draft nothing: every round is a target-only step. The target alone decoded by this project's own loop (its
    caches, batching and sampling), the baseline a batched method is timed against without HF ``generate``'s
    per-step overhead (``K = 0`` among the fixed lengths)."""

    def k_cap(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "TargetOnly()"


class Heuristic(Policy):
    """HF's ``heuristic`` schedule: ``k += 2`` after a fully accepted round, else ``k = max(1, k − 1)``.

    Starts at ``k0 = 5`` on every generation (HF's ``num_assistant_tokens`` defaults to 20 and is
    carried across calls; a fixed restart keeps generations reproducible) and is capped at ``k_max``.
    """

    def __init__(self, k0: int = 5, k_max: int = DEFAULT_K_MAX) -> None:
        if not 1 <= k0 <= k_max:
            raise ValueError(f"Heuristic needs 1 <= k0 <= k_max, got k0={k0}, k_max={k_max}")
        self.k0, self.k_max = k0, k_max
        self.k = k0

    def reset(self) -> None:
        self.k = self.k0

    def k_cap(self) -> int:
        return self.k

    def end_round(self, drafted: int, verified: int, accepted: int) -> None:
        self.k = min(self.k_max, self.k + 2) if accepted == verified else max(1, self.k - 1)

    def __repr__(self) -> str:
        return f"Heuristic(k0={self.k0}, k_max={self.k_max})"


class Confidence(Policy):
    """Stop drafting after ``y_i`` when the draft's top probability ``max q_i < tau`` (``y_i`` is kept)."""

    dynamic = True

    def __init__(self, tau: float = 0.4, k_max: int = DEFAULT_K_MAX) -> None:
        if not 0.0 <= tau <= 1.0 or k_max < 1:
            raise ValueError(f"Confidence needs tau in [0, 1] and k_max >= 1, got tau={tau}, k_max={k_max}")
        self.tau, self.k_max = tau, k_max
        self.tops: list[float] = []  # this round's max q_i, in candidate order

    def k_cap(self) -> int:
        return self.k_max

    def start_round(self) -> None:
        self.tops: list[float] = []

    def round_estimates(self) -> list[float]:
        return self.tops

    def after_propose(self, state: DraftRound) -> Decision:
        top = draft_top_probability(state)
        self.tops = [*self.tops, top]
        return Decision.STOP if top < self.tau else Decision.CONTINUE

    def __repr__(self) -> str:
        return f"Confidence(tau={self.tau}, k_max={self.k_max})"


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

    def __init__(self, tau: float = 0.4, k_max: int = DEFAULT_K_MAX) -> None:
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

    def __init__(self, h: float = 1.0, k_max: int = DEFAULT_K_MAX) -> None:
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
