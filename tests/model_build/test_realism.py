"""The zoo's realism figures: greedy oracle counting, confidence AUROC, degeneracy, checks and margins."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from decode.costs import CostModel
from model_build.zoo.realism import (
    PAPER_COSTS,
    Realism,
    RealismTargets,
    SetRealism,
    acceptance,
    confidence_auroc,
    greedy_oracle_gain,
    is_degenerate,
)
from model_build.zoo.summary import realism_table


def test_greedy_oracle_gain_counts_rounds_as_thm_4_1() -> None:
    # One row: accept, accept, reject, accept, accept (5 positions, then the budget ends).
    accepted = torch.tensor([[True, True, False, True, True]])
    mask = torch.ones_like(accepted)
    costs = CostModel(t_draft=1.0, t_target=10.0, t_companion=0.0)
    # Oracle: round 1 drafts 2 (both accepted), emits 3; round 2 may draft 1 (the target emits the
    # last token), emits 2: 5 tokens for 3 draft + 2 target calls = 23 s. K = 2: the same rounds;
    # K = 3 drafts 3 + 1 (24 s); K = 1: rounds emit 2, 1 (rejection), 2 -> 3 + 30 = 33 s.
    gain, best_k = greedy_oracle_gain(accepted, mask, costs)
    assert best_k == 2
    assert gain == pytest.approx(1.0)
    # A mask of two positions: one round drafting one token for oracle and K = 1 alike.
    gain, best_k = greedy_oracle_gain(accepted, torch.tensor([[1, 1, 0, 0, 0]]).bool(), costs)
    assert best_k == 1 and gain == pytest.approx(1.0)


def test_greedy_oracle_beats_fixed_k_when_runs_vary() -> None:
    runs = [0, 8, 0, 8, 0, 8]  # accepted-run lengths alternate: no single K fits both
    row = sum(([True] * r + [False] for r in runs), [])
    accepted = torch.tensor([row])
    gain, _ = greedy_oracle_gain(accepted, torch.ones_like(accepted))
    assert gain > 1.3


def _outcomes(sharp: bool, positions: int, vocab: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Target / draft log-probs: sharp positions (both put 0.99 on token 0), or flat ones (draft
    uniform, target 0.95 on one token the draft rarely proposes)."""
    p, q = torch.full((positions, vocab), 0.01 / (vocab - 1)), torch.full((positions, vocab), 0.01 / (vocab - 1))
    if sharp:
        p[:, 0], q[:, 0] = 0.99, 0.99
    else:
        p = torch.full((positions, vocab), 0.05 / (vocab - 1))
        p[:, 1] = 0.95
        q = torch.full((positions, vocab), 1.0 / vocab)
    return p.log()[None], q.log()[None]


def test_confidence_auroc_is_high_when_confident_drafts_are_the_accepted_ones() -> None:
    sharp_p, sharp_q = _outcomes(True, 400)
    flat_p, flat_q = _outcomes(False, 400)
    log_p, log_q = torch.cat([sharp_p, flat_p], dim=1), torch.cat([sharp_q, flat_q], dim=1)
    mask = torch.ones(log_p.shape[:2], dtype=torch.bool)
    assert confidence_auroc(log_p, log_q, mask, seed=0) > 0.9
    assert acceptance(sharp_p, sharp_q, mask[:, :400]) == pytest.approx(1.0)


def test_confidence_auroc_is_chance_when_the_draft_says_nothing() -> None:
    # Negative control: every position has the same draft (uniform), and the target is a random
    # one-hot-ish distribution, so log q(y) is constant and carries no information.
    generator = torch.Generator().manual_seed(1)
    positions, vocab = 4000, 8
    target_token = torch.randint(0, vocab, (positions,), generator=generator)
    p = torch.full((positions, vocab), 0.2 / (vocab - 1))
    p[torch.arange(positions), target_token] = 0.8
    q = torch.full((positions, vocab), 1.0 / vocab)
    mask = torch.ones(1, positions, dtype=torch.bool)
    auroc = confidence_auroc(p.log()[None], q.log()[None], mask, seed=0)
    # Ties everywhere: AUROC is exactly 0.5 up to the sampling noise bound of ~4 sigma.
    sigma = math.sqrt((1 / 800 + 1 / 3200) / 12)
    assert abs(auroc - 0.5) < 4 * sigma


