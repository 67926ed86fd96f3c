"""The batch plans of the stop rules that decide for a batch (DESIGN §7), each registered for its rule's class.

A batch's rows are :meth:`~decode.policies.base.Policy.fresh` copies of one
:class:`~decode.policies.stop_policy.StopPolicy`, so a plan reads them as such: their running ``Π``, their estimates
and their stop rule's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

import numpy as np

from decode.batch_costs import BatchCosts
from decode.policies.base import BatchPlan
from decode.policies.sources import AcceptanceSource
from decode.policies.stop_policy import BATCH_PLANS, StopPolicy
from decode.policies.stops import Goodput, StopRule, SurvivalStop, batch_drafting_pays, batch_opening_pays

GoodputRow = StopPolicy[AcceptanceSource, Goodput]
BudgetRow = StopPolicy[AcceptanceSource, SurvivalStop]
Make = TypeVar("Make", bound=Callable[[Any], Any])


def plans_for(stop: type[StopRule]) -> Callable[[Make], Make]:
    """Decorator: register a row policy → plan function for the stop rules of class ``stop``."""
    def register(make: Make) -> Make:
        BATCH_PLANS[stop] = make
        return make

    return register


class BatchGoodput(BatchPlan[GoodputRow]):
    """The goodput stop of a batch's rows taken for the batch at measured ``batch_costs`` (DESIGN §7).

    Tracks the batch's modelled throughput ``λ_B`` (tokens per modelled second so far; before the
    first round the target alone's at the batch size), opens a round only where drafting pays
    (:func:`~decode.policies.stops.batch_opening_pays`) and stops the rows together
    (:func:`~decode.policies.stops.batch_drafting_pays`).
    """

    def __init__(self, costs: BatchCosts) -> None:
        self.costs = costs
        self.tokens, self.seconds = 0, 0.0
        self.throughput = 0.0  # λ_B at the start of the current round

    def opens_round(self, rows: list[GoodputRow]) -> bool:
        batch = len(rows)
        alone = batch / self.costs.target_time(batch, batch)
        self.throughput = self.tokens / self.seconds if self.seconds > 0 else alone
        stops = [row.stop for row in rows]
        for stop in stops:
            stop.join_batch()
        return batch_opening_pays(stops, batch, max(self.throughput, alone))

    def drafting(self, rows: list[GoodputRow], i: int, batch: int, after: Literal["propose", "feed"]) -> list[bool]:
        if not rows or rows[0].source.decides_after != after:
            return [True] * len(rows)
        return [batch_drafting_pays([row.stop for row in rows], i, batch, self.throughput)] * len(rows)

    def end_round(self, batch: int, emitted: int, draft_steps: int, verified: int) -> None:
        self.tokens += emitted
        self.seconds += draft_steps * self.costs.draft_time(batch) + self.costs.verify_time(batch, verified)


@plans_for(Goodput)
def goodput_plan(policy: GoodputRow) -> BatchGoodput | None:
    """The goodput stop decides for the batch at its measured batch costs; without them each row decides as alone."""
    costs = policy.stop.batch_costs
    return BatchGoodput(costs) if costs is not None else None


class SurvivalBudget(BatchPlan[BudgetRow]):
    """vLLM's verification budget as a stopping time (DESIGN §7, "Survival budget"): after each drafting step the
    rows still drafting are ranked by the survival ``Π_{j≤i} P̂_j · P̂_i`` their next candidate is forecast to
    reach, and the top ``n`` draft on, ``n`` maximising the round's expected tokens (one per row plus every drafted
    candidate's survival) over its modelled seconds at the measured ``t_d(B)`` and ``t_t(B, T)``; ``n = 0`` ends
    drafting. A round opens (each row drafts its first candidate) unless the rows' first-candidate forecasts, the mean
    ``P̂_1`` of their generation so far, say a target-only step is faster. Decisions read only what was drafted, so
    every rule stays lossless.
    """

    def __init__(self, costs: BatchCosts) -> None:
        self.costs = costs
        self.batch: list[BudgetRow] = []
        self.draft_seconds = 0.0  # this round's draft forwards so far
        self.first_sum, self.first_count = 0.0, 0  # P̂_1 of the generation's rounds so far (the opening forecast)

    def opens_round(self, rows: list[BudgetRow]) -> bool:
        self.batch = list(rows)
        batch = len(rows)
        self.draft_seconds = self.costs.draft_time(batch)  # the forward that produces every row's q_1
        if not self.first_count:
            return True
        forecast = self.first_sum / self.first_count
        alone = batch / self.costs.target_time(batch, batch)
        drafted = batch * (1 + forecast) / (self.draft_seconds + self.costs.verify_time(batch, batch))
        return drafted > alone

    def drafting(self, rows: list[BudgetRow], i: int, batch: int, after: Literal["propose", "feed"]) -> list[bool]:
        if not rows or rows[0].source.decides_after != after:
            return [True] * len(rows)
        if i == 1:
            firsts = [p.estimates[0] for p in self.batch if p.estimates]
            self.first_sum, self.first_count = self.first_sum + sum(firsts), self.first_count + len(firsts)
        if i < rows[0].k_min:
            self.draft_seconds += self.costs.draft_time(len(rows))
            return [True] * len(rows)
        drafted = sum(len(p.estimates) for p in self.batch)
        tokens = len(self.batch) + sum(float(np.prod(p.estimates[: j + 1])) for p in self.batch
                                       for j in range(len(p.estimates)))
        seconds = self.draft_seconds + self.costs.verify_time(len(self.batch), drafted)
        forecasts = [p.keep * p.estimates[-1] for p in rows]
        order = sorted(range(len(rows)), key=lambda r: -forecasts[r])
        best, best_rate, gain = 0, tokens / seconds, 0.0
        for n, r in enumerate(order, start=1):
            gain += forecasts[r]
            cost = self.costs.draft_time(n) + self.costs.verify_time(len(self.batch), drafted + n)
            if (tokens + gain) / (self.draft_seconds + cost) > best_rate:
                best, best_rate = n, (tokens + gain) / (self.draft_seconds + cost)
        if best:
            self.draft_seconds += self.costs.draft_time(best)
        chosen = set(order[:best])
        return [r in chosen for r in range(len(rows))]


@plans_for(SurvivalStop)
def survival_plan(policy: BudgetRow) -> SurvivalBudget:
    """The survival budget decides for the batch at the rule's measured batch costs."""
    return SurvivalBudget(policy.stop.costs)
