"""The evaluation's plan (data, frozen) and its typed metadata record (no decoding)."""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import asdict

import pytest

from accept_heads.evaluation.baselines import HFDescription
from accept_heads.evaluation.batch_axis import BatchAxisDescription
from accept_heads.evaluation.choice import Choice
from accept_heads.evaluation.evaluation_plan import plan_evaluation
from accept_heads.evaluation.metadata import OPTIONAL, EvaluationMetadata
from accept_heads.evaluation.wallclock import WallclockDescription
from accept_heads.measure.cost_models import CostFit, Latency, Pricing, StoredProfile, fitted_pricing
from accept_heads.measure.families import STOP_TRAITS
from accept_heads.measure.inputs import HeadRecord, ProfileRecord, PromptSetDescription
from accept_heads.measure.machine_costs import CostsSource
from ahconf.schema import CostConfig, DecodingConfig, EvaluateConfig, EvaluateJob, RulesConfig, SamplingConfig
from decode.batch_costs import BatchCosts, CostProfile
from decode.compile.config import DEFAULT
from decode.drafts import FeatureDrafter, PlainDrafter
from decode.head_config import HeadConfig
from decode.metadata import HeadMetadata, InformationGain, ProfileMetadata, TrainingData
from decode.rules import Speculative
from decode.sampling import Sampling
from runtime.models import ModelDescription, TrioDescription
from tests.helpers.config import compose_config

COSTS = BatchCosts((1, 2), (0.01, 0.012), ((0.05, 0.06), (0.07, 0.08)), ((0.02, 0.03), (0.04, 0.05)))
STORED = CostsSource("/costs/profile.json", True, {"machine": "cpu", "models": {"name": "pair"}})


def metadata(**changes) -> EvaluationMetadata:
    """A record with a value of its own kind in every field, every optional one set."""
    model = ModelDescription("zoo:target", "/zoo/target", None, "auto")
    spec = Speculative().spec()
    latency = Latency([0.05, 0.06, 0.07], 0.04, 0.01, 0.012, "cpu", 12, 3)
    fit = CostFit(0.011, 0.0, 0.052, 0.97, 9, 0)
    head = HeadMetadata(draft="zoo:draft", tokenizer_hash="abc", rule=spec, sampling=Sampling(top_k=5),
                        head_config=HeadConfig(hidden_size=8, timing="pre", features=("log_q", "entropy")),
                        training_data=TrainingData("f" * 64, "data", "tiny", {"train": 10, "dev": 4}), k_max=6,
                        dev_metrics={"val/auroc": 0.7, "val/ece": None}, train_config={"head": {"mixing_r": 0.25}})
    profile = ProfileMetadata(draft="zoo:draft", tokenizer_hash="abc", rule=spec, sampling=Sampling(), bins=(2, 1),
                              information={"dev": InformationGain(1.0, 0.8, 0.2, 0.2)}, latency_batches=(1, 2))
    machine = CostProfile("cpu avx2", "float32", BatchCosts((1,), (0.01,), ((0.04, 0.05),)))
    measured = Pricing(machine.cost_model(), "measured", machine.caption(), "the companion's one-token step, measured",
                       "every price from this machine's cost profile", StoredProfile(machine, STORED))
    values = dict(
        command="accept_heads.evaluate", exp_name="tiny", code_version="0.1", device="cpu", torch_threads=1,
        models=TrioDescription("tiny-code", "abc", 512, model, model, companion=None), sampling=SamplingConfig(),
        rules=RulesConfig(names=["speculative"]), eval_rules=["speculative"], rule_specs={"speculative": spec},
        seed=0, seeding="each prompt by its id", max_new_tokens=8,
        sets=[PromptSetDescription("dev", "dev", "builtin", "function", "dev", 2, {"too_long": 1}, ["a", "b"])],
        selection_set="dev", selection=[Choice("speculative", None, "fixed", None, 3.0, 12.5),
                                        Choice("fuzzy", None, "fixed", None, 0.2, 9.0, swept="rule_param", param=2.0)],
        selection_criterion="max modelled throughput", cost=CostConfig(t_companion=0.03),
        cost_models={"cost": measured, "fitted": fitted_pricing(fit, latency, {})}, cost_fit=fit,
        cost_fit_tuples="per run", batching="alone", latency=latency, hf=HFDescription(4, True),
        decoding=DecodingConfig(), evaluate=EvaluateConfig(grids={"fixed": [1.0, 3.0]}),
        dev_grids={"fixed": [1.0, 3.0]}, heads={"pre": HeadRecord("/heads/pre/head.safetensors", head)},
        profiles={"profile": ProfileRecord("/heads/profile.safetensors", profile, [0.0, 0.5, 1.0], [0.0, 1.0],
                                           [[0.2], [0.7]], [[3.0], [5.0]], [0.05, 0.06], [1, 2],
                                           [[0.05, 0.06], [0.07, 0.08]])},
        workers=1, notes={"a": "b"}, batch_axis=BatchAxisDescription([1, 2], 4, ["speculative"], COSTS, STORED, 1),
        wallclock=WallclockDescription("cpu", "float32", 2, ["test"], None, ["speculative"], "compiled", DEFAULT),
        seconds=1.5)
    return dataclasses.replace(EvaluationMetadata(**values), **changes)


