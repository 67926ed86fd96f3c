"""The survival budget: which rows of a batch draft on, by their survival and the measured batch costs."""

from __future__ import annotations

import itertools
import math

import pytest

from decode.batch_costs import BatchCosts
from decode.policies.batch_plans import SurvivalBudget
from decode.policies.sources import DraftConfidence
from decode.policies.stop_policy import StopPolicy
from decode.policies.stops import SurvivalStop

#: Drafting is cheap and a verification costs the same for any number of tokens: drafting on pays for likely tokens.
FLAT = BatchCosts(batches=(1, 4), draft=(0.05, 0.06), target=((1.0, 1.0, 1.0, 1.0), (1.2, 1.2, 1.2, 1.2)))
#: Every draft forward costs fifty target steps: nothing pays.
HOPELESS = BatchCosts(batches=(1, 4), draft=(50.0, 50.0), target=((1.0,) * 4, (1.0,) * 4))


def rows_with(estimates: list[list[float]], costs: BatchCosts) -> list[StopPolicy]:
    """Policies of a batch's rows that have judged their candidates so far by these estimates."""
    rows = []
    for row_estimates in estimates:
        policy = StopPolicy(DraftConfidence(), SurvivalStop(costs, k_max=8))
        policy.start_round()
        for estimate in row_estimates:
            policy.observe(estimate)
        rows.append(policy)
    return rows


def round_rate(plan: SurvivalBudget, rows: list[StopPolicy], going: set[int]) -> float:
    """Expected tokens per modelled second of the round if the rows in ``going`` draft one more candidate."""
    tokens = sum(1 + sum(math.prod(p.estimates[: j + 1]) for j in range(len(p.estimates))) for p in rows)
    tokens += sum(rows[r].keep * rows[r].estimates[-1] for r in going)
    drafted = sum(len(p.estimates) for p in rows) + len(going)
    extra = plan.costs.draft_time(len(going)) if going else 0.0
    return tokens / (plan.draft_seconds + extra + plan.costs.verify_time(len(rows), drafted))


def test_the_rows_that_draft_on_are_the_best_subset_by_the_rounds_expected_rate():
    estimates = [[0.95, 0.9], [0.2, 0.1], [0.7, 0.6], [0.9, 0.05]]
    rows = rows_with(estimates, FLAT)
    plan = SurvivalBudget(FLAT)
    assert plan.opens_round(rows)
    start = plan.draft_seconds
    going = plan.drafting(rows, 2, len(rows), "propose")
    chosen = {r for r, on in enumerate(going) if on}
    plan.draft_seconds = start  # the rate of every subset from the same point
    best = max((set(s) for n in range(len(rows) + 1) for s in itertools.combinations(range(len(rows)), n)),
               key=lambda s: round_rate(plan, rows, s))
    assert chosen == best and 0 < len(chosen) < len(rows)
    assert 0 in chosen and 1 not in chosen  # the surest row drafts on, the likeliest to fail does not


def test_nothing_drafts_on_where_drafting_never_pays_and_later_rounds_do_not_open():
    rows = rows_with([[0.9], [0.8]], HOPELESS)
    plan = SurvivalBudget(HOPELESS)
    assert plan.opens_round(rows)  # no forecast yet
    assert plan.drafting(rows, 1, 2, "propose") == [False, False]
    assert not plan.opens_round(rows)  # the first candidates' P̂ say a target-only step is faster


def test_a_row_never_stops_alone_and_the_budget_honours_k_min():
    policy = StopPolicy(DraftConfidence(), SurvivalStop(HOPELESS, k_min=3, k_max=8))
    assert not policy.stop.stops(5, 0.01, 0.01) and policy.stop.next_pays(5, 0.01, 0.01)
    rows = [policy]
    policy.start_round()
    policy.observe(0.1)
    plan = SurvivalBudget(HOPELESS)
    plan.opens_round(rows)
    assert plan.drafting(rows, 1, 1, "propose") == [True]  # below k_min
    with pytest.raises(ValueError):
        SurvivalStop(HOPELESS, k_min=0)
