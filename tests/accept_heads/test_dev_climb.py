"""The dev search's climb over a tuned grid (accept_heads.evaluation.plan.climb) against a known throughput curve."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from accept_heads.evaluation.choice import Choice
from accept_heads.evaluation.plan import climb
from accept_heads.measure.runs import RunSpec
from decode.policy_specs import FixedSpec, HeuristicSpec

GRID = range(1, 11)
SWEEP = [RunSpec(set="dev", rule="speculative", policy=HeuristicSpec()),
         *(RunSpec(set="dev", rule="speculative", policy=FixedSpec(k), chosen_on="grid") for k in GRID)]


def searched(curve: Callable[[int], float], search: str = "climb") -> tuple[list[int], int]:
    """The fixed K a search decodes (in order) and the K it chooses, ties to the smaller K as the selection does."""
    decoded: list[RunSpec] = []
    choices: list[Choice] = []
    while wanted := [spec for spec in climb(SWEEP, choices, search) if spec not in decoded]:
        decoded += wanted
        ks = [int(spec.param) for spec in decoded if spec.family == "fixed"]
        best = max(ks, key=lambda k: (curve(k), -k))
        choices = [Choice(rule="speculative", rule_param=None, family="fixed", artifact=None, value=float(best),
                          dev_throughput=curve(best))]
    assert decoded[0].family == "heuristic" and sum(spec.family == "heuristic" for spec in decoded) == 1
    return [int(spec.param) for spec in decoded if spec.family == "fixed"], int(choices[0].value)


@pytest.mark.parametrize("peak", [1, 3, 6, 10])
def test_the_climb_finds_the_peak_of_a_unimodal_curve_decoding_fewer_points(peak):
    ks, chosen = searched(lambda k: -abs(k - peak))
    assert chosen == peak
    assert len(ks) == len(set(ks)) < len(GRID)  # nothing decoded twice, the grid not decoded whole
    assert {peak - 1, peak, peak + 1} & set(GRID) <= set(ks)  # it stops where the peak's neighbours are decoded


def test_on_a_flat_curve_the_climb_walks_down_to_the_choice_the_whole_grid_makes():
    """Ties go to the smaller value, so a flat stretch is walked towards its smaller end, as the grid's selection."""
    ks, chosen = searched(lambda k: 1.0)
    assert (ks, chosen) == ([5, 6, 7, 4, 3, 2, 1], searched(lambda k: 1.0, "grid")[1])


def test_the_grid_search_decodes_every_point_at_once_and_a_climb_can_miss_a_second_peak():
    """The negative control: a curve with a far peak the climb from the middle never reaches; the grid search does."""
    curve = {1: 9.0, 2: 1.0, 3: 0.0, 4: 0.0, 5: 1.0, 6: 2.0, 7: 1.0, 8: 0.0, 9: 0.0, 10: 0.0}.__getitem__
    assert searched(curve, "grid") == (list(GRID), 1)
    ks, chosen = searched(curve)
    assert chosen == 6 and 1 not in ks
