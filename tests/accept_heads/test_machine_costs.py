"""Batch costs are measured once per machine and model set, stored, and reused by later runs."""

from __future__ import annotations

from accept_heads.evaluation import machine_costs
from accept_heads.evaluation.machine_costs import machine_batch_costs
from decode.batch_costs import BatchCosts

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