def test_confidence_auroc_is_undefined_when_every_draft_is_accepted() -> None:
    sharp_p, sharp_q = _outcomes(True, 50)
    identical = confidence_auroc(sharp_q, sharp_q, torch.ones(1, 50, dtype=torch.bool), seed=0)
    assert identical is None  # p = q: every candidate accepted, one class


def test_degenerate_continuations_are_whitespace_or_short_loops() -> None:
    assert is_degenerate([5, 5, 5], "\n\n\n")
    assert is_degenerate([], "")
    assert is_degenerate([1, 2, 3] + [7, 8] * 10, "abc" + "x = " * 10)  # second half: period 2
    assert is_degenerate([9] * 4 + [1, 2, 3, 4] * 4, "....")  # period 4
    assert not is_degenerate([1, 2, 3, 4, 5] * 4, "a b c d e " * 4)  # period 5 is code, not a loop
    assert not is_degenerate(list(range(40)), "return sum(values) / len(values)")
    assert not is_degenerate([1, 1, 1], "x")  # too short to call a loop
    assert not is_degenerate([4] * 10 + list(range(10, 30)), "loops first, then real text")


def _set(name: str = "function (dev)", **changes: object) -> SetRealism:
    fields = dict(name=name, prompts=64, acceptance=0.72, companion_acceptance=0.8, confidence_auroc=0.75,
                  greedy_oracle_gain=1.5, greedy_best_fixed_k=3, degenerate_share=0.02)
    return SetRealism(**{**fields, **changes})


LOSSES = {"target": 2.9, "companion": 3.0, "draft": 3.2}


def test_checks_carry_margins_and_fail_outside_their_targets() -> None:
    realism = Realism((_set(), _set("module (test, OOD)", degenerate_share=0.25)), LOSSES)
    checks = {c.name: c for c in realism.checks()}
    assert checks["function (dev)/acceptance"].margin == pytest.approx(0.07)  # min(0.72 - 0.65, 0.85 - 0.72)
    assert checks["function (dev)/confidence_auroc"].margin == pytest.approx(0.05)
    assert checks["loss_gap"].margin == pytest.approx(0.1)
    assert checks["companion_between"].margin == pytest.approx(0.1)
    assert realism.failures() == ["module (test, OOD)/degenerate_share = 25.0%, target <= 10%"]
    stricter = RealismTargets(loss_gap=0.4)
    assert realism.failures(stricter)[-1] == "loss_gap = 0.300, target >= 0.4"
    outside = Realism((_set(acceptance=0.9),), {"target": 2.9, "companion": 3.3, "draft": 3.2})
    assert outside.failures() == ["function (dev)/acceptance = 0.900, target 0.65-0.85",
                                  "companion_between = 3.300, target 2.900-3.200"]


def test_an_undefined_auroc_prints_as_undefined_and_fails() -> None:
    realism = Realism((_set(confidence_auroc=None),), LOSSES)
    (check,) = [c for c in realism.checks() if c.name.endswith("confidence_auroc")]
    assert check.value == "undefined (one class)" and check.margin is None and not check.ok
    assert realism.failures() == ["function (dev)/confidence_auroc = undefined (one class), target >= 0.7"]
    assert "0.000" not in str([cell for column in realism_table(realism).columns for cell in column._cells])


def test_realism_round_trips_through_its_json_record() -> None:
    realism = Realism((_set(), _set("line start (dev)", confidence_auroc=None)), LOSSES)
    assert Realism.from_dict(realism.to_dict()) == realism
    assert dataclasses.replace(realism.sets[0], acceptance=0.5) != realism.sets[0]
    assert PAPER_COSTS.t_draft / PAPER_COSTS.t_target == pytest.approx(0.21, abs=0.01)
