"""Exact verification of draft trees (DESIGN §11): each rule's ``verify_tree`` on a two-level tree over a small
vocabulary reproduces the target's (the ensemble's) joint distribution of the next two tokens, sampled with a fixed
seed and judged cell by cell against bounds from the sample size; deterministic top-k siblings under the plain ratio
test are the negative control, and fail."""

from __future__ import annotations

import math

import pytest
import torch

from decode.rules import Ensemble, Fuzzy, Greedy, Speculative
from decode.sampling import Sampling
from decode.tree import ROOT, DraftTree, draw_siblings

V = 4
SAMPLES = 5_000
SIBLINGS = (3, 2)  # the root's children, and each depth-1 node's


def tables(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target and draft distributions: ``p1, q1 [V]`` at the root, ``p2, q2 [V, V]`` after each first token."""
    g = torch.Generator().manual_seed(seed)
    p1 = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q1 = torch.tensor([0.5, 0.3, 0.15, 0.05])  # far from p1: the ratio tests reject often
    p2 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    q2 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    return p1, q1, p2, q2


def two_level_round(rule, draw: str, generator: torch.Generator) -> tuple[int, int]:
    """One round on a tree of the root's siblings, each with its own siblings; the first two tokens emitted (the
    second drawn from the target after the first where the round emits one token: the next round's, exact)."""
    p1, q1, p2, q2 = tables()
    first = draw_siblings(q1, SIBLINGS[0], draw, generator)
    tokens, parents, p_rows, q_rows = list(first), [ROOT] * SIBLINGS[0], [p1], [q1]
    for node, token in enumerate(first.tolist()):
        p_rows.append(p2[token])
        q_rows.append(q2[token])
        for second in draw_siblings(q2[token], SIBLINGS[1], draw, generator).tolist():
            tokens.append(torch.tensor(second))
            parents.append(node)
    for _ in range(len(tokens) - len(p_rows) + 1):  # the leaves: the draft never scored after them
        p_rows.append(torch.full((V,), 1.0 / V))
        q_rows.append(torch.full((V,), 1.0 / V))
    tree = DraftTree(torch.stack(tokens), tuple(parents), draw)
    scored = torch.tensor([True] * (1 + SIBLINGS[0]) + [False] * (tree.size - SIBLINGS[0]))
    path, token = rule.verify_tree(tree, torch.stack(p_rows).log(), torch.stack(q_rows).log(), scored, Sampling(),
                                   generator)
    emitted = [*tree.path_tokens(path).tolist(), int(token)]
    if len(emitted) == 1:
        verifier = p2 if not isinstance(rule, Ensemble) else ensemble_tables(rule)[1]
        emitted.append(int(torch.multinomial(verifier[emitted[0]], 1, generator=generator)))
    return emitted[0], emitted[1]


def ensemble_tables(rule: Ensemble) -> tuple[torch.Tensor, torch.Tensor]:
    """The ensemble's ``r`` at the root ``[V]`` and after each first token ``[V, V]``."""
    p1, q1, p2, q2 = tables()
    r1 = rule.verifier_probs(p1.log(), q1.log(), Sampling())
    return r1, rule.verifier_probs(p2.log(), q2.log(), Sampling())


def joint(rule, draw: str, samples: int = SAMPLES, seed: int = 7) -> torch.Tensor:
    """The sampled joint ``[V, V]`` of the first two tokens over ``samples`` rounds."""
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V)
    for _ in range(samples):
        counts[two_level_round(rule, draw, generator)] += 1
    return counts / samples


def far_cells(sampled: torch.Tensor, exact: torch.Tensor, samples: int) -> list[tuple[int, int]]:
    """Cells whose sampled share is over 5 standard errors from the exact probability (a binomial's, per cell)."""
    bound = 5 * torch.sqrt(exact * (1 - exact) / samples) + 1e-9
    return [tuple(cell) for cell in ((sampled - exact).abs() > bound).nonzero().tolist()]


def exact_joint(rule) -> torch.Tensor:
    p1, _, p2, _ = tables()
    if isinstance(rule, Ensemble):
        p1, p2 = ensemble_tables(rule)
    return p1[:, None] * p2


@pytest.mark.parametrize("rule", [Speculative(), Ensemble("weighted", weight=0.5)], ids=["speculative", "ensemble"])
@pytest.mark.parametrize("draw", ["independent", "without-replacement"])
def test_a_tree_round_emits_the_verifier_distribution(rule, draw):
    assert far_cells(joint(rule, draw), exact_joint(rule), SAMPLES) == []


