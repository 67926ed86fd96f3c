"""The evaluation's plan (data, frozen) and its typed metadata record (no decoding)."""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import asdict, fields

import pytest

from accept_heads.evaluation.evaluation_plan import plan_evaluation
from accept_heads.evaluation.metadata import OPTIONAL, EvaluationMetadata
from accept_heads.measure.families import STOP_TRAITS
from ahconf.schema import EvaluateJob
from decode.drafts import FeatureDrafter, PlainDrafter
from tests.helpers.config import compose_config


def metadata(**changes) -> EvaluationMetadata:
    """A record with a value of its JSON kind in every field."""
    values = {f.name: f"{f.name}-value" for f in fields(EvaluationMetadata)}
    values.update(models={"target": {"id": "t"}}, torch_threads=1, sampling={"temperature": 1.0},
                  rules={"names": ["speculative"]}, eval_rules=["speculative"], rule_specs={"speculative": {}},
                  seed=0, max_new_tokens=8, sets=[{"name": "dev", "role": "dev"}],
                  selection=[{"rule": "speculative", "family": "fixed", "value": 3.0}],
                  cost={"t_draft": 0.1}, cost_models={"cost": {"caption": "c"}}, cost_fit={"n": 2}, latency={},
                  hf={}, evaluate={"hf": {"baselines": True}}, dev_grids={"fixed": [1.0, 3.0]},
                  heads={"pre": {"timing": "pre"}}, profiles={}, workers=1, notes={"a": "b"},
                  cost_profile=None, batch_axis={"batch_sizes": [1, 2]}, wallclock=None, seconds=1.5)
    return dataclasses.replace(EvaluationMetadata(**values), **changes)


def test_the_metadata_record_round_trips_through_its_json():
    record = metadata()
    text = json.dumps(record.to_dict(), sort_keys=True)
    assert EvaluationMetadata.from_dict(json.loads(text)) == record
    assert "wallclock" not in record.to_dict() and "cost_profile" not in record.to_dict()  # unset: left out
    assert record.to_dict()["batch_axis"] == {"batch_sizes": [1, 2]}
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.seconds = 2.0  # type: ignore[misc]


def test_a_metadata_file_lacking_a_key_is_refused_naming_it():
    record = metadata().to_dict()
    del record["selection"]
    with pytest.raises(ValueError, match="lacks selection"):
        EvaluationMetadata.from_dict(record)
    optional = {name: value for name, value in metadata().to_dict().items() if name not in OPTIONAL}
    assert EvaluationMetadata.from_dict(optional).seconds is None  # negative control: the optional ones may lack


def test_the_plan_is_data_resolved_from_its_config_which_it_never_writes():
    job = compose_config("evaluate.rules=[speculative,greedy]", "evaluate.batch_axis.sizes=[1,2]",
                         "evaluate.batch_axis.rules=[greedy]", "+evaluate.grids.fixed=[1,3]").evaluate_job()
    before = copy.deepcopy(job)
    plan = plan_evaluation(job)
    assert plan.rules == ("speculative", "greedy") and plan.axis_rules == ("greedy",) and plan.workers is None
    assert plan.fixed_grid == [1, 3] and plan.grid("head") == list(STOP_TRAITS["h"].grid) and plan.hf_baselines
    assert not any(isinstance(value, EvaluateJob) for value in vars(plan).values())  # no config copy inside
    notes: dict[str, str] = {}
    loaded = plan.loaded("cpu", FeatureDrafter(), notes=notes).with_fixed_grid([1, 3, 5, 6])
    assert not loaded.hf_baselines and "cannot run a feature draft" in notes["hf_baselines"]
    assert loaded.fixed_grid == [1, 3, 5, 6] and loaded.workers >= 1 and plan.fixed_grid == [1, 3]
    assert asdict(job) == asdict(before) and job.evaluate.hf.baselines  # the caller's config as it was
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.workers = 2  # type: ignore[misc]
    assert plan.loaded("cpu", PlainDrafter(), notes=notes).hf_baselines  # negative control
