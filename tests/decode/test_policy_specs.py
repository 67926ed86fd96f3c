"""Typed policy specs: each kind round-trips through its flat form and builds the policy it names."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import pytest
import torch

from decode import AcceptanceHead, HeadConfig, SVProfile, policies
from decode.costs import CostModel
from decode.head import PRE_FEATURES
from decode.metadata import HeadMetadata
from decode.policies.schedules import RefitConfidence
from decode.policies.sources import DraftConfidence, EntropyBound, HeadEstimate, OnlineMargin
from decode.policies.stops import Goodput, SurvivalStop, Threshold
from decode.policy_specs import (
    POLICY_SPECS,
    AdaEDLSpec,
    ConfidenceGoodputSpec,
    ConfidenceSpec,
    ConfidenceThresholdSpec,
    FixedSpec,
    GoodputHeadSpec,
    HeadSpec,
    HeadBudgetSpec,
    HeuristicSpec,
    MarginBudgetSpec,
    MarginGoodputSpec,
    MarginSpec,
    OracleSpec,
    RefitConfidenceSpec,
    PerfectGoodputSpec,
    PerfectHeadSpec,
    PolicyInputs,
    PolicySpec,
    SVIPSpec,
    SVSpec,
    policy_spec,
    register_policy,
)
from decode.rules import Speculative
from decode.sampling import Sampling
from decode.batch_costs import BatchCosts

SPECS = [FixedSpec(4), HeuristicSpec(), ConfidenceSpec(0.3), ConfidenceThresholdSpec(0.6), ConfidenceGoodputSpec(),
         RefitConfidenceSpec(),
         SVIPSpec(0.9), AdaEDLSpec(0.1),
         MarginSpec(0.5), MarginGoodputSpec(), HeadSpec("pre", 0.8), GoodputHeadSpec("pre"),
         SVSpec("profile"), SVSpec("profile", k=3), PerfectHeadSpec(0.7), PerfectGoodputSpec(), OracleSpec()]
#: The kinds that decide at measured batch costs (built with ``PolicyInputs.batch_costs``).
BATCH_SPECS = [HeadBudgetSpec("pre"), MarginBudgetSpec()]
COSTS = BatchCosts(batches=(1, 4), draft=(0.1, 0.2), target=((1.0, 1.1, 1.2), (1.5, 1.8, 2.1)))


def buildable(spec: PolicySpec, inputs: PolicyInputs) -> PolicyInputs:
    """``inputs`` with the measured batch costs where ``spec`` needs them."""
    return replace(inputs, batch_costs=COSTS) if spec in BATCH_SPECS else inputs


@pytest.fixture()
def inputs() -> PolicyInputs:
    head = AcceptanceHead(HeadConfig(8, depth=1, timing="pre", features=PRE_FEATURES))
    head.metadata = HeadMetadata(draft="draft", tokenizer_hash="x", rule=Speculative().spec(), sampling=Sampling(),
                                 head_config=head.config, k_min=2, k_max=12)
    profile = SVProfile(x_edges=torch.tensor([0.0, 1.0]), y_edges=torch.tensor([0.0, 1.0]), table=torch.ones(1, 1),
                        counts=torch.ones(1, 1), latency=torch.ones(6))
    return PolicyInputs(heads={"pre": head}, profiles={"profile": profile},
                        costs=CostModel(t_draft=0.2, t_target=1.0, t_companion=0.0), k_max=20)


def test_the_registry_holds_what_serving_needs_and_no_evaluation_trait():
    """Every spec of ``SPECS`` is of a registered kind, and a spec class declares its kind, its parameters and the
    artifact it reads only: how the evaluation sweeps, tables and draws a kind is declared there."""
    assert [POLICY_SPECS[spec.kind] for spec in SPECS + BATCH_SPECS] == [type(spec) for spec in SPECS + BATCH_SPECS]
    assert set(POLICY_SPECS) == {spec.kind for spec in SPECS + BATCH_SPECS}
    traits = {"symbol", "tuned", "grid", "grid_setting", "rows_alone", "bound", "perfect", "color"}
    assert not any(traits & set(dir(kind)) for kind in POLICY_SPECS.values())


def test_a_kind_cannot_be_registered_twice_under_one_name():
    @dataclass(frozen=True)
    class Another(PolicySpec):
        kind: ClassVar[str] = "fixed"

    with pytest.raises(ValueError, match="already registered by FixedSpec"):
        register_policy(Another)
    assert POLICY_SPECS["fixed"] is FixedSpec


@pytest.mark.parametrize("spec", SPECS + BATCH_SPECS, ids=repr)
def test_each_spec_round_trips_through_its_flat_form(spec):
    assert policy_spec(spec.kind, spec.value, spec.artifact) == spec


def test_each_spec_builds_the_policy_it_names(inputs):
    built = {repr(spec): spec.build(inputs) for spec in SPECS}
    assert isinstance(built["FixedSpec(k=4)"], policies.Fixed) and built["FixedSpec(k=4)"].k == 4
    heuristic = built["HeuristicSpec()"]
    assert isinstance(heuristic, policies.Heuristic) and (heuristic.k0, heuristic.k_max) == (5, 20)
    assert built["ConfidenceSpec(tau=0.3)"].tau == 0.3
    head = built["HeadSpec(head='pre', threshold=0.8)"]
    assert type(head) is policies.Head and (head.threshold, head.k_min, head.k_max) == (0.8, 2, 12)  # calibrated range
    goodput = built["GoodputHeadSpec(head='pre')"]
    assert isinstance(goodput, policies.GoodputHead) and goodput.stop.costs == inputs.costs
    assert built["SVSpec(profile='profile', k=None)"].k == 6  # the profile's latency table length
    assert built["SVSpec(profile='profile', k=3)"].k == 3
    assert isinstance(built["OracleSpec()"], policies.Oracle)
    perfect = built["PerfectHeadSpec(threshold=0.7)"]
    assert isinstance(perfect, policies.PerfectHead) and (perfect.threshold, perfect.k_max) == (0.7, 20)
    perfect_goodput = built["PerfectGoodputSpec()"]
    assert isinstance(perfect_goodput, policies.PerfectGoodput) and perfect_goodput.stop.costs == inputs.costs
    assert built["SVIPSpec(h=0.9)"].h == 0.9
    refit = built["RefitConfidenceSpec()"]
    assert isinstance(refit, RefitConfidence) and (refit.fit.tau, refit.k_max) == (0.4, 20)
    for name, source, stop in [("ConfidenceThresholdSpec(threshold=0.6)", DraftConfidence, Threshold),
                               ("ConfidenceGoodputSpec()", DraftConfidence, Goodput),
                               ("AdaEDLSpec(gamma=0.1)", EntropyBound, Goodput),
                               ("MarginSpec(threshold=0.5)", OnlineMargin, Threshold),
                               ("MarginGoodputSpec()", OnlineMargin, Goodput)]:
        policy = built[name]
        assert type(policy.source) is source and type(policy.stop) is stop and policy.k_max == 20, name
    assert built["MarginSpec(threshold=0.5)"].stop.threshold == 0.5 and built["AdaEDLSpec(gamma=0.1)"].source.gamma == 0.1
    assert built["MarginGoodputSpec()"].stop.costs == inputs.costs


def test_a_survival_budget_decides_at_the_measured_batch_costs_and_is_refused_without(inputs):
    for spec, source in zip(BATCH_SPECS, (HeadEstimate, OnlineMargin)):
        policy = spec.build(buildable(spec, inputs))
        assert type(policy.source) is source and isinstance(policy.stop, SurvivalStop) and policy.stop.costs == COSTS
        plan = policy.batch_plan()
        assert isinstance(plan, policies.SurvivalBudget) and plan.costs == COSTS
        with pytest.raises(ValueError, match=f"a {spec.kind} policy decides at measured batch costs"):
            spec.build(inputs)
    assert (policies.StopPolicy(OnlineMargin(), SurvivalStop(COSTS, 2, 12)).k_min,
            HeadBudgetSpec("pre").build(buildable(BATCH_SPECS[0], inputs)).k_max) == (2, 12)  # the head's range


def test_a_goodput_head_without_costs_and_an_unknown_kind_are_refused(inputs):
    with pytest.raises(ValueError, match="needs the cost model"):
        GoodputHeadSpec("pre").build(PolicyInputs(heads=inputs.heads))
    with pytest.raises(ValueError, match="a margin-goodput policy needs the cost model"):
        MarginGoodputSpec().build(PolicyInputs())
    with pytest.raises(ValueError, match="unknown policy kind 'bogus'; valid: fixed, heuristic, .*, oracle$"):
        policy_spec("bogus")
