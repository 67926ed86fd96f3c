"""Analysis bounds, never serving policies: they read the target in hindsight (DESIGN §5).

:class:`Oracle` is the realised oracle; :class:`PerfectHead` and :class:`PerfectGoodput` are the perfect predictor, the
head's two stops fed each candidate's true acceptance probability.
"""

from __future__ import annotations

import sys

from decode.costs import CostModel
from decode.draft_round import Decision, DraftRound
from decode.policies.base import DEFAULT_K_MAX, Policy
from decode.policies.sources import TrueAcceptance
from decode.policies.stop_policy import StopPolicy
from decode.policies.stops import Goodput, Threshold


class Oracle(Policy):
    """The realised oracle, for every rule (an analysis bound): stop exactly before the first rejection.

    Each candidate's verification uniform ``u_i`` is drawn when it is proposed and its acceptance
    probability ``a_i`` computed from an uncounted target forward (:attr:`needs_hindsight`); the
    round drops ``y_i`` at the first ``u_i ≥ a_i`` and the target verifies the rest with those same
    uniforms, so nothing it verifies is rejected (up to float ties between the hindsight forward and
    the verification forward). This couples the randomness: the rounds accept exactly the prefixes a
    policy drafting without limit would get accepted with the same draws, without paying for the
    rejected candidate. It peeks at the future and is not lossless (the token after the prefix comes
    from the bonus distribution, not the residual) — a bound to count against. Draft calls follow
    SpecDec++ Thm 4.1 (DESIGN §5): the forward that produced ``q_i`` for the dropped ``y_i`` is
    hindsight too and is not charged (a stop before ``y_i`` never needs ``q_i``), so
    ``draft_calls = accepted``. For greedy this is the Thm 4.1 oracle.
    """

    dynamic = True
    needs_hindsight = True

    def __init__(self, k_max: int | None = None) -> None:
        if k_max is not None and k_max < 1:
            raise ValueError(f"Oracle(k_max) needs k_max >= 1 or None, got {k_max}")
        self.k_max = k_max

    def k_cap(self) -> int:
        return self.k_max if self.k_max is not None else sys.maxsize

    def after_propose(self, state: DraftRound) -> Decision:
        hindsight = state.latest.hindsight
        return Decision.DROP if float(hindsight.draw) >= hindsight.accept_prob else Decision.CONTINUE

    def __repr__(self) -> str:
        return f"Oracle(k_max={self.k_max})"


class PerfectHead(StopPolicy[TrueAcceptance, Threshold]):
    """:class:`~decode.policies.stop_policy.Head`'s threshold stop (``1 − Π a_j > threshold``) on the true acceptance
    probabilities ``a_j``."""

    def __init__(self, threshold: float = 0.5, k_min: int = 1, k_max: int = DEFAULT_K_MAX) -> None:
        super().__init__(TrueAcceptance(), Threshold(threshold, k_min, k_max))

    @property
    def threshold(self) -> float:
        return self.stop.threshold

    def __repr__(self) -> str:
        return f"PerfectHead(threshold={self.threshold}, k_min={self.k_min}, k_max={self.k_max})"


class PerfectGoodput(StopPolicy[TrueAcceptance, Goodput]):
    """:class:`~decode.policies.stop_policy.GoodputHead`'s goodput stop on the true acceptance probabilities (batch
    size 1)."""

    def __init__(self, costs: CostModel, k_min: int = 1, k_max: int = DEFAULT_K_MAX) -> None:
        super().__init__(TrueAcceptance(), Goodput(costs, k_min, k_max))

    def __repr__(self) -> str:
        return f"PerfectGoodput(k_min={self.k_min}, k_max={self.k_max})"
