"""The evaluation's registry of run families: every policy kind's traits, and what registering one checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from accept_heads.measure.families import (
    FAMILIES,
    Family,
    check_grids,
    evaluated,
    families,
    family_names,
    register_family,
    run_policy,
)
from ahconf.schema import ConfigError
from decode.policy_specs import POLICY_SPECS, FixedSpec, PolicySpec, policy_kinds, register_policy
from tests.helpers.policy_specs import BATCH_SPECS, SPECS, buildable, policy_inputs


@pytest.mark.parametrize("name", list(families()), ids=str)
def test_every_family_declares_what_the_evaluation_iterates(name, make_config):
    """A tuned family has a dev grid, its candidates read back from their flat form, a bound is never timed (its
    hindsight calls are uncounted), a perfect predictor named as the bound of a stop rule is itself a registered bound and a named stop is a league
    source's (the heads table lists a learned one's per head)."""
    family = families()[name]
    grid = family.dev_grid(make_config().evaluate_job())
    assert bool(grid) == family.tuned
    if family.runner == "decode":
        candidates = family.candidates(grid[:2], ["pre"], ["profile"])
        assert candidates and all(run_policy(c.kind, c.value, c.artifact) == c for c in candidates)
    assert not (family.bound and family.timed)
    assert family.perfect is None or families()[family.perfect].bound
    assert (family.stop is None) == (family.league is None)
    assert family.league != "learned" or family.reads == "head"


def test_the_bounds_decode_batched_and_the_sources_that_learn_along_the_prompts_one_after_another():
    """Each row of a bound reads its own hindsight (the evaluation batches its prompts); a source that learns along a
    set's prompts in order decodes them one after another."""
    bounds = family_names(bound=True)
    assert bounds and all(families()[name].rows_alone for name in bounds)
    assert not families()["margin"].rows_alone and not families()["confidence-refit"].rows_alone


def test_every_policy_kind_of_decode_has_its_traits_and_a_bound_reads_the_target_in_hindsight():
    inputs = policy_inputs()
    assert set(policy_kinds()) <= set(families())
    assert {spec.kind for spec in SPECS + BATCH_SPECS} == set(policy_kinds())
    for spec in SPECS + BATCH_SPECS:
        assert spec.build(buildable(spec, inputs)).needs_hindsight == families()[spec.kind].bound, spec
        assert families()[spec.kind].batch_only == (spec in BATCH_SPECS)


@dataclass(frozen=True)
class Twice(PolicySpec):
    kind: ClassVar[str] = "twice"


def test_a_family_is_registered_once_and_only_for_a_kind_decode_knows():
    with pytest.raises(ValueError, match="'twice' is not registered: put @register_policy under @evaluated"):
        evaluated(symbol="K")(Twice)
    register_policy(Twice)
    try:
        evaluated(color="pink")(Twice)
        assert families()["twice"].color == "pink" and family_names(runner="decode")[-1] == "twice"

        @dataclass(frozen=True)
        class Other(PolicySpec):
            kind: ClassVar[str] = "twice"

        with pytest.raises(ValueError, match="'twice' is already registered by Twice"):
            register_family(Family.of_spec(Other, "hf"))
    finally:
        del POLICY_SPECS["twice"], FAMILIES["twice"]
    assert "twice" not in families()


def test_a_kind_without_registered_traits_is_evaluated_untuned_and_alone():
    register_policy(Twice)
    try:
        assert not families()["twice"].tuned and not families()["twice"].rows_alone
    finally:
        del POLICY_SPECS["twice"]


def test_a_grid_for_a_kind_with_nothing_tuned_is_refused(make_config):
    check_grids(make_config("+evaluate.grids={confidence: [0.2]}").evaluate_job())
    with pytest.raises(ConfigError, match="evaluate.grids.heuristic: heuristic has no parameter chosen on dev"):
        check_grids(make_config("+evaluate.grids={heuristic: [1.0]}").evaluate_job())
    job = make_config("+evaluate.grids={fixed: [2.0, 5.0]}").evaluate_job()
    assert families()[FixedSpec.kind].dev_grid(job) == [2.0, 5.0]  # the config's grid over the declared one
    job = make_config("+evaluate.grids={margin-h: [0.4]}").evaluate_job()  # a kind's systematic name reads as it
    assert job.evaluate.grids == {"margin": [0.4]} and families()["margin"].dev_grid(job) == [0.4]
