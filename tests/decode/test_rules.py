"""Rule definitions, training labels, divergences, SV indicators and the sampling transform."""

from __future__ import annotations

import math

import pytest
import torch

from decode import Sampling, rules
from decode.divergence import js, kl, tv
from decode.profile import SVProfile, goodput_length, sv_indicators


def random_logits(rows: int = 6, vocab: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_divergences_known_values():
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    q = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    assert js(p, q).tolist() == pytest.approx([math.log(2), 0.0])
    assert tv(p, q).tolist() == pytest.approx([1.0, 0.0])
    assert kl(p, q)[0] == math.inf and kl(p, q)[1] == 0
    a, b = random_logits(seed=1).softmax(-1), random_logits(seed=2).softmax(-1)
    assert torch.all(js(a, b) <= math.log(2)) and torch.allclose(js(a, b), js(b, a))
    assert torch.all(kl(a, b) >= 0)


def test_labels_match_definitions():
    p_logits, q_logits = random_logits(seed=3), random_logits(seed=4)
    p, q = p_logits.softmax(-1), q_logits.softmax(-1)
    y = torch.multinomial(q, 1, generator=torch.Generator().manual_seed(0)).squeeze(-1)
    rows = torch.arange(len(y))
    speculative = rules.Speculative().label(p_logits, q_logits, y)
    assert torch.allclose(speculative, (p[rows, y] / q[rows, y]).clamp(max=1))
    assert torch.equal(rules.Greedy().label(p_logits, q_logits, y), (p.argmax(-1) == q.argmax(-1)).float())
    assert torch.equal(rules.Fuzzy("tv", 0.5).label(p_logits, q_logits, y), (tv(p, q) < 0.5).float())
    r = 0.3 * q + 0.7 * p
    weighted = rules.Ensemble("weighted", weight=0.3).label(p_logits, q_logits, y)
    assert torch.allclose(weighted, (r[rows, y] / q[rows, y]).clamp(max=1))
    r = (p_logits - 0.5 * q_logits).softmax(-1)
    contrastive = rules.Ensemble("contrastive", mu=0.5).label(p_logits, q_logits, y)
    assert torch.allclose(contrastive, (r[rows, y] / q[rows, y]).clamp(max=1))


def test_expected_speculative_acceptance_is_one_minus_tv():
    p_logits, q_logits = random_logits(1, 5, seed=5), random_logits(1, 5, seed=6)
    p, q = p_logits.softmax(-1), q_logits.softmax(-1)
    ys = torch.arange(5)
    labels = rules.Speculative().label(p_logits.expand(5, -1), q_logits.expand(5, -1), ys)
    assert float((q[0] * labels).sum()) == pytest.approx(float(1 - tv(p, q)[0]), abs=1e-6)


def test_labels_use_the_sampling_transform():
    p_logits, q_logits = random_logits(seed=7), random_logits(seed=8)
    y = q_logits.argmax(-1)
    sampling = Sampling(temperature=0.5, top_k=3)
    p, q = sampling.probs(p_logits), sampling.probs(q_logits)
    rows = torch.arange(len(y))
    expected = (p[rows, y] / q[rows, y]).clamp(max=1)
    assert torch.allclose(rules.Speculative().label(p_logits, q_logits, y, sampling), expected)


def test_ensemble_greedy_takes_argmax_of_r():
    p_logits = torch.tensor([[3.0, 2.9, -5.0]])
    q_logits = torch.tensor([[-5.0, 2.9, 3.0]])
    r = rules.Ensemble("weighted", weight=0.5).verifier_probs(p_logits, q_logits, Sampling(temperature=0))
    assert r.argmax(-1).item() == 1 and r.max() == 1.0  # neither member's argmax


def test_from_spec_round_trip_and_errors():
    for rule in [rules.Speculative(), rules.Greedy(), rules.Fuzzy("kl", 0.2), rules.Ensemble("contrastive", mu=0.3)]:
        spec = rule.spec()
        assert rules.from_spec(spec["name"], **spec["params"]) == rule
    with pytest.raises(ValueError, match="valid rules: speculative, greedy, fuzzy, ensemble"):
        rules.from_spec("typical")
    with pytest.raises(ValueError, match="divergence"):
        rules.Fuzzy("hellinger", 0.1)
    with pytest.raises(ValueError, match="kind"):
        rules.Ensemble("product")


def test_sampling_transform():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    assert torch.equal(Sampling(temperature=0).probs(logits), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert (Sampling(top_k=2).probs(logits)[0, 2:] == 0).all()
    top_p = Sampling(top_p=0.8).probs(logits)[0]
    full = logits.softmax(-1)[0]
    kept = int((top_p > 0).sum())
    assert full[: kept - 1].sum() < 0.8 <= full[:kept].sum()
    assert torch.allclose(Sampling(temperature=2).probs(logits), (logits / 2).softmax(-1))


def test_sv_indicators_and_profile():
    q = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    c = torch.tensor([[0.25, 0.75, 0.0], [0.0, 1.0, 0.0]])
    x, y = sv_indicators(q, c, torch.tensor([0, 0]))
    assert x.tolist() == pytest.approx([0.75, 0.0]) and y.tolist() == pytest.approx([0.5, 0.0])
    profile = SVProfile(
        x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 0.5, 1.0]),
        table=torch.tensor([[0.1, 0.2], [0.3, 0.9]]), counts=torch.ones(2, 2), latency=torch.tensor([1.0, 1.1]),
    )
    assert profile.alpha(torch.tensor([0.2, 0.7, 1.0]), torch.tensor([0.9, 0.1, 1.0])).tolist() == pytest.approx(
        [0.2, 0.3, 0.9]
    )
    assert goodput_length(torch.tensor([0.9, 0.9, 0.9]), torch.tensor([1.0, 1.0, 1.0])) == 3
    assert goodput_length(torch.tensor([0.9, 0.05, 0.9]), torch.tensor([1.0, 1.5, 2.0])) == 1
