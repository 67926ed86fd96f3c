"""The lever harness: its recalibration fit recovers a known calibration (and finds none in noise), and it
measures every lever of every head on dev against the head as exported."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from accept_heads.levers.driver import run_levers
from accept_heads.levers.fitting import fit, retrain
from accept_heads.levers.lever_policies import (
    FEATURES,
    LEVERS,
    LeverPolicy,
    PerfectPreDraft,
    Recalibration,
    VisitedCandidate,
)
from ahconf.schema import LEVER_NAMES
from decode import AcceptanceHead, HeadConfig, Sampling, SpeculativeDecoder, policies, rules
from decode.costs import CostModel
from decode.head import PRE_FEATURES
from decode.metadata import HeadMetadata
from decode.policies.stop_policy import Head
from decode.policies.stops import Goodput, Threshold
from tests.helpers.evaluation import evaluation_config
from tests.helpers.exact_distribution import (
    N_DEFAULT,
    PROMPT,
    empirical,
    exact_distribution,
    target_only,
    tv_bound,
    weighted,
)
from tests.helpers.micro_models import micro_lm


def rounds(n: int, seed: int, accept) -> list[VisitedCandidate]:
    """``n`` synthetic candidates: round features drawn at random, true acceptance ``accept(x)``."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        x = np.array([1.0, rng.normal(0, 2), rng.integers(1, 8), -rng.exponential(1.0), rng.integers(0, 8),
                      rng.uniform(0, 4), rng.normal(0, 1)])
        rows.append(VisitedCandidate(x, accept(x), torch.zeros(1), None))
    return rows


def sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def test_platt_recovers_a_temperature_and_a_bias():
    log = rounds(3000, 0, lambda x: sigmoid(0.5 * x[1] - 0.3))
    weights = dict(zip(FEATURES, fit("platt", log).weights))
    assert weights["logit"] == pytest.approx(0.5, abs=0.03) and weights["bias"] == pytest.approx(-0.3, abs=0.03)
    assert all(weights[name] == 0.0 for name in FEATURES if name not in LEVERS["platt"])


def test_decode_time_features_are_found_when_they_matter_and_not_in_noise():
    log = rounds(3000, 1, lambda x: sigmoid(x[1] - 0.4 * x[2] + 1.0))
    weights = dict(zip(FEATURES, fit("decode-time", log).weights))
    assert weights["position"] == pytest.approx(-0.4, abs=0.05) and weights["logit"] == pytest.approx(1.0, abs=0.05)
    rng = np.random.default_rng(2)
    noise = [replace(v, accept=float(rng.uniform(0.3, 0.7))) for v in rounds(3000, 3, lambda x: 0.5)]  # control
    weights = dict(zip(FEATURES, fit("decode-time", noise).weights))
    assert all(abs(w) < 0.05 for name, w in weights.items() if name != "bias")


def test_retraining_on_visited_candidates_learns_what_they_show_and_keeps_the_head_otherwise():
    head = AcceptanceHead(HeadConfig(hidden_size=8, depth=1, timing="post"))
    head.metadata = HeadMetadata(draft="draft", tokenizer_hash="x", rule=rules.Speculative().spec(),
                                 sampling=Sampling(), head_config=head.config)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2000, 8, generator=generator)
    direction = torch.randn(8, generator=generator)
    visits = [VisitedCandidate(np.zeros(len(FEATURES)), float(torch.sigmoid(2 * h @ direction)), h, None)
              for h in hidden]
    model, losses = retrain(head, visits, seed=0)
    assert losses["held_out_bce_after"] < losses["held_out_bce_before"] - 0.05 and losses["held_out"] == 400
    assert model is not head and model.metadata == head.metadata and not model.training
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), head.state_dict().values()))


def test_every_lever_of_every_head_is_measured_on_dev(make_config, micro_trio, tmp_path):
    config = evaluation_config(make_config, micro_trio, tmp_path, f"evaluate.out_dir={tmp_path / 'eval'}")
    table = run_levers(config.evaluate_job())
    assert set(table["head"]) == {"pre", "post"} and set(table["lever"]) == {"as exported", *LEVER_NAMES}
    assert set(table["stop"]) == {"threshold", "goodput"} and len(table) == 2 * (1 + len(LEVER_NAMES)) * 2
    exported = table[table["lever"] == "as exported"]
    assert np.allclose(exported[["effect", "effect_lo", "effect_hi"]].to_numpy(), 1.0) and not exported["kept"].any()
    assert set(table.loc[table["stop"] == "threshold", "h"]) <= {0.5, 0.9}
    assert (tmp_path / "eval" / "levers" / "levers.csv").stat().st_size > 0


def test_the_pre_draft_forecast_learns_the_next_candidates_acceptance_not_the_current_one():
    log = [replace(v, next_accept=sigmoid(-0.5 * v.x[2] + 1.0)) for v in rounds(3000, 4, lambda x: sigmoid(x[1]))]
    log += [replace(v, next_accept=None) for v in rounds(500, 5, lambda x: 0.99)]  # no next candidate: left out
    weights = dict(zip(FEATURES, fit("pre-draft-linear", log).weights))
    assert weights["position"] == pytest.approx(-0.5, abs=0.05) and abs(weights["logit"]) < 0.05


