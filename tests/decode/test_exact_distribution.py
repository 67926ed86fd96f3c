"""Lossless rules reproduce their distribution exactly, under every length policy.

For a fixed prompt we draw independent 3-token continuations (one seed each) and compare the
empirical distribution with the exact sequence distribution of ``p`` (speculative, fuzzy at
threshold 0) or ``r`` (ensembles), enumerated over all V³ continuations with the models
themselves. The TV distance must stay below ``mean + 5 sd`` of the TV of honest multinomial samples
of the same size; negative controls (a rule that accepts everything, and plain speculative decoding
judged against an ensemble's ``r``) must exceed the same bound.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import PreTrainedModel

from decode import Sampling, policies, rules
from tests.helpers.exact_distribution import (
    LENGTH,
    N_DEFAULT,
    N_SLOW,
    POLICIES,
    RULES,
    AcceptAll,
    adversarial_sv_profile,
    check_case,
    decoder_for,
    empirical,
    exact_distribution,
    report,
    target_only,
    tv_bound,
    weighted,
)

ALL_CASES = [f"{r}-{p}" for r, p in itertools.product(RULES, POLICIES)]
DEFAULT_CASES = [f"speculative-{p}" for p in POLICIES if p != "heuristic"] + ["weighted-head_post", "contrastive-sv"]


@pytest.mark.parametrize("case", DEFAULT_CASES)
def test_exact_distribution(tiny, case):
    tv, bound = check_case(tiny, case, N_DEFAULT)
    report(f"{case} n={N_DEFAULT}", tv, bound)
    assert tv <= bound, f"{case}: TV {tv:.4f} exceeds {bound:.4f}"


@pytest.mark.slow
@pytest.mark.parametrize("case", ALL_CASES)
def test_exact_distribution_slow(tiny, case):
    tv, bound = check_case(tiny, case, N_SLOW)
    report(f"{case} n={N_SLOW}", tv, bound)
    assert tv <= bound, f"{case}: TV {tv:.4f} exceeds {bound:.4f}"


def test_fuzzy_zero_threshold_samples_target(tiny):
    decoder = decoder_for(tiny, rules.Fuzzy("js", threshold=0.0), policies.Fixed(4), Sampling())
    exact = exact_distribution(tiny, target_only, Sampling())
    tv = float(0.5 * (empirical(decoder, N_DEFAULT) - exact).abs().sum())
    bound = tv_bound(exact, N_DEFAULT)
    report(f"fuzzy(T=0)-fixed4 n={N_DEFAULT}", tv, bound)
    assert tv <= bound


def test_sampling_transform_is_respected(tiny):
    sampling = Sampling(temperature=0.7, top_k=3)
    decoder = decoder_for(tiny, rules.Speculative(), policies.Fixed(4), sampling)
    exact = exact_distribution(tiny, target_only, sampling)
    tv = float(0.5 * (empirical(decoder, N_DEFAULT) - exact).abs().sum())
    bound = tv_bound(exact, N_DEFAULT)
    report(f"speculative(T=0.7,top_k=3)-fixed4 n={N_DEFAULT}", tv, bound)
    assert tv <= bound


NEGATIVE_CONTROLS = {
    "accept_all-vs-p": (AcceptAll, target_only, policies.Fixed(4)),
    "speculative-vs-weighted_r": (rules.Speculative, weighted(0.5), policies.Fixed(4)),
    # the realised oracle peeks at its own verification draws: a bound, not a lossless decoder (DESIGN §5)
    "realised_oracle-vs-p": (rules.Speculative, target_only, policies.Oracle()),
}


@pytest.mark.parametrize("n", [N_DEFAULT, pytest.param(N_SLOW, marks=pytest.mark.slow)])
@pytest.mark.parametrize("control", NEGATIVE_CONTROLS)
def test_negative_controls_exceed_bound(tiny, control, n):
    make_rule, mix, policy = NEGATIVE_CONTROLS[control]
    decoder = decoder_for(tiny, make_rule(), policy, Sampling())
    exact = exact_distribution(tiny, mix, Sampling())
    tv = float(0.5 * (empirical(decoder, n) - exact).abs().sum())
    bound = tv_bound(exact, n)
    report(f"NEGATIVE {control} n={n}", tv, bound)
    assert tv > bound, f"negative control {control} is indistinguishable: TV {tv:.4f} <= {bound:.4f}"


@pytest.mark.parametrize("rule_name", ["speculative", "weighted"])
def test_sv_is_lossless_with_a_y_dependent_profile(make_lm, rule_name):
    """SV's verification length must be a stopping time (DESIGN §1 pitfalls).

    With 3 new tokens the first round drafts 2 candidates, so position 2 carries SV's whole
    effect: we compare the (t_1, t_2) marginal (16 cells, a tighter bound than all 64). These
    models and this profile were chosen so that letting ``Y_2`` decide whether ``y_2`` is verified
    moves that marginal by TV ≈ 0.13 (speculative) / 0.17 (weighted), well above the bound.
    """
    models = {
        "target": make_lm(4, seed=53, init=0.3),
        "draft": make_lm(4, seed=51, init=0.3),
        "companion": make_lm(4, seed=52, init=0.3),
    }
    make_rule, mix = RULES[rule_name]
    sampling = Sampling()
    decoder = decoder_for(models, make_rule(), policies.SV(adversarial_sv_profile(), k=4), sampling)
    cells = decoder.vocab ** (LENGTH - 1)
    exact = exact_distribution(models, mix, sampling).view(cells, -1).sum(-1)
    tv = float(0.5 * (empirical(decoder, N_DEFAULT).view(cells, -1).sum(-1) - exact).abs().sum())
    bound = tv_bound(exact, N_DEFAULT)
    report(f"{rule_name}-sv(adversarial) (t1, t2) n={N_DEFAULT}", tv, bound)
    assert tv <= bound, f"{rule_name}: TV {tv:.4f} exceeds {bound:.4f}"


def subset_draft(draft: PreTrainedModel, token_ids: list[int]) -> PreTrainedModel:
    """``draft`` with a reduced-vocabulary head scoring only ``token_ids`` (its own rows for them)."""
    from decode.subset_vocab import SubsetVocabLlamaConfig, SubsetVocabLlamaForCausalLM

    fields = {k: v for k, v in draft.config.to_dict().items() if k not in ("architectures", "model_type")}
    config = SubsetVocabLlamaConfig(**{**fields, "tie_word_embeddings": False, "draft_vocab_size": len(token_ids)})
    reduced = SubsetVocabLlamaForCausalLM(config)
    state = {k: v for k, v in draft.state_dict().items() if k != "lm_head.weight"}
    state["lm_head.weight"] = draft.get_output_embeddings().weight[token_ids]
    state["lm_head.token_ids"] = torch.tensor(token_ids)
    reduced.load_state_dict(state)
    return reduced.eval()


@pytest.mark.parametrize("policy", ["fixed4", "head_post"])
def test_a_reduced_vocabulary_draft_stays_lossless(tiny, policy):
    """The draft proposes only tokens 1 and 3 (q = 0 on 0 and 2); the output is still distributed as p.
    Negative control: accepting every proposal gives a distribution without tokens 0 and 2."""
    models = {**tiny, "draft": subset_draft(tiny["draft"], [1, 3])}
    exact = exact_distribution(tiny, target_only, Sampling())
    bound = tv_bound(exact, N_DEFAULT)
    decoder = decoder_for(models, rules.Speculative(), POLICIES[policy](models), Sampling())
    tv = float(0.5 * (empirical(decoder, N_DEFAULT) - exact).abs().sum())
    report(f"speculative-{policy} with a 2-of-4-token draft n={N_DEFAULT}", tv, bound)
    assert tv <= bound
    control = decoder_for(models, AcceptAll(), policies.Fixed(4), Sampling())
    assert float(0.5 * (empirical(control, N_DEFAULT) - exact).abs().sum()) > bound
