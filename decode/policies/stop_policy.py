"""A length policy composed of an acceptance source and a stop rule, and the trained head's two stops (DESIGN §2)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch
from typing_extensions import Self

from decode.batch_costs import BatchCosts
from decode.costs import CostModel
from decode.draft_round import Decision, DraftRound
from decode.head import AcceptanceHead
from decode.metadata import recorded_k_range
from decode.policies.base import DEFAULT_K_MAX, BatchPlan, Policy
from decode.policies.sources import AcceptanceSource, HeadEstimate
from decode.policies.stops import Goodput, StopRule, Threshold

Source = TypeVar("Source", bound=AcceptanceSource)
Stop = TypeVar("Stop", bound=StopRule)

#: How the rows of a batch under a stop rule decide together, by the rule's class: the plan of a row policy, or None
#: where its rows decide as alone (:mod:`decode.policies.batch_plans` registers each where it defines it).
BATCH_PLANS: dict[type[StopRule], Callable[[Any], BatchPlan[Any] | None]] = {}


class StopPolicy(Policy, Generic[Source, Stop]):
    """A length policy composed of an acceptance source (:mod:`decode.policies.sources`) and a stop rule
    (:mod:`decode.policies.stops`).

    After each candidate it reads ``P̂_i`` from its source at the source's point of the round, updates the running
    keep-probability ``Π_i = Π_{j≤i} P̂_j`` (here only) and asks its rule whether to stop. In a batch, the plan
    registered for its rule's class decides with it (:data:`BATCH_PLANS`).
    """

    dynamic = True

    def __init__(self, source: Source, stop: Stop) -> None:
        self.source, self.stop = source, stop
        stop.price_source(source.price_key)
        self.needs_hidden, self.needs_hindsight = source.needs_hidden, source.needs_hindsight
        self.companion = source.companion
        self.keep = 1.0
        self.estimates: list[float] = []  # this round's P̂, in candidate order
        self._fed_past_stop = False  # this round's stop was read after the draft consumed y_i
        self._calls = (0, 0)  # the source's estimates and folded rounds since take_source_calls

    @property
    def k_min(self) -> int:
        return self.stop.k_min

    @property
    def k_max(self) -> int:
        return self.stop.k_max

    def fresh(self) -> Self:
        """A copy with its own stop-rule state and its source's :meth:`~AcceptanceSource.fresh` (models are shared)."""
        policy = copy.copy(self)
        policy.stop = copy.copy(self.stop)
        policy.source = self.source.fresh()
        policy.reset()
        return policy

    def to(self, device: torch.device) -> Self:
        self.source.to(device)
        return self

    def reset(self) -> None:
        self.stop.reset()
        self.source.reset()

    def k_cap(self) -> int:
        return self.stop.k_max

    def start_round(self) -> None:
        self.keep = 1.0
        self.estimates = []
        self._fed_past_stop = False

    def observe(self, accept: float) -> None:
        """Take the latest candidate's acceptance estimate into ``Π``."""
        self.keep *= accept
        self.estimates = [*self.estimates, accept]

    def round_estimates(self) -> list[float]:
        return self.estimates

    def estimate(self, state: DraftRound) -> float:
        """The source's ``P̂_i`` of the latest candidate (one call of it)."""
        estimates, folds = self._calls
        self._calls = (estimates + 1, folds)
        return self.source.estimate(state)

    @property
    def price_key(self) -> str | None:
        return self.source.price_key

    def take_source_calls(self) -> tuple[int, int]:
        calls, self._calls = self._calls, (0, 0)
        return calls

    def decide(self, state: DraftRound, accept: float) -> Decision:
        """The rule's decision after ``y_i`` with estimate ``accept``."""
        self.observe(accept)
        return Decision.STOP if self.stop.stops(state.i, self.keep, accept) else Decision.CONTINUE

    def after_propose(self, state: DraftRound) -> Decision:
        if self.source.decides_after != "propose":
            return Decision.CONTINUE
        return self.decide(state, self.estimate(state))

    def after_feed(self, state: DraftRound) -> Decision:
        if self.source.decides_after != "feed":
            return Decision.CONTINUE
        decision = self.decide(state, self.estimate(state))
        self._fed_past_stop = decision is Decision.STOP
        return decision

    def end_round(self, drafted: int, verified: int, accepted: int) -> None:
        self.source.end_round(verified, accepted)
        estimates, folds = self._calls
        self._calls = (estimates, folds + self.source.folds)
        self.stop.end_round(drafted, verified, accepted, self._fed_past_stop)

    def batch_plan(self) -> BatchPlan[Self]:
        """The plan registered for the stop rule's class or the nearest base class with one (:data:`BATCH_PLANS`),
        where it gives one; else each row decides as alone."""
        plan = next((BATCH_PLANS[kind](self) for kind in type(self.stop).__mro__ if kind in BATCH_PLANS), None)
        return plan if plan is not None else BatchPlan()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(source={type(self.source).__name__}, stop={self.stop!r})"


def policy_head(policy: Policy) -> AcceptanceHead | None:
    """The trained head a policy stops by (None: none), which must suit the decoder's draft, rule and sampling."""
    if isinstance(policy, StopPolicy) and isinstance(policy.source, HeadEstimate):
        return policy.source.head
    return None


class Head(StopPolicy[HeadEstimate, Threshold]):
    """SpecDec++ threshold rule on a trained head: keep drafting while ``1 − Π_{j≤i} P̂_j ≤ threshold``.

    Left out, ``threshold`` is the ``h`` the evaluation chose on dev for the head (``head.threshold``, from its record
    beside the head file, DESIGN §5) and the K range the one it records (1..DEFAULT_K_MAX where none is recorded)."""

    def __init__(self, head: AcceptanceHead, threshold: float | None = None, k_min: int | None = None,
                 k_max: int | None = None) -> None:
        if threshold is None:
            if head.threshold is None:
                raise ValueError("this head has no stop threshold h: run python -m accept_heads.evaluate (it chooses "
                                 "h on dev and records it beside the head) or pass Head(head, threshold=h)")
            threshold = head.threshold
        low, high = recorded_k_range(head.metadata, 1, DEFAULT_K_MAX)
        super().__init__(HeadEstimate(head), Threshold(threshold, low if k_min is None else k_min,
                                                       high if k_max is None else k_max))

    @property
    def head(self) -> AcceptanceHead:
        return self.source.head

    @property
    def threshold(self) -> float:
        return self.stop.threshold

    def __repr__(self) -> str:
        return (f"Head(timing={self.head.config.timing}, threshold={self.threshold}, "
                f"k_min={self.k_min}, k_max={self.k_max})")


class GoodputHead(StopPolicy[HeadEstimate, Goodput]):
    """A trained head with the goodput stop instead of a swept threshold ``h`` (DESIGN §2, goodput stop;
    :class:`~decode.policies.stops.Goodput`). In a batch with measured ``batch_costs`` the rule is taken for the
    batch as a whole (:class:`~decode.policies.batch_plans.BatchGoodput`; DESIGN §7); without them rows decide as
    alone."""

    def __init__(self, head: AcceptanceHead, costs: CostModel, k_min: int = 1, k_max: int = DEFAULT_K_MAX,
                 batch_costs: BatchCosts | None = None) -> None:
        source = HeadEstimate(head)
        super().__init__(source, Goodput(costs, k_min, k_max, batch_costs, companion=source.companion is not None))

    @property
    def head(self) -> AcceptanceHead:
        return self.source.head

    def __repr__(self) -> str:
        return f"GoodputHead(timing={self.head.config.timing}, k_min={self.k_min}, k_max={self.k_max})"
