"""The evaluation's batch axis: every policy at every batch size, the fixed K chosen per batch size on dev."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

from accept_heads.evaluate import evaluate
from accept_heads.evaluation.batch_axis import best_fixed_k, summarise
from accept_heads.evaluation.results import load_results
from accept_heads.measure.families import family_names
from decode.batch_costs import BatchCosts
from tests.helpers.evaluation import evaluation_config


@pytest.fixture(scope="module")
def axis_run(make_config, micro_trio, micro_root, tmp_path_factory):
    """The config, a copy of it taken before the evaluation, and the evaluation's results."""
    root = tmp_path_factory.mktemp("batch-axis")
    config = evaluation_config(make_config, micro_trio, root, "evaluate.rules=[speculative,greedy]",
                               "decoding.prompts={dev: 3, test: 3, ood: 1}", "evaluate.hf.baselines=false",
                               "evaluate.calibration_rows=0", "evaluate.batch_axis.sizes=[1,2]",
                               "evaluate.batch_axis.prompts=3")
    before = copy.deepcopy(config)
    return config, before, evaluate(config.evaluate_job())


@pytest.fixture(scope="module")
def axis(axis_run):
    config, _, results = axis_run
    return config, results


def test_the_evaluation_never_writes_into_its_config(axis_run):
    """The fixed-K grid grown on dev is the evaluation's plan's (decoded and recorded), never its config's."""
    config, before, results = axis_run
    assert asdict(config) == asdict(before)
    assert config.evaluate.grids["fixed"] == [1.0, 3.0]
    assert results.metadata.dev_grids["fixed"][:2] == [1.0, 3.0] and len(results.metadata.dev_grids["fixed"]) > 2


def test_every_policy_is_measured_and_modelled_at_every_batch_size(axis):
    config, results = axis
    table = results.batch_axis
    test = table[table["role"] == "test"]
    # every registered serving policy (no bound); the heads and the profile were fitted for the speculative rule
    speculative = {"target", *family_names(runner="decode", bound=False)}
    assert {"fixed", "heuristic", "confidence", "margin-goodput", "head", "head-goodput", "sv"} <= speculative
    for batch in (1, 2):
        at = test[test["batch"] == batch]
        assert set(at.loc[at["rule"] == "speculative", "family"]) == speculative
        heads = {"head", "head-goodput", "head-budget", "head-online", "head-online-goodput", "head-online-budget"}
        assert set(at.loc[at["rule"] == "greedy", "family"]) == speculative - heads - {"sv"}
        assert set(at.loc[at["family"] == "head", "artifact"]) == {"pre", "post"}
    assert (test["rows"] == 3).all()  # every run decodes the same 3 prompts (at B=2: a batch of 2, then 1)
    assert (test["tokens_per_s"] > 0).all() and (test["modelled_s"] > 0).all()
    assert test["modelled_tokens_per_s"].tolist() == pytest.approx((test["tokens"] / test["modelled_s"]).tolist())
    assert test.loc[test["family"] == "target", "x_target"].tolist() == pytest.approx([1.0] * 4)
    assert (test.loc[test["family"] == "sv", "companion_calls"] > 0).all()
    sv = test[test["family"] == "sv"]  # drafting the profile's k_max, and the fixed K chosen at that B
    fixed_k = test[(test["family"] == "fixed") & (test["rule"] == "speculative")].set_index("batch")["param"]
    for batch, group in sv.groupby("batch"):
        assert sorted(group["param"].fillna(0).tolist()) == [0.0, fixed_k[batch]]
    greedy_fixed = test[(test["rule"] == "greedy") & (test["family"].isin(["fixed", "confidence"]))]
    assert greedy_fixed.groupby(["family", "param"])["tokens"].nunique().eq(1).all()  # rows decide as alone
    loaded = load_results(config.evaluate.out_dir).batch_axis
    pd.testing.assert_frame_equal(loaded, table, check_dtype=False)
    assert (Path(config.evaluate.out_dir) / "figures" / "batch_axis.png").stat().st_size > 0
    meta = results.metadata.batch_axis
    assert meta.batch_sizes == [1, 2] and len(meta.batch_costs.companion) == 2  # SV's companion priced