@pytest.fixture(scope="module")
def micro_decoding(micro_trio):
    from transformers import AutoModelForCausalLM

    target, draft = (AutoModelForCausalLM.from_pretrained(micro_trio[role]).eval() for role in ("target", "draft"))
    torch.manual_seed(0)
    head = AcceptanceHead(HeadConfig(hidden_size=32, depth=1, timing="pre", features=PRE_FEATURES))

    def decode(policy, seed: int = 3, rule: rules.Rule | None = None):
        decoder = SpeculativeDecoder(target, draft, rule=rule or rules.Speculative(), policy=policy)
        return decoder.generate([1, 5, 9, 12], max_new_tokens=40, seed=seed)

    return head, decode


def constant(value: float) -> Recalibration:
    """A forecast of ``value`` whatever the round."""
    return Recalibration("pre-draft-linear", (math.log(value / (1 - value)),) + (0.0,) * (len(FEATURES) - 1))


def test_a_certain_forecast_keeps_the_threshold_stop_and_a_hopeless_one_drafts_k_min(micro_decoding):
    head, decode = micro_decoding
    plain = decode(Head(head, threshold=0.6, k_max=6))
    certain = LeverPolicy(head, Threshold(0.6, k_max=6), forecaster=constant(1 - 1e-12))  # the head's own rule
    same = decode(certain)
    assert torch.equal(same.sequences, plain.sequences) and same.stats.drafted == plain.stats.drafted
    hopeless = LeverPolicy(head, Threshold(0.6, k_min=2, k_max=6), forecaster=constant(1e-6))
    stats = decode(hopeless).stats
    assert 2 * stats.rounds - 3 <= stats.drafted <= 2 * stats.rounds and plain.stats.drafted != stats.drafted  # budget
    goodput = LeverPolicy(head, Goodput(CostModel(t_draft=0.1, t_target=1.0, t_companion=0.0), k_max=6),
                                 forecaster=constant(1e-6))
    stats = decode(goodput).stats
    assert stats.rounds - 2 <= stats.drafted <= stats.rounds  # nothing pays after the first candidate


def test_the_logging_run_labels_every_decision_with_the_next_candidate_stops_included(micro_decoding):
    head, decode = micro_decoding
    log: list[VisitedCandidate] = []
    policy = LeverPolicy(head, Threshold(0.0, k_max=6), log=log)  # stops after every candidate: peeks label
    stats = decode(policy).stats
    labelled = [v.next_accept for v in log if v.next_accept is not None]
    assert len(log) == stats.drafted >= stats.rounds - 1  # one candidate a round: the peeked ones were withdrawn
    assert len(labelled) >= len(log) - 2 and all(0.0 <= a <= 1.0 for a in labelled)  # EOS / budget end a round
    assert stats.draft_calls == stats.drafted  # ... and their draft calls left uncounted


def test_under_greedy_the_pre_draft_stop_on_the_truth_is_the_realised_oracle_past_k_min():
    """Greedy acceptance is known before the draw (0 or 1): drafting while the next candidate will be accepted is the
    Thm 4.1 oracle, except that the round's first candidate is drafted whatever it holds (``k_min = 1``)."""
    target = micro_lm(24, seed=11, init=0.3)
    draft = copy.deepcopy(target)  # a perturbed copy: agrees often, not always
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)))
    head = AcceptanceHead(HeadConfig(hidden_size=16, depth=1, timing="pre", features=PRE_FEATURES))
    perfect = PerfectPreDraft(head, Threshold(0.5, k_max=6))

    def decode(policy):
        decoder = SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policy, eos_token_id=None)
        return decoder.generate(PROMPT, max_new_tokens=40, seed=0)

    ours, oracle, plain = (decode(p) for p in (perfect, policies.Oracle(k_max=6), Head(head, threshold=0.5, k_max=6)))
    assert torch.equal(ours.sequences, oracle.sequences)
    mine, its = ours.stats, oracle.stats
    assert mine.position_offered[1:] == mine.position_accepted[1:] == its.position_offered[1:]
    assert mine.position_accepted[0] == its.position_offered[0] and mine.drafted == its.drafted + mine.rejected
    assert mine.rejected < plain.stats.rejected  # control: a stop after the draw verifies the failing candidates


@pytest.mark.parametrize("rule", [rules.Speculative(), rules.Ensemble("weighted", weight=0.5)], ids=["speculative",
                                                                                                     "weighted"])
@pytest.mark.parametrize("stop", ["threshold", "goodput"])
def test_the_pre_draft_stops_on_the_truth_are_lossless(rule, stop):
    """Exact enumeration (tests/decode/test_exact_distribution.py): the stop reads the next candidate's acceptance
    before its draw, never the candidate or its verification draw."""
    models = {"target": micro_lm(4, seed=11, init=0.3), "draft": micro_lm(4, seed=12, init=0.3)}
    head = AcceptanceHead(HeadConfig(hidden_size=16, depth=1, timing="pre", features=PRE_FEATURES))
    rule_of_stop = (Goodput(CostModel(t_draft=0.3, t_target=1.0, t_companion=0.0), k_max=4) if stop == "goodput"
                    else Threshold(0.5, k_max=4))
    policy = PerfectPreDraft(head, rule_of_stop)
    mix = target_only if isinstance(rule, rules.Speculative) else weighted(0.5)
    exact = exact_distribution(models, mix, Sampling())
    decoder = SpeculativeDecoder(models["target"], models["draft"], rule=rule, policy=policy, eos_token_id=None)
    tv, bound = float(0.5 * (empirical(decoder, N_DEFAULT) - exact).abs().sum()), tv_bound(exact, N_DEFAULT)
    assert tv <= bound, f"TV {tv:.4f} exceeds {bound:.4f}"
    assert decoder.generate(PROMPT, max_new_tokens=3, seed=0).stats.drafted  # it drafts