def test_the_metadata_record_round_trips_through_its_json():
    record = metadata()
    text = json.dumps(record.to_dict(), sort_keys=True)
    assert EvaluationMetadata.from_dict(json.loads(text)) == record
    unset = metadata(wallclock=None, batch_axis=None, seconds=None)
    assert EvaluationMetadata.from_dict(json.loads(json.dumps(unset.to_dict()))) == unset
    assert "wallclock" not in unset.to_dict() and "batch_axis" not in unset.to_dict()  # unset: left out
    written = record.to_dict()
    assert written["batch_axis"]["batch_sizes"] == [1, 2] and written["cost_models"]["cost"]["caption"]
    assert written["latency"]["alone_ratio"] == pytest.approx(0.8) and written["models"]["target"]["id"] == "zoo:target"
    assert "companion" not in written["models"]  # the trio's JSON form, as the costs and collections key it
    loaded = EvaluationMetadata.from_dict(json.loads(text))
    assert loaded.selection[1].run_params() == (2.0, 0.2) and loaded.heads["pre"].metadata.mixing_r == 0.25
    assert loaded.cost_models["cost"].profile.stored.path == "/costs/profile.json"
    assert loaded.profiles["profile"].metadata.information["dev"].gain_fraction == 0.2
    assert loaded.wallclock.compile == DEFAULT and loaded.latency.shape.values == pytest.approx((1.0, 1.2, 1.4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.seconds = 2.0  # type: ignore[misc]


def test_a_metadata_file_lacking_a_key_is_refused_naming_it():
    record = metadata().to_dict()
    del record["selection"]
    with pytest.raises(ValueError, match="lacks selection"):
        EvaluationMetadata.from_dict(record)
    optional = {name: value for name, value in metadata().to_dict().items() if name not in OPTIONAL}
    assert EvaluationMetadata.from_dict(optional).seconds is None  # negative control: the optional ones may lack


@pytest.mark.parametrize(("path", "value", "message"), [
    (("sets", 0, "count"), "two", r"sets\[0\]\.count is 'two'; expected int"),
    (("sets",), {"name": "dev"}, r"sets is \{'name': 'dev'\}; expected list"),
    (("selection", 0), {"rule": "speculative"}, r"selection\[0\] lacks rule_param"),
    (("latency", "target_s"), [0.05, None], r"latency\.target_s\[1\] is None; expected float"),
    (("cost_models", "fitted"), {"source": "fitted"}, r"cost_models\.fitted is no Pricing \(KeyError"),
    (("sampling", "temperature"), -1.0, r"sampling: sampling\.temperature must be >= 0"),
    (("heads", "pre", "metadata", "head_config"), None, r"heads\.pre\.metadata is no HeadMetadata \(TypeError"),
])
def test_a_value_of_the_wrong_shape_is_refused_naming_where(path, value, message):
    record = metadata().to_dict()
    place = record
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    with pytest.raises(ValueError, match=f"^evaluation metadata: {message}"):
        EvaluationMetadata.from_dict(record)
    assert EvaluationMetadata.from_dict(metadata().to_dict()) == metadata()  # negative control: as written, it loads


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