def test_the_batch_costs_are_the_machines_stored_table_recorded_with_the_run(axis):
    _, results = axis
    axis_meta = results.metadata.batch_axis
    source = axis_meta.batch_costs_source
    stored = json.loads(Path(source.path).read_text())
    assert BatchCosts.from_dict(stored["costs"]) == axis_meta.batch_costs and stored["key"] == source.key
    assert source.key["batches"] == [1, 2] and source.key["models"]["target"]["id"]


def test_the_fixed_k_of_each_batch_size_is_the_dev_grids_best(axis):
    _, results = axis
    table = results.batch_axis
    dev = table[(table["role"] == "dev") & (table["family"] == "fixed")]
    grid = results.metadata.dev_grids["fixed"]  # the main evaluation's grid, grown past an edge choice
    assert set(dev["param"]) == set(map(float, grid)) and {1, 3} <= set(grid) and set(dev["batch"]) == {1, 2}
    for (rule, batch), group in dev.groupby(["rule", "batch"]):
        best = group.sort_values(["modelled_tokens_per_s", "param"], ascending=[False, True]).iloc[0]["param"]
        chosen = table[(table["role"] == "test") & (table["rule"] == rule) & (table["batch"] == batch)
                       & (table["family"] == "fixed")]
        assert chosen["param"].tolist() == [best] and chosen["chosen_on"].tolist() == ["dev"]
        assert chosen["x_best_fixed_k"].tolist() == pytest.approx([1.0])


def record(rule: str, family: str, k: float | None, batch: int, tokens: int, modelled_s: float, role: str = "dev",
           chosen_on: str = "grid") -> dict:
    return {"set": role, "role": role, "rule": rule, "rule_param": None, "family": family, "artifact": None,
            "param": k, "policy": f"{family}({k})", "chosen_on": chosen_on, "batch": batch, "rows": 2,
            "tokens": tokens, "wall_s": 1.0, "modelled_s": modelled_s, "target_calls": 1, "draft_calls": 1,
            "companion_calls": 0}


def test_best_fixed_k_maximises_modelled_throughput_per_rule_and_batch_size_ties_to_the_smaller_k():
    records = pd.DataFrame([
        record("speculative", "fixed", 1.0, 1, 10, 1.0), record("speculative", "fixed", 3.0, 1, 20, 1.0),
        record("speculative", "fixed", 1.0, 8, 30, 1.0), record("speculative", "fixed", 3.0, 8, 15, 0.5),  # a tie
        record("greedy", "fixed", 1.0, 1, 10, 1.0), record("greedy", "fixed", 3.0, 1, 10, 2.0),
    ])
    assert best_fixed_k(records) == {("speculative", 1): 3.0, ("speculative", 8): 1.0, ("greedy", 1): 1.0}


def test_ratios_compare_rows_of_the_same_rule_and_batch_size_only():
    records = pd.DataFrame([
        record("speculative", "target", None, 1, 10, 1.0, "test", ""), record("speculative", "fixed", 2.0, 1, 15, 1.0,
                                                                             "test", "dev"),
        record("speculative", "target", None, 8, 40, 1.0, "test", ""), record("speculative", "fixed", 2.0, 8, 20, 1.0,
                                                                             "test", "dev"),
        record("speculative", "sv", None, 8, 30, 1.0, "test", ""),
    ])
    table = summarise(records).set_index(["family", "batch"])
    assert table.loc[("fixed", 1), "x_target"] == pytest.approx(1.5)
    assert table.loc[("fixed", 8), "x_target"] == pytest.approx(0.5)
    assert table.loc[("sv", 8), "x_best_fixed_k"] == pytest.approx(1.5)
    assert table.loc[("sv", 8), "x_target_measured"] == pytest.approx(30 / 40)
