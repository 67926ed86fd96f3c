"""Batch costs and cost profiles are measured once per machine and model set, stored, and reused by later runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from accept_heads.evaluation.report import cost_lines
from accept_heads.measure import machine_costs
from accept_heads.measure.cost_models import CostFit, configured_model, pricing
from accept_heads.measure.machine_costs import machine_batch_costs, machine_profile
from ahconf.schema import CostConfig
from decode.batch_costs import BatchCosts, CostProfile
from decode.costs import LatencyShape
from runtime.models import ModelDescription, Trio, TrioDescription

TABLE = BatchCosts(batches=(1, 2), draft=(0.1, 0.12), target=((1.0, 1.1), (1.2, 1.3)), draft_widths=((0.1, 0.2),
                                                                                                    (0.12, 0.22)))


def test_a_table_round_trips_through_its_dict():
    assert BatchCosts.from_dict(TABLE.to_dict()) == TABLE


def test_the_first_run_measures_and_stores_later_runs_reuse_and_another_key_measures_again(tmp_path, monkeypatch):
    measured = []

    def measure(target, draft, **kwargs):
        measured.append(kwargs)
        return TABLE

    monkeypatch.setattr(machine_costs, "measure_batch_costs", measure)
    models = {"target": {"id": "t", "resolved": str(tmp_path / "nowhere")}, "draft": {"id": "d"}}
    args = {"models": models, "batches": [2, 1], "max_length": 2, "repeats": 3, "root": tmp_path}
    costs, source = machine_batch_costs(None, None, **args)
    assert costs == TABLE and not source.reused and len(measured) == 1 and measured[0]["batches"] == [2, 1]
    again, reused = machine_batch_costs(None, None, **args)
    assert again == TABLE and reused.reused and reused.path == source.path and len(measured) == 1
    machine_batch_costs(None, None, **{**args, "max_length": 3})  # another grid: another table
    machine_batch_costs(None, None, **args, refresh=True)
    assert len(measured) == 3
    assert source.key["device"] and source.key["threads"] >= 1 and source.key["batches"] == [1, 2]


def test_a_rebuilt_model_at_the_same_path_is_another_key(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"one")
    models = {"target": {"id": "t", "resolved": str(tmp_path)}}
    before = machine_costs.model_files(models)
    (tmp_path / "model.safetensors").write_bytes(b"other")
    assert before != machine_costs.model_files(models)
    assert before["target"]["model.safetensors"][0] == 3


def test_the_device_is_named():
    assert machine_costs.device_name()


#: Stand-ins for loaded models: what a profile's key reads of them (the measurement itself is replaced).
MODEL = SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cpu"))
PROFILE = CostProfile("a CPU", "bfloat16", BatchCosts(batches=(1,), draft=(0.003,), target=((0.04, 0.05, 0.06),)))
DESCRIPTION = TrioDescription("pair", "hash", 16, ModelDescription("t", "t", None, "auto"),
                              ModelDescription("d", "d", None, "auto"))


@pytest.fixture
def measured(monkeypatch) -> list[dict]:
    """The calls of the profile's measurement, which returns :data:`PROFILE`."""
    calls: list[dict] = []

    def measure(target, draft, companion, **kwargs):
        calls.append(kwargs)
        return PROFILE

    monkeypatch.setattr(machine_costs, "measure_cost_profile", measure)
    return calls


def test_a_profile_is_stored_once_per_machine_and_reused(tmp_path, measured, capsys):
    models = {"name": "pair", "target": {"id": "t"}, "draft": {"id": "d"}}
    profile, source = machine_profile(MODEL, MODEL, models=models, repeats=2, root=tmp_path)
    assert profile == PROFILE and not source.reused and measured == [{"repeats": 2, "compiled": False}]
    assert "no cost profile" in capsys.readouterr().out
    stored = json.loads(Path(source.path).read_text())
    assert CostProfile.from_dict(stored["profile"]) == PROFILE and stored["key"]["dtypes"]["target"] == "torch.bfloat16"
    again, reused = machine_profile(MODEL, MODEL, models=models, repeats=5, root=tmp_path)
    assert again == PROFILE and reused.reused and reused.path == source.path and len(measured) == 1
    assert capsys.readouterr().out == ""  # reused quietly
    assert Path(source.path).name.startswith("profile-pair-") and "thread" in source.key["machine"]


