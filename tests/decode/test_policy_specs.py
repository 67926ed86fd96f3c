"""Typed policy specs: each kind round-trips through its flat form and builds the policy it names; an acceptance
source under a stop rule is one spec over two registries, and today's kind names read as before."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import pytest

from decode import policies
from decode.policies.base import PolicyInputs
from decode.policies.schedules import RefitConfidence
from decode.policies.sources import (
    SOURCES,
    DraftConfidence,
    EntropyBound,
    HeadEstimate,
    OnlineHead,
    OnlineMargin,
    TrueAcceptance,
    VLLMEstimator,
    register_source,
)
from decode.policies.stops import STOPS, Goodput, SurvivalStop, Threshold, register_stop
from decode.policy_specs import (
    POLICY_SPECS,
    FixedSpec,
    PolicySpec,
    SourceStopSpec,
    policy_kinds,
    policy_spec,
    register_policy,
    source_stop_aliases,
)
from tests.helpers.policy_specs import BATCH_SPECS, COSTS, SPECS, buildable, policy_inputs

#: The kinds before acceptance sources and stop rules were registries: every one still reads (issue 63).
TODAYS_KINDS = ["fixed", "heuristic", "confidence", "confidence-h", "confidence-goodput", "confidence-refit", "svip",
                "adaedl", "margin", "margin-goodput", "head", "head-goodput", "head-budget", "margin-budget", "sv",
                "head-online", "head-online-goodput", "head-online-budget", "perfect", "perfect-goodput", "oracle",
                "vllm", "vllm-h", "vllm-budget"]


@pytest.fixture()
def inputs() -> PolicyInputs:
    return policy_inputs()


def test_the_registries_hold_what_serving_needs_and_no_evaluation_trait():
    """Every kind is a schedule's or a registered source's under a registered stop: each source under each stop,
    but where both take a parameter and where a source read in hindsight meets a stop only a batch takes; a spec
    class, a source and a stop declare their name, parameters and the artifact read only (how the evaluation sweeps,
    tables and draws a kind is declared there)."""
    assert list(SOURCES) == ["confidence", "adaedl", "margin", "vllm", "head", "head-online", "perfect"]
    assert list(STOPS) == ["h", "goodput", "budget"]
    assert list(POLICY_SPECS) == ["fixed", "heuristic", "confidence", "confidence-refit", "svip", "source-stop", "sv",
                                  "oracle"]
    assert {spec.kind for spec in SPECS + BATCH_SPECS} == set(policy_kinds())
    assert set(policy_kinds()) == set(TODAYS_KINDS) | {"confidence-budget", "adaedl-budget"}
    traits = {"symbol", "tuned", "grid", "grid_setting", "rows_alone", "bound", "perfect", "color", "league"}
    for registered in (*POLICY_SPECS.values(), *SOURCES.values(), *STOPS.values()):
        assert not traits & set(dir(registered)), registered


def test_a_kind_cannot_be_registered_twice_under_one_name():
    @dataclass(frozen=True)
    class Another(PolicySpec):
        kind: ClassVar[str] = "fixed"

    with pytest.raises(ValueError, match="already registered by FixedSpec"):
        register_policy(Another)
    assert POLICY_SPECS["fixed"] is FixedSpec

    class Impostor(DraftConfidence):
        name = "head"

    with pytest.raises(ValueError, match="acceptance source 'head' is already registered by HeadEstimate"):
        register_source(Impostor)

    class Strict(Threshold):
        pass  # Threshold's name

    with pytest.raises(ValueError, match="stop rule 'h' is already registered by Threshold"):
        register_stop(Strict)
    assert (SOURCES["head"], STOPS["h"]) == (HeadEstimate, Threshold)


@pytest.mark.parametrize("spec", SPECS + BATCH_SPECS, ids=repr)
def test_each_spec_round_trips_through_its_flat_form(spec):
    assert policy_spec(spec.kind, spec.value, spec.artifact) == spec


def test_todays_kind_names_read_and_a_source_under_the_stop_it_names_is_named_by_the_source_alone():
    assert source_stop_aliases() == {"adaedl-goodput": "adaedl", "margin-h": "margin", "vllm-goodput": "vllm",
                                     "head-h": "head", "head-online-h": "head-online", "perfect-h": "perfect"}
    assert [policy_spec(kind, 0.5, "pre").kind for kind in TODAYS_KINDS] == TODAYS_KINDS
    assert policy_spec("head-h", 0.8, "pre") == policy_spec("head", 0.8, "pre") == SourceStopSpec("head", "h", 0.8,
                                                                                                     "pre")
    assert policy_spec("margin-goodput", float("nan"), None) == SourceStopSpec("margin", "goodput")  # a table's NaN


def test_each_spec_builds_the_policy_it_names(inputs):
    built = {repr(spec): spec.build(inputs) for spec in SPECS}
    assert isinstance(built["FixedSpec(k=4)"], policies.Fixed) and built["FixedSpec(k=4)"].k == 4
    heuristic = built["HeuristicSpec()"]
    assert isinstance(heuristic, policies.Heuristic) and (heuristic.k0, heuristic.k_max) == (5, 20)
    assert built["ConfidenceSpec(tau=0.3)"].tau == 0.3
    assert built["SVSpec(profile='profile', k=None)"].k == 6  # the profile's latency table length
    assert built["SVSpec(profile='profile', k=3)"].k == 3
    assert isinstance(built["OracleSpec()"], policies.Oracle)
    assert built["SVIPSpec(h=0.9)"].h == 0.9
    refit = built["RefitConfidenceSpec()"]
    assert isinstance(refit, RefitConfidence) and (refit.fit.tau, refit.k_max) == (0.4, 20)
    pairs = [spec for spec in SPECS if isinstance(spec, SourceStopSpec)]
    classes = {"confidence": DraftConfidence, "adaedl": EntropyBound, "margin": OnlineMargin, "vllm": VLLMEstimator,
               "head": HeadEstimate,
               "head-online": OnlineHead, "perfect": TrueAcceptance, "h": Threshold, "goodput": Goodput}
    for spec in pairs:
        policy = built[repr(spec)]
        assert type(policy) is policies.StopPolicy, spec
        assert (type(policy.source), type(policy.stop)) == (classes[spec.source], classes[spec.stop]), spec
        assert (policy.k_min, policy.k_max) == ((2, 12) if spec.source in ("head", "head-online") else (1, 20)), spec  # a head's range
        if spec.stop == "goodput":
            assert policy.stop.costs == inputs.costs and policy.stop.batch_costs is None, spec
    head = built[repr(SourceStopSpec("head", "h", 0.8, "pre"))]
    assert head.source.head is inputs.heads["pre"] and head.stop.threshold == 0.8
    assert built[repr(SourceStopSpec("margin", "h", 0.5))].stop.threshold == 0.5
    assert built[repr(SourceStopSpec("adaedl", "goodput", 0.1))].source.gamma == 0.1


def test_the_head_and_the_perfect_predictor_decide_as_their_classes_do(inputs):
    """A spec's policy and the library's class of the same source and stop take the same decisions."""
    head = inputs.heads["pre"]
    pairs = [(SourceStopSpec("head", "h", 0.8, "pre"), policies.Head(head, threshold=0.8)),
             (SourceStopSpec("head", "goodput", head="pre"), policies.GoodputHead(head, inputs.costs, 2, 12)),
             (SourceStopSpec("perfect", "h", 0.7), policies.PerfectHead(0.7, k_max=20)),
             (SourceStopSpec("perfect", "goodput"), policies.PerfectGoodput(inputs.costs, k_max=20))]
    for spec, policy in pairs:
        built = spec.build(inputs)
        assert (type(built.source), repr(built.stop)) == (type(policy.source), repr(policy.stop)), spec
        assert (built.needs_hidden, built.needs_hindsight, built.companion) == (policy.needs_hidden,
                                                                                policy.needs_hindsight,
                                                                                policy.companion)


def test_a_batch_stop_decides_at_the_measured_batch_costs_and_is_refused_without(inputs):
    for spec in BATCH_SPECS:
        policy = spec.build(buildable(spec, inputs))
        assert isinstance(policy.stop, SurvivalStop) and policy.stop.costs == COSTS
        plan = policy.batch_plan()
        assert isinstance(plan, policies.SurvivalBudget) and plan.costs == COSTS
        with pytest.raises(ValueError, match=f"a {spec.kind} policy decides at measured batch costs"):
            spec.build(inputs)
    assert (policies.StopPolicy(OnlineMargin(), SurvivalStop(COSTS, 2, 12)).k_min,
            BATCH_SPECS[0].build(buildable(BATCH_SPECS[0], inputs)).k_max) == (2, 12)  # the head's range
    goodput = SourceStopSpec("confidence", "goodput").build(replace(inputs, batch_costs=COSTS))
    assert isinstance(goodput.batch_plan(), policies.BatchGoodput) and goodput.stop.costs == COSTS.batch_one()
    assert type(SourceStopSpec("confidence", "goodput").build(inputs).batch_plan()) is policies.BatchPlan


def test_a_goodput_stop_without_costs_and_an_unknown_kind_are_refused(inputs):
    with pytest.raises(ValueError, match="a head-goodput policy needs the cost model"):
        SourceStopSpec("head", "goodput", head="pre").build(PolicyInputs(heads=inputs.heads))
    with pytest.raises(ValueError, match="a margin-goodput policy needs the cost model"):
        SourceStopSpec("margin", "goodput").build(PolicyInputs())
    with pytest.raises(ValueError, match="unknown policy kind 'bogus'; valid: fixed, heuristic, .*, oracle$"):
        policy_spec("bogus")
    with pytest.raises(ValueError, match="unknown policy kind 'perfect-budget'"):
        policy_spec("perfect-budget")  # a bound decodes one prompt at a time
    with pytest.raises(ValueError, match="unknown policy kind 'adaedl-h'"):
        policy_spec("adaedl-h", 0.5)  # two parameters: a kind's flat form carries one
