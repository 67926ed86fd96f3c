"""The goodput objective (docs/design.md §2, "A loss for the stop"): its rounds, its value and its gradient."""

from __future__ import annotations

import pytest
import torch

from accept_heads.training.goodput_loss import GoodputObjective, RoundCosts, round_starts, round_values, soft_goodput
from decode.costs import LatencyShape

COSTS = RoundCosts(draft=0.1, verify=LatencyShape((1.0, 1.1, 1.3)))


def test_a_round_never_crosses_a_rows_end_or_a_gap():
    rows = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    positions = torch.tensor([3, 4, 5, 7, 0, 1, 2])
    assert round_starts(rows, positions, 2).tolist() == [[0, 1], [1, 2], [4, 5], [5, 6]]
    assert round_starts(rows, positions, 3).tolist() == [[0, 1, 2], [4, 5, 6]]
    assert round_starts(rows, positions, 8).numel() == 0


def test_a_rounds_candidates_are_read_at_their_depths_capped_at_the_labelled_ones():
    values = torch.arange(12.0).reshape(4, 3)  # [M = 4 positions, D = 3 depths]
    index = torch.tensor([[0, 1, 2, 3]])
    assert round_values(values, index).tolist() == [[0.0, 4.0, 8.0, 11.0]]
    assert round_values(values[:, 0], index).tolist() == [[0.0, 3.0, 6.0, 9.0]]


def test_the_priced_cost_of_a_round_drafts_k_and_verifies_k():
    assert COSTS.of_lengths(4).tolist() == pytest.approx([1.1, 1.3, 1.6, 1.85])  # the mean slope beyond the table


def test_a_cold_stop_on_the_true_acceptance_picks_each_rounds_best_length():
    acceptance = torch.tensor([[0.9, 0.9, 0.9], [0.1, 0.5, 0.5]], dtype=torch.float64)
    costs = COSTS.of_lengths(3)
    tokens = 1 + acceptance.cumprod(-1).cumsum(-1)
    best = (tokens / costs).argmax(-1)
    expected = tokens.gather(1, best[:, None]).sum() / costs[best].sum()
    assert float(soft_goodput(acceptance, acceptance, costs, temperature=1e-4)) == pytest.approx(float(expected))
    # negative control: estimates that reverse the rounds' order reach less
    assert soft_goodput(acceptance.flip(0), acceptance, costs, 1e-4) < soft_goodput(acceptance, acceptance, costs, 1e-4)


def test_the_gradient_through_the_estimates_matches_finite_differences():
    generator = torch.Generator().manual_seed(0)
    rows = torch.tensor([0] * 5 + [1] * 4)
    positions = torch.tensor([0, 1, 2, 3, 4, 2, 3, 4, 5])
    labels = torch.rand(9, 2, generator=generator, dtype=torch.float64)
    labels[0, 1] = float("nan")  # a position no round reaches at depth 2
    logits = torch.randn(9, 2, generator=generator, dtype=torch.float64, requires_grad=True)
    objective = GoodputObjective(COSTS, k=3, temperature=0.3)

    def loss(x: torch.Tensor) -> torch.Tensor:
        return objective(torch.sigmoid(x), labels, rows, positions)

    assert torch.autograd.gradcheck(loss, (logits,), eps=1e-6, atol=1e-7)
    loss(logits).backward()
    assert logits.grad.abs().sum() > 0
    assert logits.grad[0, 1] == 0  # never read: depth 2 of the first position starts no round of this row


def test_a_batch_without_a_whole_round_gives_no_loss():
    rows, positions = torch.tensor([0, 0, 1]), torch.tensor([0, 2, 0])
    assert GoodputObjective(COSTS, k=2, temperature=0.1)(torch.full((3,), 0.5), torch.ones(3), rows, positions) is None
