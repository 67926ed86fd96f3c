"""The lever harness: its recalibration fit recovers a known calibration (and finds none in noise), and it
measures every lever of every head on dev against the head as exported."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from accept_heads import levers
from accept_heads.levers import FEATURES, LEVERS, Recalibration, Visit, fit, retrain, run_levers
from ahconf.schema import LEVER_NAMES
from decode import AcceptanceHead, HeadConfig, SpeculativeDecoder, rules
from decode.costs import CostModel
from decode.head import PRE_FEATURES
from decode.policies import Head
from tests.accept_heads.conftest import DATA_OVERRIDES, model_overrides
from tests.accept_heads.test_evaluate import EVAL_OVERRIDES, write_artifacts


def rounds(n: int, seed: int, accept) -> list[Visit]:
    """``n`` synthetic candidates: round features drawn at random, true acceptance ``accept(x)``."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        x = np.array([1.0, rng.normal(0, 2), rng.integers(1, 8), -rng.exponential(1.0), rng.integers(0, 8),
                      rng.uniform(0, 4), rng.normal(0, 1)])
        rows.append(Visit(x, accept(x), torch.zeros(1), None))
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
    head.metadata = {"rule": "speculative"}
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2000, 8, generator=generator)
    direction = torch.randn(8, generator=generator)
    visits = [Visit(np.zeros(len(FEATURES)), float(torch.sigmoid(2 * h @ direction)), h, None) for h in hidden]
    model, losses = retrain(head, visits, seed=0)
    assert losses["held_out_bce_after"] < losses["held_out_bce_before"] - 0.05 and losses["held_out"] == 400
    assert model is not head and model.metadata == head.metadata and not model.training
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), head.state_dict().values()))


def test_every_lever_of_every_head_is_measured_on_dev(make_config, micro_trio, tmp_path):
    write_artifacts(tmp_path / "heads", micro_trio["draft"])
    config = make_config(*model_overrides(micro_trio), *DATA_OVERRIDES, *EVAL_OVERRIDES, f"paths.root={tmp_path}",
                         f"paths.head_dir={tmp_path / 'heads'}", f"evaluate.out_dir={tmp_path / 'eval'}")
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

    def decode(policy, seed: int = 3):
        decoder = SpeculativeDecoder(target, draft, rule=rules.Speculative(), policy=policy)
        return decoder.generate([1, 5, 9, 12], max_new_tokens=40, seed=seed)

    return head, decode


def constant(value: float) -> Recalibration:
    """A forecast of ``value`` whatever the round."""
    return Recalibration("pre-draft-linear", (math.log(value / (1 - value)),) + (0.0,) * (len(FEATURES) - 1))


def test_a_certain_forecast_keeps_the_threshold_stop_and_a_hopeless_one_drafts_k_min(micro_decoding):
    head, decode = micro_decoding
    plain = decode(Head(head, threshold=0.6, k_max=6))
    certain = levers.LeverHead(head, threshold=0.6, k_max=6)
    certain.setup(None, None, constant(1 - 1e-12))  # 1 − Π·1 > h is the head's own rule
    same = decode(certain)
    assert torch.equal(same.sequences, plain.sequences) and same.stats.drafted == plain.stats.drafted
    hopeless = levers.LeverHead(head, threshold=0.6, k_min=2, k_max=6)
    hopeless.setup(None, None, constant(1e-6))
    stats = decode(hopeless).stats
    assert 2 * stats.rounds - 3 <= stats.drafted <= 2 * stats.rounds and plain.stats.drafted != stats.drafted  # budget
    goodput = levers.LeverGoodput(head, CostModel(t_draft=0.1, t_target=1.0, t_companion=0.0), k_max=6)
    goodput.setup(None, None, constant(1e-6))
    stats = decode(goodput).stats
    assert stats.rounds - 2 <= stats.drafted <= stats.rounds  # nothing pays after the first candidate


def test_the_logging_run_labels_every_decision_with_the_next_candidate_stops_included(micro_decoding):
    head, decode = micro_decoding
    log: list[Visit] = []
    policy = levers.LeverHead(head, threshold=0.0, k_max=6)  # stops after every candidate: only peeks label anything
    policy.setup(None, log)
    stats = decode(policy).stats
    labelled = [v.next_accept for v in log if v.next_accept is not None]
    assert len(log) == stats.drafted >= stats.rounds - 1  # one candidate a round: the peeked ones were withdrawn
    assert len(labelled) >= len(log) - 2 and all(0.0 <= a <= 1.0 for a in labelled)  # EOS / budget end a round
    assert stats.draft_calls == stats.drafted  # ... and their draft calls left uncounted
