"""The structure table: rounds built from labelled responses, acceptance by depth, and conditional gains."""

from __future__ import annotations

import json
import math

import pytest
import torch

from accept_heads.measure.information import conditional_gain
from accept_heads.structure import measures
from accept_heads.structure.driver import run_structure
from accept_heads.structure.measures import VARIABLES, depth_acceptance, structure
from accept_heads.structure.rounds import round_candidates
from tests.helpers.config import DATA_OVERRIDES, model_overrides

LABEL = "label_speculative"


def _row(labels: list[float], top: list[float], entropy: list[float], deeper: dict[int, list[float]] | None = None):
    row = {LABEL: labels, "draft_top_prob": top, "target_entropy": entropy}
    for depth, values in (deeper or {}).items():
        row[f"{LABEL}@d{depth}"] = values
        row[f"draft_top_prob@d{depth}"] = [0.5] * len(values)
    return row


def test_rounds_read_each_depth_at_its_position_and_only_what_precedes_the_round():
    labels, top, entropy = [0.9, 0.8, 0.7, 0.6, 0.5], [0.1, 0.2, 0.3, 0.4, 0.5], [1.0, 2.0, 3.0, 4.0, 5.0]
    c = round_candidates([_row(labels, top, entropy)], LABEL, depths=3, seed=0)
    # the round starting at position 1: its candidates at positions 1, 2, 3
    at = (c.position - c.depth + 1) == 1
    assert c.label[at].tolist() == [0.8, 0.7, 0.6]
    assert c.reach_prob[at].tolist() == pytest.approx([1.0, 0.8, 0.8 * 0.7])
    assert c.round_so_far[at].tolist() == pytest.approx([1.0, 0.2, 0.2 * 0.3])
    assert c.running_acceptance[at].tolist() == pytest.approx([0.9] * 3)
    assert c.target_entropy[at].tolist() == [1.0] * 3
    # rounds that would run past the response are cut: 5 + 4 + 3 candidates
    assert len(c.depth) == 12 and c.responses == 1
    # causal: changing the round's own and later labels leaves what a head reads before it unchanged
    later = round_candidates([_row(labels[:1] + [0.1, 0.2, 0.3, 0.4], top, entropy)], LABEL, depths=3, seed=0)
    starts = (c.position - c.depth + 1) == 1
    for name in ("running_acceptance", "target_entropy", "top_prob", "round_so_far"):
        assert torch.equal(getattr(c, name)[starts], getattr(later, name)[starts])


def test_a_feature_drafts_rounds_read_the_labels_of_their_depth():
    deeper = {2: [float("nan"), 0.25, 0.35], 3: [float("nan"), float("nan"), 0.45]}
    c = round_candidates([_row([0.9, 0.8, 0.7], [0.5] * 3, [1.0] * 3, deeper)], LABEL, depths=3, seed=0)
    first_round = (c.position - c.depth + 1) == 0
    assert c.label[first_round].tolist() == [0.9, 0.25, 0.45]
    with pytest.raises(ValueError, match="collect.depths"):
        round_candidates([_row([0.9, 0.8, 0.7], [0.5] * 3, [1.0] * 3, {2: deeper[2]})], LABEL, depths=3, seed=0)


def test_depth_acceptance_of_independent_constant_labels():
    a = 0.7
    rows = [_row([a] * 30, [0.5] * 30, [1.0] * 30) for _ in range(8)]
    depths = depth_acceptance(round_candidates(rows, LABEL, depths=4, seed=0), seed=0)
    for row in depths:
        assert row.conditional == pytest.approx(a)
        assert row.unconditional == pytest.approx(a ** row.depth)
        assert row.low == pytest.approx(a) and row.high == pytest.approx(a)


def test_conditional_gain_is_zero_without_dependence_and_h_of_a_given_x_when_z_decides():
    generator = torch.Generator().manual_seed(0)
    n = 20_000
    x = torch.randint(0, 4, (n,), generator=generator)
    z = torch.randint(0, 2, (n,), generator=generator)
    decided = torch.zeros(4, 2, 2).index_put_((x, z, z), torch.ones(n), accumulate=True)
    independent = torch.zeros(4, 2, 2).index_put_(
        (x, z, torch.randint(0, 2, (n,), generator=generator)), torch.ones(n), accumulate=True)
    assert conditional_gain(decided).gain == pytest.approx(1.0, abs=0.01)
    assert conditional_gain(decided).fraction == pytest.approx(1.0, abs=0.01)
    # bias of the plug-in estimate: (A-bins − 1)(Z-bins − 1) · X-bins / (2 N ln 2) ≈ 1.4e-4 bits; corrected to ~0
    assert abs(conditional_gain(independent).gain) < 3e-4


def test_the_request_so_far_carries_acceptance_the_top_probability_cannot_and_the_coin_none(monkeypatch):
    """Responses accept at rates 0.2 or 0.8 with an uninformative top probability: the running acceptance tells it."""
    monkeypatch.setattr(measures, "GAIN_DRAWS", 60)
    generator = torch.Generator().manual_seed(1)
    rows = []
    for index in range(40):
        rate = 0.2 if index % 2 else 0.8
        top = torch.rand(48, generator=generator).tolist()
        rows.append(_row([rate] * 48, top, torch.rand(48, generator=generator).tolist()))
    table = structure(round_candidates(rows, LABEL, depths=3, seed=0), "speculative", "test", seed=0)
    gains = {g.variable: g for g in table.gains}
    request = gains["the request so far (its running acceptance)"]
    assert request.low > 0.1 and request.acceptance[0] < 0.3 and request.acceptance[-1] > 0.7
    control = gains["control: a seeded coin"]
    assert control.low <= 0 <= control.high and abs(control.gain) < 0.005
    assert abs(table.top_prob_gain) < 0.005
    assert list(gains) == list(VARIABLES) and all(math.isfinite(g.gain) for g in table.gains)


def test_every_rule_on_every_set_from_a_feature_drafts_rounds(make_config, micro_trio, micro_feature_draft, tmp_path,
                                                            monkeypatch):
    """End to end on micro models: test and out-of-distribution responses labelled in process (greedy ones for the
    greedy rule), every depth of a round from the feature draft's own labels, the JSON written whole."""
    monkeypatch.setattr(measures, "GAIN_DRAWS", 8)
    config = make_config(*model_overrides(micro_trio), f"models.draft.id={micro_feature_draft}", *DATA_OVERRIDES,
                         "prompts.sizes={train: 8, dev: 4, test: 4}", "collect.depths=3",
                         "structure.rules=[speculative,greedy,fuzzy]", f"paths.root={tmp_path}")
    path = run_structure(config.structure_job())
    written = json.loads(path.read_text())
    results = written["results"]
    assert [(r["rule"], r["set"]) for r in results] == [
        (rule, name) for name in ("test", "builtin:module") for rule in ("speculative", "fuzzy", "greedy")]
    for r in results:
        assert len(r["depths"]) == 3 and [g["variable"] for g in r["gains"]] == list(VARIABLES)
        assert r["responses"] == 4 and r["candidates"] > 0
        # never reached (every earlier label 0, as between random micro models under greedy): undefined, not 0
        assert all(0.0 <= d["conditional"] <= 1.0 or (math.isnan(d["conditional"]) and d["unconditional"] == 0)
                   for d in r["depths"])
        assert math.isfinite(r["depths"][0]["conditional"])
    assert written["depths"] == 3 and not list(path.parent.glob(".*"))