def test_negative_control_top_k_siblings_under_the_plain_ratio_test_are_not_exact():
    """Deterministic top-k siblings verified as if drawn: the biased joint is caught by the same check."""
    class PlainRatio(Speculative):
        tree_draws = ("top-k",)

    samples = 3_000
    far = far_cells(joint(PlainRatio(), "top-k", samples), exact_joint(Speculative()), samples)
    assert len(far) >= 8  # of the 16 cells


def test_the_ratio_rules_refuse_top_k_siblings_and_the_fuzzy_rule_refuses_any_tree():
    tree = DraftTree(torch.tensor([0, 1]), (ROOT, ROOT), "top-k")
    args = (torch.zeros(3, V), torch.zeros(3, V), torch.ones(3, dtype=torch.bool), Sampling(), None)
    with pytest.raises(ValueError, match="not 'top-k'"):
        Speculative().verify_tree(tree, *args)
    with pytest.raises(ValueError, match="chain policy"):
        Fuzzy().verify_tree(DraftTree(torch.tensor([0, 1]), (ROOT, ROOT)), *args)


def test_greedy_walks_the_targets_argmax_through_repeated_siblings_to_its_bonus():
    """Siblings 2, 2, 0 under the root; the target's argmax path is 2 → 1 → (bonus) 3; the greedy output."""
    tree = DraftTree(torch.tensor([2, 2, 0, 3, 1, 1]), (ROOT, ROOT, ROOT, 0, 0, 1), "top-k")
    p = torch.full((tree.size + 1, V), -5.0)
    for row, best in {0: 2, 1: 1, 2: 0, 5: 3, 6: 2}.items():
        p[row, best] = 5.0
    path, token = Greedy().verify_tree(tree, p, torch.zeros_like(p), torch.ones(tree.size + 1, dtype=torch.bool),
                                       Sampling(), None)
    assert path == [0, 4] and int(token) == 3  # the first sibling of the repeated 2, then its child 1
    p[0] = torch.tensor([-5.0, -5.0, -5.0, 5.0])  # the target's argmax 3 is no child of the root
    path, token = Greedy().verify_tree(tree, p, torch.zeros_like(p), torch.ones(tree.size + 1, dtype=torch.bool),
                                       Sampling(), None)
    assert path == [] and int(token) == 3  # the target's token alone


def test_a_chain_is_the_tree_of_width_one():
    chain = DraftTree.chain(torch.tensor([5, 6, 7]))
    assert chain.parents == (ROOT, 0, 1) and [chain.depth(n) for n in range(3)] == [1, 2, 3]
    assert chain.children(ROOT) == [0] and chain.children(2) == []
    with pytest.raises(ValueError, match="earlier node"):
        DraftTree(torch.tensor([1, 2]), (1, ROOT))
    assert math.isclose(float(draw_siblings(torch.tensor([0.0, 1.0, 0.0]), 1, "independent", None)), 1.0)


def test_sibling_labels_are_the_acceptance_under_the_residual_of_the_earlier_rejections():
    """Hand case: p = (0.2, 0.5, 0.3), q = (0.6, 0.3, 0.1), siblings 0 then 1. The first: min(1, 0.2/0.6) = 1/3; its
    rejection leaves r = (0, 0.5, 0.5); drawn without replacement the second came from (0, 0.75, 0.25): 2/3;
    drawn independently, from q: min(1, 0.5/0.3) = 1."""
    p, q = torch.tensor([[0.2, 0.5, 0.3]]).log(), torch.tensor([[0.6, 0.3, 0.1]]).log()
    siblings = torch.tensor([[0, 1]])
    without = Speculative().sibling_labels(p, q, siblings, "without-replacement")
    independent = Speculative().sibling_labels(p, q, siblings, "independent")
    torch.testing.assert_close(without, torch.tensor([[1 / 3, 2 / 3]]))
    torch.testing.assert_close(independent, torch.tensor([[1 / 3, 1.0]]))
    assert Speculative().label(p[0:1], q[0:1], siblings[:, 0]).item() == pytest.approx(1 / 3)  # the chain's label
    assert Greedy().sibling_labels(p, q, torch.tensor([[0, 1, 2]]), "top-k").tolist() == [[0.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="not 'top-k'"):
        Speculative().sibling_labels(p, q, siblings, "top-k")


def test_a_node_attends_to_its_own_path_at_its_depths_position():
    tree = DraftTree(torch.tensor([4, 5, 6, 7]), (ROOT, ROOT, 0, 2))  # 0 → 2 → 3 and 1 beside 0
    assert tree.attention().int().tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]
    assert tree.positions(10).tolist() == [10, 10, 11, 12]
    chain = DraftTree.chain(torch.tensor([1, 2, 3]))
    assert torch.equal(chain.attention(), torch.ones(3, 3, dtype=torch.bool).tril())  # a chain: causal
    assert chain.positions(0).tolist() == [0, 1, 2]
