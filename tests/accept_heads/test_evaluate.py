"""accept_heads.evaluate end to end on micro models, the cost fit, dev-only selection, results metadata."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from accept_heads.evaluate import evaluate
from accept_heads.evaluation.costs import fit_costs
from accept_heads.evaluation.figures import FIGURES
from accept_heads.evaluation.results import load_results
from accept_heads.evaluation.table import select
from decode import AcceptanceHead, HeadConfig, Sampling, SVProfile, rules, save_head, save_profile
from decode.head import PRE_FEATURES
from decode.hub import load_tokenizer, tokenizer_hash

from tests.accept_heads.conftest import DATA_OVERRIDES, model_overrides

EVAL_OVERRIDES = [
    "evaluate.prompts={dev: 2, test: 2, ood: 2}",
    "evaluate.max_new_tokens=8",
    "evaluate.fixed_k=[1,3]",
    "evaluate.confidence_taus=[0.4]",
    "evaluate.thresholds=[0.5,0.9]",
    "evaluate.fuzzy_thresholds=[0.1,0.6]",
    "evaluate.calibration_rows=2",
    "head.k_max=4",
]


def write_artifacts(head_dir: Path, tokenizer_path: Path) -> None:
    """A pre and a post head (random weights) and an SV profile, with the metadata training writes."""
    meta = {"draft": "micro-draft", "tokenizer_hash": tokenizer_hash(load_tokenizer(str(tokenizer_path))),
            "rule": rules.Speculative().spec(), "sampling": Sampling().to_dict(), "seed": 0, "k_min": 1, "k_max": 4,
            "threshold": 0.5, "dev_metrics": {"val/auroc": 0.5}, "train_config": {"head": {"mixing_r": 0.15}}}
    torch.manual_seed(0)
    for timing, features in (("pre", PRE_FEATURES), ("post", ())):
        (head_dir / timing).mkdir(parents=True)
        head = AcceptanceHead(HeadConfig(hidden_size=32, depth=1, timing=timing, features=features))
        save_head(head, head_dir / timing / "head.safetensors", meta)
    profile = SVProfile(x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 0.3, 0.7, 1.0]),
                        table=torch.rand(2, 3), counts=torch.full((2, 3), 30.0), latency=torch.tensor([1.0, 1.05, 1.1]))
    information = {s: {"h_a": 1.0, "h_a_given_xy": 0.6, "gain": 0.4, "gain_fraction": 0.4} for s in ("train", "dev")}
    save_profile(profile, head_dir / "profile.safetensors", {**meta, "k_max": 3, "information": information})


@pytest.fixture(scope="module")
def evaluated(make_config, micro_trio, micro_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    write_artifacts(root / "heads", micro_trio["draft"])
    config = make_config(*model_overrides(micro_trio), *DATA_OVERRIDES, *EVAL_OVERRIDES, f"paths.root={root}",
                         f"paths.data_dir={micro_root / 'tiny' / 'data'}", f"paths.head_dir={root / 'heads'}")
    return config, evaluate(config)


def test_end_to_end_writes_table_and_figures(evaluated):
    config, results = evaluated
    out = Path(config.evaluate.out_dir)
    for name in ("results.parquet", "results.csv", "results.json", "generations.parquet", "calibration.parquet"):
        assert (out / name).stat().st_size > 0
    for name in FIGURES:
        assert (out / "figures" / f"{name}.png").stat().st_size > 0, name
    table = results.table
    test = table[table["set"] == "test"]
    assert {"fixed", "heuristic", "confidence", "head", "sv", "oracle", "hf-constant", "hf-heuristic",
            "hf-confidence", "se-plain", "se-sd", "se-alternate"} <= set(test["family"])
    plain = test[test["family"] == "se-plain"]
    assert plain["speedup_plain_ensemble_cost"].tolist() == pytest.approx([1.0])  # both models once per token
    assert set(table["rule"]) == {"speculative", "greedy", "fuzzy", "ensemble"}
    assert set(table["set"]) == {"dev", "test", "builtin:module"}
    assert set(table.loc[table["family"] == "head", "artifact"]) == {"pre", "post"}
    assert (table.loc[table["family"] == "oracle", "discard_rate"] == 0).all()
    assert table["throughput_cost"].gt(0).all() and table["speedup_target_cost"].notna().all()
    assert set(test.loc[test["rule"] == "fuzzy", "rule_param"]) >= {0.1, 0.6}
    greedy_fixed = test[(test["rule"] == "greedy") & (test["family"] == "fixed")]
    assert greedy_fixed["target_agreement"].eq(1.0).all()  # the greedy rule reproduces the target's argmax
    loaded = load_results(out)
    columns = ["set", "rule", "policy", "chosen_on", "generated", "throughput_cost", "speedup_fixed_fitted"]
    pd.testing.assert_frame_equal(loaded.table[columns], results.table[columns], check_dtype=False)
    assert loaded.table["per_position_acceptance"].map(len).tolist() == results.table["per_position_acceptance"].map(len).tolist()
    assert loaded.metadata["selection_set"] == "dev"


def test_cost_fit_recovers_known_forward_times():
    rng = np.random.default_rng(0)
    draft, target = rng.integers(1, 200, 50), rng.integers(1, 60, 50)
    fit = fit_costs(draft, target, 0.0236 * draft + 0.112 * target)
    assert fit.t_draft == pytest.approx(0.0236) and fit.t_target == pytest.approx(0.112)
    assert fit.r2 == pytest.approx(1.0) and fit.n == 50
    noisy = fit_costs(draft, target, 0.0236 * draft + 0.112 * target + rng.normal(0, 0.5, 50))
    assert noisy.r2 < 1.0


def test_selection_uses_dev_rows_only():
    rows = []
    for role, best in (("dev", 2.0), ("test", 5.0)):
        for k in (1.0, 2.0, 5.0):
            rows.append({"set": role, "role": role, "rule": "greedy", "rule_param": np.nan, "family": "fixed",
                         "artifact": None, "param": k, "throughput": 10.0 if k == best else 1.0})
    (choice,) = select(pd.DataFrame(rows), "throughput")
    assert (choice.value, choice.chosen_on, choice.dev_throughput) == (2.0, "dev", 10.0)


def test_chosen_values_come_from_dev_and_are_applied_to_test(evaluated):
    _, results = evaluated
    table = results.table
    dev = table[table["role"] == "dev"]
    for choice in results.metadata["selection"]:
        assert choice["chosen_on"] == "dev"
        rows = dev[(dev["rule"] == choice["rule"]) & (dev["family"] == choice["family"])]
        if choice["artifact"] is not None:
            rows = rows[rows["artifact"] == choice["artifact"]]
        if choice["rule_param"] is not None:
            rows = rows[rows["rule_param"] == choice["rule_param"]]
        assert rows["throughput_cost"].max() == pytest.approx(choice["dev_throughput"])
        assert rows.loc[rows["chosen_on"] == "dev", "param"].tolist() == [choice["value"]]
    applied = table[(table["role"] != "dev") & table["family"].isin(["fixed", "confidence", "head"])]
    assert (applied["chosen_on"] == "dev").all()
    picked = {(c["rule"], c["family"], c["artifact"]): c["value"] for c in results.metadata["selection"]}
    for _, row in applied[applied["rule"] != "fuzzy"].iterrows():
        assert picked[(row["rule"], row["family"], row["artifact"])] == row["param"]
    hf = table[table["family"] == "hf-constant"]
    assert set(hf["rule"]) == {"speculative", "greedy"} and (hf["chosen_on"] == "dev").all()
    for _, row in hf.iterrows():  # HF's constant schedule runs at the K chosen on dev for our decoder
        assert picked[(row["rule"], "fixed", None)] == row["param"]
    assert {"fixed", "confidence", "head"} <= {c["family"] for c in results.metadata["selection"]}


def test_results_carry_metadata(evaluated, micro_trio):
    config, results = evaluated
    meta = results.metadata
    assert meta["models"]["draft"]["id"] == str(micro_trio["draft"]) and meta["models"]["tokenizer_hash"]
    assert set(meta["heads"]) == {"pre", "post"} and meta["heads"]["pre"]["timing"] == "pre"
    assert meta["heads"]["post"]["path"].endswith("post/head.safetensors")
    assert set(meta["profiles"]) == {"profile"} and len(meta["profiles"]["profile"]["table"]) == 2
    assert meta["seed"] == config.seed and "seeding" in meta
    sets = {s["name"]: s for s in meta["sets"]}
    assert (sets["dev"]["split"], sets["test"]["split"], sets["builtin:module"]["role"]) == ("dev", "test", "ood")
    assert all(s["count"] == 2 and len(s["prompt_ids"]) == 2 for s in sets.values())
    assert meta["cost"] == {"t_draft": 0.0236, "t_target": 0.112} and meta["cost_fit"]["n"] > 0
    assert set(results.calibration["head"]) == {"pre", "post"}


def test_help_lists_the_evaluate_group(repo_root):
    result = subprocess.run([sys.executable, "-m", "accept_heads.evaluate", "--help"], cwd=repo_root,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "evaluate:" in result.stdout and "fixed_k:" in result.stdout  # the evaluate config is listed
