"""Rule definitions, training labels, divergences, SV indicators and the sampling transform."""

from __future__ import annotations

import math

import pytest
import torch

from decode import EnsembleFn, Sampling, rules
from decode.divergence import js, kl, tv
from decode.ensemble_fn import DEFAULT_MU, DEFAULT_WEIGHT
from decode.profile import SVProfile, goodput_length, sv_indicators
from decode.subset_vocab import SubsetVocabLlamaConfig, SubsetVocabLlamaForCausalLM


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


@pytest.mark.parametrize("rule", [rules.Speculative(), rules.Greedy(), rules.Fuzzy("js", 0.3),
                                  rules.Ensemble("weighted", weight=0.3), rules.Ensemble("contrastive", mu=0.5)],
                         ids=repr)
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.7, top_k=4)], ids=["T=1", "T=0.7,k=4"])
def test_expected_acceptance_is_the_label_averaged_over_the_drafts_proposal(rule, sampling):
    """``expected_accept`` (the pre-draft label) = ``Σ_y q̃(y)·label(y)`` over the rule's own proposal ``q̃``, row by row;
    for speculative at T = 1 it is ``1 − TV(p, q)``."""
    vocab = 7
    p_logits, q_logits = random_logits(4, vocab, seed=9), random_logits(4, vocab, seed=10)
    proposal = rule.transform(sampling).probs(q_logits)
    ys = torch.arange(vocab).repeat(4)
    labels = rule.label(p_logits.repeat_interleave(vocab, 0), q_logits.repeat_interleave(vocab, 0), ys, sampling)
    averaged = (proposal * labels.view(4, vocab)).sum(-1)
    expected = rule.expected_accept(p_logits, q_logits, sampling)
    assert torch.allclose(expected, averaged, atol=1e-6)
    if isinstance(rule, rules.Speculative) and sampling == Sampling():
        assert torch.allclose(expected, 1 - tv(p_logits.softmax(-1), q_logits.softmax(-1)), atol=1e-6)
    if not isinstance(rule, (rules.Greedy, rules.Fuzzy)):  # control (0/1 labels may coincide): another row's target
        assert not torch.allclose(rule.expected_accept(p_logits.roll(1, 0), q_logits, sampling), expected, atol=1e-3)


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


def test_one_ensemble_definition():
    """rules.Ensemble, EnsembleFn and the training config share μ, λ and the two-model ``r``."""
    from ahconf.schema import RulesConfig  # the training stack takes its defaults from decode

    config = RulesConfig().params["ensemble"]
    assert rules.Ensemble("contrastive").mu == EnsembleFn("contrastive").mu == config["mu"] == DEFAULT_MU
    assert rules.Ensemble("weighted").weight == config["weight"] == DEFAULT_WEIGHT
    p_logits, q_logits = random_logits(seed=11), random_logits(seed=12)
    pairs = [
        (rules.Ensemble("weighted", weight=0.3), EnsembleFn("weighted", weights=(0.3, 0.7))),
        (rules.Ensemble("contrastive", mu=0.4), EnsembleFn("contrastive", mu=0.4)),
        (rules.Ensemble("contrastive"), EnsembleFn("contrastive")),
    ]
    for sampling in [Sampling(), Sampling(temperature=0.7, top_k=5), Sampling(temperature=0)]:
        for rule, fn in pairs:
            expected = fn.probs(torch.stack([q_logits, p_logits]), sampling)
            assert torch.allclose(rule.verifier_probs(p_logits, q_logits, sampling), expected), (rule, sampling)


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
    high, low, flat = torch.tensor([0.9, 0.9, 0.9]), torch.tensor([0.05, 0.05, 0.05]), torch.ones(3)
    assert goodput_length(high, high, flat) == 3
    mixed = torch.tensor([0.9, 0.05, 0.9])
    assert goodput_length(mixed, mixed, torch.tensor([1.0, 1.5, 2.0])) == 1
    # Extending to L + 1 reads alpha_next[L] (not alpha[L]); candidates <= L use their full alpha.
    latency = torch.tensor([1.0, 1.1, 1.2])
    assert goodput_length(low, high, latency) == 1 and goodput_length(high, low, latency) == 1
    assert goodput_length(mixed, high, latency) == 2


def test_sv_alpha_given_x_is_the_count_weighted_row_mean():
    profile = SVProfile(
        x_edges=torch.tensor([0.0, 0.3, 0.6, 1.0]), y_edges=torch.tensor([0.0, 0.5, 1.0]),
        table=torch.tensor([[0.1, 0.7], [0.4, 0.8], [0.5, 0.5]]),
        counts=torch.tensor([[3.0, 1.0], [0.0, 0.0], [2.0, 0.0]]),
        latency=torch.tensor([1.0]),
    )
    overall = (0.1 * 3 + 0.7 * 1 + 0.5 * 2) / 6
    assert profile.alpha_given_x(torch.tensor([0.1, 0.4, 0.9])).tolist() == pytest.approx([0.25, overall, 0.5])
    # The full alpha of y_2 is high but its X-row marginal is not: y_2 stays unverified.
    x, y = torch.tensor([0.1, 0.1]), torch.tensor([0.9, 0.9])
    assert profile.alpha(x, y).tolist() == pytest.approx([0.7, 0.7])
    latency = torch.tensor([1.0, 1.2])
    assert SVProfile(**{**profile.tensors(), "latency": latency}).verification_length(x, y) == 1


def test_the_contrastive_label_is_not_zero_for_a_draft_with_a_reduced_vocabulary():
    """A reduced-vocabulary draft scores the tokens outside its subset at the lowest finite logit; subtracting μ times
    that would put all of ``r`` on tokens the draft never proposes (every label 0, as the real pair's collection
    showed). Masked tokens count at the draft's lowest scored logit instead."""
    config = SubsetVocabLlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, draft_vocab_size=4)
    torch.manual_seed(0)
    draft = SubsetVocabLlamaForCausalLM(config).eval()
    draft.lm_head.token_ids.copy_(torch.tensor([3, 5, 8, 13]))
    ids = torch.randint(0, 32, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        q_logits = draft(ids).logits[0]  # [12, 32]
    p_logits = random_logits(12, 32, seed=2) * 3
    y = q_logits.argmax(-1)
    rule = rules.Ensemble("contrastive", mu=DEFAULT_MU)
    labels = rule.label(p_logits, q_logits, y)
    assert (labels > 0).all() and (labels < 1).any()
    floor = torch.where(q_logits <= -1e30, q_logits[:, [3, 5, 8, 13]].amin(-1, keepdim=True), q_logits)
    expected = rule.accept_probs(Sampling().probs(p_logits - DEFAULT_MU * floor), Sampling().probs(q_logits), y)
    torch.testing.assert_close(labels, expected)
    # negative control: the raw combination subtracts μ times the fill logit, and every label is 0
    raw = Sampling().probs(p_logits - DEFAULT_MU * q_logits.float())
    assert rule.accept_probs(raw, Sampling().probs(q_logits), y).max() == 0
    # a draft that scores every token is combined as it was
    full = random_logits(12, 32, seed=3)
    torch.testing.assert_close(rule.verifier_probs(p_logits, full, Sampling()),
                               Sampling().probs(p_logits - DEFAULT_MU * full))