def test_a_stale_profile_is_measured_again_with_one_line(tmp_path, measured, capsys):
    weights = tmp_path / "target"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"one")
    models = {"name": "pair", "target": {"id": "t", "resolved": str(weights)}, "draft": {"id": "d"}}
    _, source = machine_profile(MODEL, MODEL, models=models, repeats=1, root=tmp_path)
    path = Path(source.path)
    stored = json.loads(path.read_text())
    path.write_text(json.dumps({**stored, "key": {**stored["key"], "torch": "0.1.0"}}))  # another torch
    capsys.readouterr()
    machine_profile(MODEL, MODEL, models=models, repeats=1, root=tmp_path)
    assert len(measured) == 2 and capsys.readouterr().out.splitlines() == [
        f"the stored cost profile is stale (torch changed): measuring it ({source.key['machine']}, batch 1, eager "
        f"forwards; stored in {path})"]
    (weights / "model.safetensors").write_bytes(b"other weights")
    _, again = machine_profile(MODEL, MODEL, models=models, repeats=1, root=tmp_path)
    assert len(measured) == 3 and "(files changed)" in capsys.readouterr().out and again.path == source.path
    machine_profile(MODEL, MODEL, models=models, repeats=1, compiled=True, root=tmp_path)  # none stored compiled
    assert len(measured) == 4 and measured[-1]["compiled"] and "no compiled forwards" in capsys.readouterr().out
    machine_profile(MODEL, MODEL, models=models, repeats=1, root=tmp_path, refresh=True)
    assert len(measured) == 5


def test_the_measured_cost_model_prices_from_the_profile_and_says_so(tmp_path, measured):
    trio = Trio(MODEL, MODEL, None, None, DESCRIPTION)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(machine_costs.COSTS_ENV, str(tmp_path))
        priced = pricing(CostConfig(source="measured"), trio, lambda: pytest.fail("no ratio is read"), compiled=False,
                         repeats=1, threads=1)
    assert priced.model == PROFILE.cost_model() and priced.model.t_target == 0.05 and priced.model.target_alone == 0.04
    assert priced.caption == PROFILE.caption() and priced.record["source"] == "measured"
    assert priced.profile.stored.path.startswith(str(tmp_path))
    paper = pricing(CostConfig(t_companion=None), trio, lambda: 1.5, compiled=False, repeats=1, threads=None)
    assert paper.model == configured_model(CostConfig(), 1.5) and len(measured) == 1
    assert paper.caption == "the cost pair t_d = 0.0236 s, t_t = 0.112 s, t_c = 0.0354 s (flat in L)"
    assert paper.record["t_companion_from"] == "t_d x the companion/draft call ratio measured here"


def test_the_report_names_the_measured_costs(tmp_path, measured):
    trio = Trio(MODEL, MODEL, None, None, DESCRIPTION)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(machine_costs.COSTS_ENV, str(tmp_path))
        priced = pricing(CostConfig(source="measured"), trio, lambda: None, compiled=True, repeats=1, threads=None)
    assert measured[-1]["compiled"] and "eager" in priced.caption  # nothing compiled here: priced eager, and says so
    fit = CostFit(t_draft=0.003, t_companion=0.0, t_target=0.05, r2=0.9, n=3, companion_runs=0)
    metadata = SimpleNamespace(  # the two fields of an EvaluationMetadata the cost lines read
        cost_fit=fit, cost_models={"fitted": replace(priced, model=fit.model(LatencyShape())), "cost": priced})
    line = cost_lines(metadata)[-1]
    assert line.startswith(f"cost model: {PROFILE.caption()} (t_d = 3.00 ms, t_t = T(2) = 50.00 ms")
    assert line.endswith(f"stored in {priced.profile.stored.path})")
