"""accept_heads.evaluate end to end on micro models, the cost fit, dev-only selection, results metadata."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from accept_heads.evaluate import cost_tuples, evaluate
from accept_heads.evaluation.choice import Choice
from accept_heads.evaluation.evaluation_plan import plan_evaluation
from accept_heads.evaluation.executor import Executor, runners
from accept_heads.evaluation.figures import BEST_FREE, FIGURES, REFERENCE, draw_league, source_family
from accept_heads.evaluation.h_choice import recorded_runs, sweep_settings
from accept_heads.evaluation.plan import dev_sweeps, edge_note, edge_rules, extended_k
from accept_heads.evaluation.report import cost_lines, heads_table, league_table
from accept_heads.evaluation.results import load_results
from accept_heads.evaluation.table import add_comparisons, at_dev_choice, bound_rows, select
from accept_heads.measure.cost_models import CostFit, configured_model, fit_costs, pricing
from accept_heads.measure.costing import KEYS, add_costs, aggregate, verification_units
from accept_heads.measure.families import family_names, perfect_for, run_policy
from accept_heads.measure.inputs import Artifacts
from accept_heads.measure.runs import RunSpec
from accept_heads.measure.specs import SEAlternateSpec, TargetAloneSpec
from ahconf.schema import CostConfig
from decode import DecodeStats, Sampling, policies
from decode.artifacts.gguf import file_sha256
from decode.artifacts.hub import load_causal_lm
from decode.artifacts.serialization import load_head, save_head
from decode.artifacts.threshold_choice import ThresholdChoice, choice_path
from decode.costs import CostModel, LatencyShape, SourcePrice
from decode.policy_specs import SourceStopSpec, SVSpec, policy_kinds, policy_spec
from tests.helpers.config import DATA_OVERRIDES, EVAL_OVERRIDES, model_overrides
from tests.helpers.evaluation import evaluation_config, write_artifacts


@pytest.fixture(scope="module")
def evaluated(make_config, micro_trio, micro_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    write_artifacts(root / "heads", micro_trio["draft"])
    config = make_config(*model_overrides(micro_trio), *DATA_OVERRIDES, *EVAL_OVERRIDES, f"paths.root={root}",
                         f"paths.data_dir={micro_root / 'tiny' / 'data'}", f"paths.head_dir={root / 'heads'}",
                         "evaluate.wallclock.sets=[test]", "evaluate.wallclock.rules=[speculative]",
                         "evaluate.wallclock.threads=1")
    return config, evaluate(config.evaluate_job())


def test_worker_processes_decode_the_same_generations_as_one_process(make_config, micro_trio, micro_root,
                                                                     tmp_path_factory):
    def run(workers: int) -> pd.DataFrame:
        root = tmp_path_factory.mktemp(f"workers{workers}")
        config = evaluation_config(make_config, micro_trio, root, "evaluate.rules=[speculative]",
                                   "evaluate.hf.baselines=false", "evaluate.figures=false",
                                   "evaluate.calibration_rows=0", f"evaluate.workers={workers}")
        results = evaluate(config.evaluate_job())
        assert results.metadata.workers == workers
        return results.generations.drop(columns=["wall_s"])

    one, two = run(1), run(2)
    assert {"fixed", "head", "head-goodput", "sv"} <= set(one["family"])
    pd.testing.assert_frame_equal(one, two)


def test_batched_prompts_decode_the_same_generations_as_alone(make_config, micro_trio, micro_root, tmp_path_factory):
    """Batching changes the wall-clock columns only; the first ``timed_prompts`` decode alone (the cost fit's); the
    bounds batch like the rest (each row reads its own hindsight), SV plans its batch jointly and decodes alone."""
    def run(batch_size: int) -> pd.DataFrame:
        root = tmp_path_factory.mktemp(f"batch{batch_size}")
        config = evaluation_config(make_config, micro_trio, root, "evaluate.rules=[speculative]",
                                   "decoding.prompts={dev: 5, test: 2, ood: 1}", "evaluate.hf.baselines=false",
                                   "evaluate.figures=false", "evaluate.calibration_rows=0",
                                   f"decoding.batch_size={batch_size}", "decoding.timed_prompts=1")
        return evaluate(config.evaluate_job()).generations

    alone, batched = run(1), run(3)
    assert set(alone["batch"]) == {1}
    dev = batched[batched["set"] == "dev"]
    batched_kinds = ["fixed", "head", "head-goodput", "oracle", "perfect", "perfect-goodput"]  # the bounds' rows too
    assert set(dev.loc[dev["family"].isin(batched_kinds), "batch"]) == {1, 3}
    assert set(dev.loc[dev["family"] == "sv", "batch"]) == {1}  # alone
    pd.testing.assert_frame_equal(alone.drop(columns=["wall_s", "batch"]), batched.drop(columns=["wall_s", "batch"]))


def test_the_results_are_written_and_load_back_as_they_were(evaluated):
    config, results = evaluated
    out = Path(config.evaluate.out_dir)
    for name in ("results.parquet", "results.csv", "results.json", "generations.parquet", "calibration.parquet"):
        assert (out / name).is_file(), name
    loaded = load_results(out)
    columns = ["set", "rule", "policy", "chosen_on", "generated", "throughput_cost", "speedup_fixed_fitted"]
    pd.testing.assert_frame_equal(loaded.table[columns], results.table[columns], check_dtype=False)
    assert (loaded.table["per_position_acceptance"].map(len).tolist()
            == results.table["per_position_acceptance"].map(len).tolist())
    assert loaded.metadata.selection_set == "dev"


def test_every_figure_is_a_drawn_image(evaluated):
    """Each figure is a PNG with data drawn on it: a real size, and coloured marks (empty axes, their ticks and
    labels are grey)."""
    from matplotlib.image import imread

    config, _ = evaluated
    for name in (n for n in FIGURES if n != "batch_axis"):  # no batch axis here: tests/accept_heads/test_batch_axis.py
        rgb = imread(Path(config.evaluate.out_dir) / "figures" / f"{name}.png")[..., :3]
        assert min(rgb.shape[:2]) >= 200, name
        saturated = (rgb.max(-1) - rgb.min(-1)) > 0.25
        assert saturated.sum() >= 100, name


def league_panels(figure) -> dict[str, list[tuple[str, str, float, bool]]]:
    """Per panel title, its entries top to bottom: (reference or family, policy, drawn × best fixed K, marked the best
    training-free source); the reference's label names it before its policy, a family's is its best run's policy."""
    panels = {}
    mark = f" ({BEST_FREE})"
    for ax in figure.axes:
        labels = [text.get_text() for text in ax.get_yticklabels()]
        entries = [(*label.split(": "), False) if ": " in label else
                   (source_family(re.split(r"[\[(]", label)[0]), label.removesuffix(mark), label.endswith(mark))
                   for label in labels]
        points = [float(container.lines[0].get_xdata()[0]) for container in ax.containers]
        panels[ax.get_title()] = [(entry, policy, x, free) for (entry, policy, free), x in zip(entries, points,
                                                                                             strict=True)]
    return panels


def test_the_league_figure_draws_each_familys_best_below_the_best_fixed_k(evaluated):
    """Per rule and held-out set, the best fixed K, then one entry per league family in the results (learned first):
    its best source × stop on dev at its dev choice, drawn at its × best fixed K, the best training-free source marked
    on its family's entry (drawn once); a family the results lack is not drawn."""
    _, results = evaluated
    table = results.table
    league = family_names(league="learned") + family_names(league="training-free")
    panels = league_panels(draw_league(results))
    held_out = set(table.loc[table["role"] != "dev", "set"])
    assert len(panels) == len(held_out) * table["rule"].nunique()  # per rule and held-out set
    assert {title.split(" ")[0] for title in panels} == set(table["rule"])

    rule = table["rule"] == "speculative"
    dev = table[rule & (table["role"] == "dev") & at_dev_choice(table) & table["family"].isin(league)]
    best = dev.loc[dev.groupby(dev["family"].map(source_family))["throughput_cost"].idxmax()]
    chosen = dict(zip(best["family"].map(source_family), best["policy"]))  # family → its best run on dev
    families = [name for name in dict.fromkeys(map(source_family, league)) if name in chosen]  # learned first
    assert {"head", "head-online", "margin", "vllm", "confidence"} <= set(families)
    entries = panels["speculative — test"]
    assert [entry for entry, _, _, _ in entries] == [REFERENCE, *families]
    test = table[rule & (table["set"] == "test")].set_index("policy")
    for entry, policy, x, _ in entries[1:]:
        assert policy == chosen[entry], entry
        assert x == pytest.approx(test.loc[policy, "speedup_fixed_cost"])
    assert entries[0][1:3] == (test.index[(test["family"] == "fixed") & (test["chosen_on"] == "dev")].item(),
                               pytest.approx(1.0))  # the best fixed K against itself
    free = best[best["family"].isin(family_names(league="training-free"))]
    best_free = source_family(free.loc[free["throughput_cost"].idxmax(), "family"])
    assert [entry for entry, _, _, marked in entries if marked] == [best_free]

    without = replace(results, table=table[table["family"].map(source_family) != "head-online"])
    drawn = {entry for rows in league_panels(draw_league(without)).values() for entry, _, _, _ in rows}
    assert "head-online" not in drawn and {"head", REFERENCE} <= drawn


def test_the_table_covers_every_family_rule_set_and_head(evaluated):
    _, results = evaluated
    table = results.table
    assert {"fixed", "heuristic", "confidence", "head", "head-goodput", "sv", "oracle", "hf-constant", "hf-heuristic",
            "hf-confidence", "se-plain", "se-sd", "se-alternate"} <= set(table.loc[table["set"] == "test", "family"])
    assert set(table["rule"]) == {"speculative", "greedy", "fuzzy", "ensemble"}
    assert set(table["set"]) == {"dev", "test", "builtin:module"}
    assert set(table.loc[table["family"] == "head", "artifact"]) == {"pre", "post"}
    assert set(table.loc[(table["set"] == "test") & (table["rule"] == "fuzzy"), "rule_param"]) >= {0.1, 0.6}


def test_the_tables_figures_keep_their_identities(evaluated):
    _, results = evaluated
    table = results.table
    test = table[table["set"] == "test"]
    plain = test[test["family"] == "se-plain"]
    assert plain["speedup_plain_ensemble_cost"].tolist() == pytest.approx([1.0])  # both models once per token
    greedy_oracle = table[(table["family"] == "oracle") & (table["rule"] == "greedy")]
    assert len(greedy_oracle) and (greedy_oracle["discard_rate"] == 0).all()
    assert table["throughput_cost"].gt(0).all() and table["speedup_target_cost"].notna().all()
    greedy_fixed = test[(test["rule"] == "greedy") & (test["family"] == "fixed")]
    assert greedy_fixed["target_agreement"].eq(1.0).all()  # the greedy rule reproduces the target's argmax


def test_the_wall_clock_times_the_chosen_methods_beside_their_modelled_figures(evaluated):
    config, results = evaluated
    wall = results.wallclock
    assert set(wall["family"]) == {"target", "fixed", "head", "head-goodput", "head-online", "head-online-goodput",
                                   "confidence", "confidence-h", "confidence-goodput", "adaedl", "hf-constant",
                                   "hf-heuristic"}
    assert set(wall["set"]) == {"test"} and set(wall["rule"]) == {"speculative"}
    ours = wall[wall["family"] != "target"]
    assert ours["matches"].eq(1.0).all()  # every timed output is its counted run's
    timed_set = results.generations[results.generations["set"] == "test"]
    assert timed_set["batch"].eq(1).all()  # whose runs decoded the timed prompts alone (no batched rounding)
    assert ours["speedup_fixed_cost"].notna().all() and (wall["tokens_per_s"] > 0).all()
    target = wall[wall["family"] == "target"]
    assert target[["x_target", "x_target_lo", "x_target_hi"]].to_numpy().tolist() == [[1.0, 1.0, 1.0]]
    timings = load_results(config.evaluate.out_dir).wallclock_timings
    assert len(timings) == len(wall) * 2 and set(timings["turn"]) == set(range(len(wall)))
    assert results.metadata.wallclock.batch == 1


def test_comparisons_carry_paired_bootstrap_intervals(evaluated):
    _, results = evaluated
    table = results.table
    compared = table[table["speedup_fixed_cost"].notna() & table["set"].eq("test")]
    low, high = compared["speedup_fixed_cost_lo"], compared["speedup_fixed_cost_hi"]
    assert low.notna().all() and (low <= compared["speedup_fixed_cost"] + 1e-9).all()
    assert (compared["speedup_fixed_cost"] <= high + 1e-9).all()
    reference = compared[(compared["family"] == "fixed") & (compared["chosen_on"] == "dev")]
    assert np.allclose(reference[["speedup_fixed_cost_lo", "speedup_fixed_cost_hi"]].to_numpy(), 1.0)
    oracle = table[(table["family"] == "oracle") & table["oracle_gap_share_cost"].notna()]
    assert np.allclose(oracle[["oracle_gap_share_cost_lo", "oracle_gap_share_cost_hi"]].to_numpy(), 1.0)
    for family in ("perfect", "perfect-goodput"):  # each perfect predictor is its own stop rule's bound
        rows = compared[(compared["family"] == family) & compared["perfect_gap_share_cost"].notna()]
        assert np.allclose(rows[["perfect_gap_share_cost_lo", "perfect_gap_share_cost_hi"]].to_numpy(), 1.0)


def test_the_league_compares_each_source_with_the_best_training_free_one_chosen_on_dev(evaluated):
    """Per rule, the training-free family with the best dev throughput at its dev choice is every set's reference:
    its own rows compare at 1 (interval included), a head's at its throughput over the reference's; the league table
    prints each source with its side."""
    _, results = evaluated
    table = results.table[results.table["rule"] == "speculative"]
    free = table["family"].isin(family_names(league="training-free")) & at_dev_choice(table)
    dev = table[free & (table["role"] == "dev")]
    best = dev.loc[dev["throughput_cost"].idxmax(), "family"]
    assert dev["family"].nunique() == len(family_names(league="training-free", batch_only=False))
    test = table[(table["set"] == "test") & at_dev_choice(table)]
    reference = test[test["family"] == best]
    assert len(reference) == 1
    assert np.allclose(reference[["speedup_free_cost", "speedup_free_cost_lo", "speedup_free_cost_hi"]], 1.0)
    heads = test[test["family"].isin(family_names(league="learned"))]
    assert len(heads) and np.allclose(heads["speedup_free_cost"],
                                      heads["throughput_cost"] / reference["throughput_cost"].iloc[0])
    assert (heads["speedup_free_cost_lo"] <= heads["speedup_free_cost"] + 1e-9).all()
    console = Console(width=240, record=True)
    console.print(league_table(results.table, results.metadata.cost_models["cost"].caption))
    printed = console.export_text()
    assert "training-free (best, dev)" in printed and "learned" in printed and "margin-goodput" in printed


def test_the_heads_table_names_each_rows_source_and_stop(evaluated):
    """A head's rows under its stops are told apart from the same head recalibrated per request (head-online)."""
    _, results = evaluated
    console = Console(width=400, record=True)
    console.print(heads_table(results.table, results.metadata.heads, results.metadata.cost_models["cost"].caption))
    lines = [line for line in console.export_text().splitlines() if line.startswith("│ pre ") and " test " in line]
    stops = [line.split("│")[5].strip() for line in lines]
    assert len(stops) == len(set(stops)) == 4  # per set: head and head-online, each under h and goodput
    assert {s.split(",")[0] for s in stops} == {"head", "head-online"}


def test_each_sources_estimates_are_scored_against_the_outcomes_decoding_observed(evaluated):
    """Every league source with an estimate (SVIP has none) is scored on dev and test; the scored candidates are the
    ones verification observed: per generation, the offers summed over positions (a post head reads no estimate
    of a round's last candidate at k_max: the draft consumes it with the next round's first token)."""
    _, results = evaluated
    scored = results.source_calibration
    speculative = scored[scored["rule"] == "speculative"]
    expected = set(family_names(league="learned", batch_only=False)
                   + family_names(league="training-free", batch_only=False)) - {"svip"}
    for role in ("dev", "test"):
        assert set(speculative.loc[speculative["role"] == role, "family"]) == expected, role
    assert scored[["ece", "brier", "mean_estimate", "accept_rate"]].apply(lambda c: c.between(0, 1)).all().all()
    generations = results.generations
    runs = generations[generations["family"].isin(expected) & (generations["role"] == "test")]
    for _, generation in runs.iterrows():
        scored, offered = len(generation["estimates"]), sum(generation["position_offered"])
        assert scored == len(generation["estimate_outcomes"]) and scored > 0, generation["policy"]
        if generation["artifact"] == "post":
            assert scored <= offered and sum(generation["estimate_outcomes"]) <= sum(generation["position_accepted"])
        else:
            assert scored == offered and sum(generation["estimate_outcomes"]) == sum(generation["position_accepted"])
    assert not len(generations.loc[generations["family"] == "fixed", "estimates"].map(len).loc[lambda n: n > 0])


def test_every_rule_has_both_bounds_and_the_heads_share_of_each_gap(evaluated):
    """The realised oracle and the perfect predictors decode every rule on every set; they are left out of the
    cost fit (their hindsight calls are uncounted); each head row carries its share of both gaps."""
    config, results = evaluated
    table = results.table
    for rule in ("speculative", "greedy", "fuzzy", "ensemble"):
        for set_name in ("test", "builtin:module"):
            rows = table[(table["rule"] == rule) & (table["set"] == set_name) & (table["chosen_on"] != "grid")]
            assert {"oracle", "perfect", "perfect-goodput"} <= set(rows["family"]), (rule, set_name)
    oracle = table[(table["family"] == "oracle") & (table["rule"] != "ensemble")]
    assert (oracle["discard_rate"] == 0).all()  # its own draws: nothing verified is rejected
    heads = table[table["family"].isin(["head", "head-goodput"]) & (table["chosen_on"] != "grid")
                  & (table["role"] != "dev")]
    assert len(heads)
    for _, head in heads.iterrows():  # which gaps are open depends on the device's draws: each share where it is
        param = table["rule_param"].isna() if pd.isna(head["rule_param"]) else table["rule_param"] == head["rule_param"]
        same = table[(table["set"] == head["set"]) & (table["rule"] == head["rule"]) & param]
        fixed = same.loc[(same["family"] == "fixed") & (same["chosen_on"] == "dev"), "throughput_cost"].iloc[0]
        for column, bound in (("perfect_gap_share_cost", perfect_for()[head["family"]]),
                              ("oracle_gap_share_cost", "oracle")):
            gap = same.loc[bound_rows(same, bound), "throughput_cost"].iloc[0] - fixed
            expected = (head["throughput_cost"] - fixed) / gap if gap > 0 else np.nan
            assert head[column] == pytest.approx(expected, nan_ok=True), (column, head["set"], head["rule"])
    fitted = cost_tuples(results.generations)
    assert len(fitted) and not fitted["family"].isin(["oracle", "perfect", "perfect-goodput"]).any()


def test_every_registered_policy_kind_is_swept_tabled_and_drawn(evaluated):
    """The registry is the list: each kind has rows for the rule its artifacts were fitted for, on dev and test,
    and a line in the Pareto figure."""
    _, results = evaluated
    table = results.table[results.table["rule"] == "speculative"]
    batch_only = set(family_names(batch_only=True))
    assert batch_only and not table["family"].isin(batch_only).any()  # the batch axis decodes those
    for kind in set(policy_kinds()) - batch_only:
        assert {"dev", "test"} <= set(table.loc[table["family"] == kind, "role"]), kind
    pareto = FIGURES["pareto"](results)  # each family's best run: labelled by its policy, e.g. head-goodput[pre]
    drawn = {source_family(re.split(r"[\[(]", text.get_text())[0]) for ax in pareto.axes if ax.get_legend()
             for text in ax.get_legend().get_texts()}
    assert {source_family(kind) for kind in set(policy_kinds()) - batch_only} <= drawn


def test_each_head_is_measured_against_the_perfect_predictor_with_its_own_stop_rule():
    rows = [("fixed", "dev", 10.0), ("fixed", "grid", 9.0), ("head", "dev", 12.0), ("head-goodput", "", 11.0),
            ("perfect", "grid", 30.0), ("perfect", "dev", 14.0), ("perfect-goodput", "", 20.0), ("oracle", "", 15.0),
            ("heuristic", "", 8.0)]
    table = pd.DataFrame([{"set": "test", "role": "test", "rule": "speculative", "rule_param": np.nan, "family": family,
                           "chosen_on": chosen_on, "throughput_cost": throughput}
                          for family, chosen_on, throughput in rows])
    add_comparisons(table, "cost")
    share = dict(zip(table["family"] + "/" + table["chosen_on"], table["perfect_gap_share_cost"]))
    assert share["head/dev"] == pytest.approx(0.5)  # (12 − 10) / (14 − 10): the dev-chosen perfect threshold
    assert share["head-goodput/"] == pytest.approx(0.1)  # (11 − 10) / (20 − 10)
    assert share["perfect/dev"] == pytest.approx(1.0) and share["perfect-goodput/"] == pytest.approx(1.0)
    assert np.isnan(share["heuristic/"]) and np.isnan(share["fixed/dev"])
    oracle = dict(zip(table["family"] + "/" + table["chosen_on"], table["oracle_gap_share_cost"]))
    assert oracle["head/dev"] == pytest.approx(0.4) and oracle["heuristic/"] == pytest.approx(-0.4)


#: A latency shape that grows with the verified length L (L = 1..4, extrapolated beyond).
GROWING = LatencyShape((1.0, 1.2, 1.5, 1.9))


def generation(run: int, draft_calls: int, companion_calls: int, verified_per_round: list[int],
               wall_s: float, source_key: str | None = None, source_calls: int = 0, source_updates: int = 0) -> dict:
    """A per-generation record of our decoder, as :meth:`accept_heads.measure.runs.Generation.record` builds it."""
    keys = dict.fromkeys(KEYS, None) | {"set": "dev", "role": "dev", "split": "dev", "rule": "greedy",
                                        "family": "fixed", "param": float(run), "chosen_on": "grid",
                                        "policy": f"run{run}", "source": "decode"}
    rounds = len(verified_per_round)
    return {**keys, "generated": rounds + 1, "target_calls": rounds, "draft_calls": draft_calls,
            "companion_calls": companion_calls, "drafted": sum(verified_per_round), "accepted": 1, "discarded": 0,
            "rounds": rounds, "verified": sum(verified_per_round), "verified_per_round": verified_per_round,
            "position_offered": [1], "position_accepted": [1], "wall_s": wall_s, "batch": 1,
            "source_key": source_key, "source_calls": source_calls, "source_updates": source_updates,
            "target_agreement": np.nan, "target_nll": np.nan}


def test_cost_fit_recovers_draft_companion_and_target_times():
    rng = np.random.default_rng(0)
    truth = CostModel(t_draft=0.0236, t_target=0.112, t_companion=0.04, latency=GROWING)
    records = []
    for run in range(40):
        lengths = rng.integers(0, 7, rng.integers(3, 30)).tolist()  # beyond the table's L = 4 too
        draft, companion = int(rng.integers(1, 200)), int(rng.integers(1, 80)) if run % 2 else 0
        seconds = float(truth.times(draft, companion, GROWING.units(np.bincount(lengths))))
        records += [generation(run, draft, companion, lengths, seconds)] * 2  # two prompts per run
    table = aggregate(pd.DataFrame(records))
    assert table["verified"].tolist() == [2 * sum(r["verified_per_round"]) for r in records[::2]]
    fit = fit_costs(table["draft_calls"], table["companion_calls"], verification_units(table, GROWING), table["wall_s"])
    assert (fit.t_draft, fit.t_companion, fit.t_target) == pytest.approx((0.0236, 0.04, 0.112))
    assert fit.r2 == pytest.approx(1.0) and (fit.n, fit.companion_runs) == (40, 20)
    noisy = table["wall_s"] + rng.normal(0, 0.5, len(table))
    fit = fit_costs(table["draft_calls"], table["companion_calls"], verification_units(table, GROWING), noisy)
    residual = noisy - fit.model(GROWING).times(table["draft_calls"], table["companion_calls"],
                                                verification_units(table, GROWING))
    assert fit.r2 == pytest.approx(1 - (residual**2).sum() / (noisy**2).sum())  # uncentred: about zero
    assert fit.r2 < 1.0


def test_companion_calls_are_charged_t_companion_not_t_draft():
    table = aggregate(pd.DataFrame([generation(0, draft_calls=10, companion_calls=5, verified_per_round=[2, 2, 2],
                                               wall_s=1.0)]))
    add_costs(table, "x", CostModel(t_draft=0.01, t_target=0.1, t_companion=0.5))
    assert table["throughput_x"].iloc[0] == pytest.approx(4 / (10 * 0.01 + 5 * 0.5 + 3 * 0.1))


def test_each_runs_source_is_charged_its_own_price_per_call_and_per_folded_round():
    table = aggregate(pd.DataFrame([
        generation(0, draft_calls=10, companion_calls=0, verified_per_round=[2, 2, 2], wall_s=1.0),
        generation(1, draft_calls=10, companion_calls=0, verified_per_round=[2, 2, 2], wall_s=1.0,
                   source_key="head[x]", source_calls=6, source_updates=0),
        generation(2, draft_calls=10, companion_calls=0, verified_per_round=[2, 2, 2], wall_s=1.0,
                   source_key="margin", source_calls=6, source_updates=3)]))
    prices = {"head[x]": SourcePrice(estimate=0.004), "margin": SourcePrice(estimate=0.001, update=0.02)}
    model = CostModel(t_draft=0.01, t_target=0.1, t_companion=0.0).with_sources(prices)
    add_costs(table, "x", model)
    base = 10 * 0.01 + 3 * 0.1
    assert table["throughput_x"].tolist() == pytest.approx([4 / base, 4 / (base + 6 * 0.004),
                                                            4 / (base + 6 * 0.001 + 3 * 0.02)])
    add_costs(table, "free", CostModel(t_draft=0.01, t_target=0.1, t_companion=0.0))  # negative control
    assert table["throughput_free"].tolist() == pytest.approx([4 / base] * 3)


def test_the_target_alone_is_priced_at_its_own_step_not_at_a_verification_call():
    """× target alone divides by the target's decoding step (the paper's 0.108 s), not by t_t = 0.112 s, the price of
    a call that verifies a candidate (one more token): at t_t the speed-up would read 3.7 % high. The fitted model
    prices it at the fitted t_t times the measured one-token / verification forward ratio."""
    table = aggregate(pd.DataFrame([generation(0, draft_calls=10, companion_calls=0, verified_per_round=[2, 2, 2],
                                               wall_s=1.0)]))
    paper = configured_model(CostConfig(), companion_ratio=None)
    assert (paper.t_target, paper.target_alone) == (0.112, 0.108)
    add_costs(table, "cost", paper)
    throughput = 4 / (10 * 0.0236 + 3 * 0.112)
    assert table["throughput_cost"].iloc[0] == pytest.approx(throughput)
    assert table["speedup_target_cost"].iloc[0] == pytest.approx(throughput * 0.108)
    fit = CostFit(t_draft=0.001, t_companion=0.0, t_target=0.01, r2=1.0, n=3, companion_runs=0)
    assert fit.model(GROWING, alone_ratio=0.9).target_alone == pytest.approx(0.009)
    assert configured_model(CostConfig(t_target_alone=None), None).target_alone == 0.112  # null: t_t, as labelled


def test_shorter_verification_is_cheaper_when_latency_grows_with_length():
    def stats(verified: int) -> DecodeStats:
        s = DecodeStats(draft_calls=12, target_calls=2)
        for _ in range(2):
            s.record_round(verified, 1)
        return s

    short, long = stats(2), stats(6)
    assert short.verified_per_round == [2, 2] and long.verified_per_round == [6, 6]
    shaped = CostModel(0.01, 0.1, 0.02, GROWING)
    assert shaped.time(short) == pytest.approx(0.12 + 0.1 * 2 * 1.2)
    assert shaped.time(short) < shaped.time(long) == pytest.approx(0.12 + 0.1 * 2 * (1.9 + 2 * 0.3))
    flat = CostModel(0.01, 0.1, 0.02)
    assert flat.time(short) == flat.time(long) == pytest.approx(short.modelled_time(0.01, 0.1, 0.02))


def test_selection_uses_dev_rows_only():
    rows = []
    for role, best in (("dev", 2.0), ("test", 5.0)):
        for k in (1.0, 2.0, 5.0):
            rows.append({"set": role, "role": role, "rule": "greedy", "rule_param": np.nan, "family": "fixed",
                         "artifact": None, "param": k, "throughput": 10.0 if k == best else 1.0})
    (choice,) = select(pd.DataFrame(rows), "throughput")
    assert (choice.value, choice.chosen_on, choice.dev_throughput) == (2.0, "dev", 10.0)


@pytest.fixture(scope="module")
def h_chosen(make_config, micro_trio, micro_root, tmp_path_factory):
    """An evaluation of two heads that record no h, over an h grid of its own (``evaluate.grids.head``)."""
    root = tmp_path_factory.mktemp("h_chosen")
    config = evaluation_config(make_config, micro_trio, root, "evaluate.rules=[speculative]",
                               "evaluate.hf.baselines=false", "evaluate.figures=false", "evaluate.calibration_rows=0",
                               "evaluate.bounds=false", "evaluate.grids.head=[0.01,0.6,0.99]")
    return config, evaluate(config.evaluate_job())


def test_each_heads_h_is_chosen_on_dev_over_the_evaluations_grid_and_recorded_beside_it(h_chosen, micro_trio):
    """h is chosen like K and τ, on the dev rows, over ``evaluate.grids.head`` (no grid of training's to agree with);
    the record beside each head holds those rows, and ``load_head`` serves the head at its h."""
    config, results = h_chosen
    table, grid = results.table, [0.01, 0.6, 0.99]
    heads = {c.artifact: c.value for c in results.metadata.selection if c.family == "head"}
    assert sorted(heads) == ["post", "pre"] and set(heads.values()) <= set(grid)
    draft = load_causal_lm(str(micro_trio["draft"]), dtype="float32")
    for name, h in heads.items():
        dev = table[(table["role"] == "dev") & (table["family"] == "head") & (table["artifact"] == name)]
        assert sorted(dev["param"]) == grid and len(set(dev["target_calls"])) > 1  # the grid decodes differently
        assert h == dev.sort_values(["throughput_cost", "param"], ascending=[False, True])["param"].iloc[0]
        rest = table[(table["role"] != "dev") & (table["family"] == "head") & (table["artifact"] == name)]
        assert rest["param"].tolist() == [h] * len(rest) and len(rest) == 2  # test and OOD at it
        file = Path(config.paths.head_dir) / name / "head.safetensors"
        choice = ThresholdChoice.read(choice_path(file))
        assert choice.threshold == h and choice.head_sha256 == file_sha256(file)
        assert [r["h"] for r in choice.rows] == grid
        by_h = dev.set_index("param")
        for row in choice.rows:
            assert [row[k] for k in ("generated", "draft_calls", "target_calls", "discarded")] == \
                by_h.loc[row["h"], ["generated", "draft_calls", "target_calls", "discarded"]].tolist()
            assert len(row["generations"]) == config.decoding.prompts["dev"]
        head = load_head(file, draft=draft)
        assert head.threshold == h and policies.Head(head).stop.threshold == h
        assert f"h = {h:g}" in (file.parent / "README.md").read_text()  # the model card says it


def test_a_head_file_that_is_not_the_one_its_h_was_chosen_for_loads_without_h_and_its_policy_refuses(
        h_chosen, tmp_path):
    config, _ = h_chosen
    source = Path(config.paths.head_dir) / "pre"
    copy = tmp_path / "pre"
    shutil.copytree(source, copy)
    assert load_head(copy).threshold is not None
    head = load_head(copy)
    head.metadata = replace(head.metadata, dev_metrics={"val/auroc": 0.25})
    save_head(head, copy / "head.safetensors", head.metadata)  # another file: the record's sha256 no longer matches
    edited = load_head(copy)
    assert edited.threshold is None
    with pytest.raises(ValueError, match="no stop threshold h: run python -m accept_heads.evaluate"):
        policies.Head(edited)
    assert policies.Head(edited, threshold=0.3).stop.threshold == 0.3


def test_the_evaluation_reuses_a_recorded_h_choice_when_its_key_matches_and_decodes_otherwise(h_chosen):
    config, _ = h_chosen
    job = config.evaluate_job()
    notes: dict[str, str] = {}
    executor = Executor.build(job, notes)
    specs = dev_sweeps(job, plan_evaluation(job), executor.artifacts)
    cost = pricing(job.cost, executor.trio, lambda: None, compiled=False, repeats=1, threads=None).record
    dev = executor.sets["dev"]
    reused = recorded_runs(specs, executor.artifacts, executor.decoding, dev, cost, notes)
    assert sorted(spec.param for spec in reused) == [0.01, 0.01, 0.6, 0.6, 0.99, 0.99] and not notes  # both heads
    for spec, records in reused.items():  # the same rows as decoding them here
        assert [r.generation.prompt_id for r in records] == [p.prompt_id for p in dev.prompts]
        assert _decisions(records) == _decisions(executor.run(spec))
    other = {**cost, "t_target": cost["t_target"] * 2}  # other prices: the same rows (a threshold stop reads none)
    assert recorded_runs(specs, executor.artifacts, executor.decoding, dev, other, notes).keys() == reused.keys()
    longer = replace(executor.decoding, max_new_tokens=executor.decoding.max_new_tokens + 1)  # other rows: decoded,
    assert recorded_runs(specs, executor.artifacts, longer, dev, cost, notes) == {}  # and one note per head says why
    assert sorted(notes.values()) == [f"head[{name}]'s recorded dev runs (head.h_choice.json) not reused (different "
                                      "settings): its h grid decoded here" for name in ("post", "pre")]


def test_a_grid_that_lacks_the_recorded_h_reuses_the_points_it_shares_and_chooses_again(h_chosen, tmp_path):
    """``evaluate.grids.head`` without a head's recorded h: nothing is refused; the shared point's rows are reused
    (no note), the new point is decoded, and h is chosen again over this grid and recorded."""
    config, _ = h_chosen
    shutil.copytree(config.paths.head_dir, tmp_path / "heads")
    before = {name: ThresholdChoice.read(choice_path(tmp_path / "heads" / name / "head.safetensors"))
              for name in ("pre", "post")}
    job = config.evaluate_job()
    grid = [0.01, 0.5]  # 0.01 is in the recorded grid, 0.5 is not, and neither need be the recorded h
    job = replace(job, paths=replace(job.paths, head_dir=str(tmp_path / "heads")),
                  evaluate=replace(job.evaluate, grids={**job.evaluate.grids, "head": grid},
                                   out_dir=str(tmp_path / "eval")))
    results = evaluate(job)
    assert not any(key.startswith("h_choice") for key in results.metadata.notes)
    for name, old in before.items():
        new = ThresholdChoice.read(choice_path(tmp_path / "heads" / name / "head.safetensors"))
        assert [row["h"] for row in new.rows] == grid and new.threshold in grid
        assert new.rows[0]["generations"] == old.rows[0]["generations"]  # h = 0.01: the recorded rows


def test_a_greedy_heads_dev_runs_are_keyed_by_the_sampling_its_rule_applies(h_chosen):
    """Under the greedy rule a policy decodes its dev rows at T = 0 as at T = 1, so both key them alike; the
    speculative rule's rows depend on T (negative control)."""
    config, _ = h_chosen
    executor = Executor.build(config.evaluate_job(), {})
    runner, dev = executor.decoding, executor.sets["dev"]
    greedy = replace(runner, sampling=Sampling(temperature=0.0))
    spec = RunSpec(set=dev.name, rule="greedy", policy=policy_spec("confidence", 0.5, None))  # a stop reading q
    assert sweep_settings(runner, "greedy", None, False) == sweep_settings(greedy, "greedy", None, False)
    assert _decisions(runner.run(spec, dev, False)) == _decisions(greedy.run(spec, dev, False))
    assert sweep_settings(runner, "speculative", None, False) != sweep_settings(greedy, "speculative", None, False)


def _decisions(records) -> list[dict]:
    """What a dev run decided per prompt: every generation field but its wall time and batching."""
    return [{k: v for k, v in vars(r.generation).items() if k not in ("wall_s", "batch")} for r in records]


def test_measured_costs_price_the_runs_and_every_table_says_which(make_config, micro_trio, micro_root, tmp_path,
                                                                  monkeypatch, capsys):
    """``cost.source=measured`` (the real pair's): the machine's cost profile is measured once, stored, and prices the
    selection and the ``*_cost`` columns, with every acceptance source the runs stop on at its measured price; the
    report's tables and the figures name the machine class and the ratios."""
    monkeypatch.setenv("ACCEPT_HEADS_COSTS_DIR", str(tmp_path / "costs"))
    config = evaluation_config(make_config, micro_trio, tmp_path, "evaluate.rules=[speculative]",
                               "evaluate.hf.baselines=false", "evaluate.calibration_rows=0", "evaluate.bounds=false",
                               "cost.source=measured")
    results = evaluate(config.evaluate_job())
    meta, printed = results.metadata, capsys.readouterr().out
    cost = meta.cost_models["cost"]
    profile = cost.profile.profile
    assert cost.source == "measured" and cost.caption == profile.caption() and "thread" in profile.machine
    model = profile.cost_model().with_sources(dict(cost.model.sources))  # each source at its price measured here
    assert cost.model == model and len(model.latency.values) == 15
    keys = set(results.generations["source_key"].dropna())
    assert any(key.startswith("head[") for key in keys) and keys <= dict(model.sources).keys()
    assert all(model.price(key).estimate > 0 for key in keys)
    assert Path(cost.profile.stored.path).is_file() and "no cost profile" in printed
    assert printed.count("costs measured on") >= 4  # the selection, each test / OOD set, the league, the heads
    again = aggregate(results.generations)  # the runs priced by hand at the profile's cost model
    add_costs(again, "cost", model)
    both = results.table.merge(again, on=KEYS, suffixes=("", "_again"))
    assert len(both) == len(results.table) and np.allclose(both["throughput_cost"], both["throughput_cost_again"])


def test_fixed_k_grid_grows_past_an_edge_choice():
    choices = [Choice(rule="fuzzy", rule_param=0.3, family="fixed", artifact=None, value=10.0, dev_throughput=1.0),
               Choice(rule="greedy", rule_param=None, family="fixed", artifact=None, value=3.0, dev_throughput=1.0)]
    grid = list(range(1, 11))
    assert edge_rules(choices, grid) == ["fuzzy"]
    assert extended_k(grid) == [15, 20]
    assert extended_k([40, 64]) == []  # K_CEILING
    assert edge_rules(choices, grid + [15, 20]) == []


def test_a_rule_at_the_fixed_k_grids_edge_is_named_in_a_note_and_only_then():
    choices = [Choice(rule="fuzzy", rule_param=0.3, family="fixed", artifact=None, value=64.0, dev_throughput=1.0),
               Choice(rule="greedy", rule_param=None, family="fixed", artifact=None, value=3.0, dev_throughput=1.0)]
    assert edge_note(choices, [1, 3, 64]) == ("best fixed K at the grid's edge K=64 for fuzzy: the optimum may lie "
                                              "beyond")
    assert edge_note(choices, [1, 3, 64, 96]) is None


def test_the_evaluations_edge_note_names_exactly_the_rules_at_the_edge(evaluated):
    _, results = evaluated
    grid = results.metadata.dev_grids["fixed"]
    at_edge = sorted(c.rule for c in results.metadata.selection
                     if c.family == "fixed" and c.swept == "param" and c.value == max(grid))
    note = results.metadata.notes.get("fixed_k_edge")
    assert (note is None) == (not at_edge)
    assert note is None or note.endswith(f"for {', '.join(at_edge)}: the optimum may lie beyond")


def choice_rows(table: pd.DataFrame, choice: Choice) -> pd.DataFrame:
    """The runs a choice was made among: same rule, family, artifact and held parameter, any swept value."""
    rows = table[(table["rule"] == choice.rule) & (table["family"] == choice.family)]
    if choice.artifact is not None:
        rows = rows[rows["artifact"] == choice.artifact]
    held = "rule_param" if choice.swept == "param" else "param"
    return rows if getattr(choice, held) is None else rows[rows[held] == getattr(choice, held)]


def test_chosen_values_come_from_dev_and_are_applied_to_test(evaluated):
    _, results = evaluated
    table = results.table
    dev = table[table["role"] == "dev"]
    for choice in results.metadata.selection:
        assert choice.chosen_on == "dev"
        rows = choice_rows(dev, choice)  # a head's h too: its grid decoded on dev by the evaluation
        assert rows["throughput_cost"].max() == pytest.approx(choice.dev_throughput)
        marked = rows.loc[rows["chosen_on"] == "dev", choice.swept].tolist()
        if choice.swept == "param":
            assert marked == [choice.value]
        else:  # the T sweep's row at the configured T also has its K from dev
            assert choice.value in marked and set(marked) <= {choice.value, 0.3}
    applied = table[(table["role"] != "dev") & table["family"].isin(["fixed", "confidence", "head"])
                    & (table["rule"] != "fuzzy")]
    assert (applied["chosen_on"] == "dev").all()
    picked = {(c.rule, c.family, c.artifact): c.value for c in results.metadata.selection}
    for _, row in applied.iterrows():
        assert picked[(row["rule"], row["family"], row["artifact"])] == row["param"]
    hf = table[table["family"] == "hf-constant"]
    assert set(hf["rule"]) == {"speculative", "greedy"} and (hf["chosen_on"] == "dev").all()
    for _, row in hf.iterrows():  # HF's constant schedule runs at the K chosen on dev for our decoder
        assert picked[(row["rule"], "fixed", None)] == row["param"]
    sv = table[(table["role"] != "dev") & (table["family"] == "sv")]  # its profile's k_max, and the dev K
    for set_name in ("test", "builtin:module"):
        params = sv.loc[sv["set"] == set_name, "param"].tolist()
        assert len(params) == 2 and picked[("speculative", "fixed", None)] in params
    assert {"fixed", "confidence", "head"} <= {c.family for c in results.metadata.selection}


def test_test_rows_are_marked_dev_only_when_their_parameter_was_chosen_on_dev(evaluated):
    _, results = evaluated
    table, selection = results.table, results.metadata.selection
    chosen = {(c.rule, c.family, c.artifact, *((c.value, c.rule_param) if c.swept == "param"
                                                         else (c.param, c.value))) for c in selection}
    fixed_k = {c.rule: c.value for c in selection if c.family == "fixed" and c.swept == "param"}
    marked = table[(table["role"] != "dev") & (table["chosen_on"] == "dev")]
    assert not marked.empty
    for _, row in marked.iterrows():
        rule_param = None if pd.isna(row["rule_param"]) else row["rule_param"]
        if row["family"] in ("hf-constant", "sv"):  # HF's constant K and SV's drafts: the fixed K chosen on dev
            assert row["param"] == fixed_k[row["rule"]]
        else:
            assert (row["rule"], row["family"], row["artifact"], row["param"], rule_param) in chosen, row["policy"]
    t_chosen = next(c.value for c in selection if c.swept == "rule_param")
    fsd = table[(table["set"] == "test") & (table["rule"] == "fuzzy") & (table["family"] == "fixed")]
    assert set(fsd.loc[fsd.chosen_on == "grid", "rule_param"]) == {0.1, 0.6} - {t_chosen}  # the FSD T grid


def test_se_gamma_and_fsd_threshold_are_chosen_on_dev(evaluated):
    _, results = evaluated
    table, selection = results.table, results.metadata.selection
    se_tuned = family_names(runner="se", tuned=True)
    se = [c for c in selection if c.family in se_tuned]
    assert sorted(c.family for c in se) == ["se-alternate", "se-sd"]
    (fsd,) = [c for c in selection if c.swept == "rule_param"]
    assert (fsd.rule, fsd.family, fsd.param) == ("fuzzy", "fixed", next(
        c.value for c in selection if c.rule == "fuzzy" and c.family == "fixed" and c.swept == "param"))
    dev = table[table["role"] == "dev"]
    assert set(choice_rows(dev, fsd)["rule_param"]) == {0.1, 0.3, 0.6}  # the T grid and the configured T
    for choice in se:
        assert set(choice_rows(dev, choice)["param"]) == {1.0, 4.0}  # evaluate.se_gammas
        for set_name in ("test", "builtin:module"):
            rows = choice_rows(table[table["set"] == set_name], choice)
            assert rows[["param", "chosen_on"]].values.tolist() == [[choice.value, "dev"]]


def test_results_carry_metadata(evaluated, micro_trio):
    config, results = evaluated
    meta = results.metadata
    assert meta.models.draft.id == str(micro_trio["draft"]) and meta.models.tokenizer_hash
    assert set(meta.heads) == {"pre", "post"} and meta.heads["pre"].metadata.head_config.timing == "pre"
    assert meta.heads["post"].path.endswith("post/head.safetensors")
    assert set(meta.profiles) == {"profile"} and len(meta.profiles["profile"].table) == 2
    assert meta.seed == config.seed and meta.seeding
    sets = {s.name: s for s in meta.sets}
    assert (sets["dev"].split, sets["test"].split, sets["builtin:module"].role) == ("dev", "test", "ood")
    assert all(s.count == 2 and len(s.prompt_ids) == 2 for s in sets.values())
    assert meta.cost == CostConfig(source="configured", t_draft=0.0236, t_target=0.112, t_companion=None,
                                   t_target_alone=0.108)
    assert meta.cost_fit.n > 0
    assert meta.cost_fit.companion_runs > 0  # the SV runs are fitted too
    latency = meta.latency
    assert len(latency.target_s) == len(latency.shape.values) == 5 and latency.shape.values[0] == 1.0
    assert 0 < latency.target_alone_s
    paper, fitted = meta.cost_models["cost"].model, meta.cost_models["fitted"].model
    assert paper.latency.values == (1.0,) and paper.t_companion == pytest.approx(
        0.0236 * latency.companion_s / latency.draft_s)
    assert fitted.latency == latency.shape and fitted.t_companion == meta.cost_fit.t_companion
    # cost.t_companion=null
    assert meta.cost_models["cost"].t_companion_from == "t_d x the companion/draft call ratio measured here"
    assert cost_lines(meta)[-1].endswith("(t_d x the companion/draft call ratio measured here)")
    configured = replace(meta, cost_models={**meta.cost_models, "cost": replace(
        meta.cost_models["cost"], model=replace(paper, t_companion=0.0276), t_companion_from="cost.t_companion")})
    assert cost_lines(configured)[-1].endswith("t_c = 0.0276 s (cost.t_companion)")
    assert set(results.calibration["head"]) == {"pre", "post"}


def test_help_lists_the_evaluate_group(repo_root):
    result = subprocess.run([sys.executable, "-m", "accept_heads.evaluate", "--help"], cwd=repo_root,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "evaluate:" in result.stdout and "grids:" in result.stdout  # the evaluate config is listed


def test_each_family_has_its_runner_and_an_unknown_family_names_the_valid_ones():
    decoding, hf, se = object(), object(), object()
    table = runners(decoding, hf, se)
    assert [f for f, r in table.items() if r is decoding] == list(policy_kinds())  # every policy kind of decode
    assert [f for f, r in table.items() if r is hf] == ["hf-constant", "hf-heuristic", "hf-confidence"]
    assert [f for f, r in table.items() if r is se] == ["se-plain", "se-sd", "se-alternate"]
    executor = Executor(job=None, trio=None, device="cpu", artifacts=Artifacts(), sets={},
                        decoding=None, hf=hf, runners=table)
    with pytest.raises(ValueError, match="unknown run family 'target'; valid: fixed, .*, se-alternate$"):
        executor.run(RunSpec(set="dev", rule="speculative", policy=TargetAloneSpec()))  # the batch axis's own runner
    with pytest.raises(ValueError, match="unknown run family 'hf-bogus'; valid: fixed, .*, se-alternate, target$"):
        run_policy("hf-bogus")


def test_a_run_spec_flattens_its_typed_policy_into_the_table_keys():
    head = RunSpec(set="test", rule="speculative", policy=SourceStopSpec("head", "h", 0.8, "pre"), chosen_on="dev")
    assert head.to_dict() == {"set": "test", "rule": "speculative", "family": "head", "param": 0.8, "artifact": "pre",
                              "rule_param": None, "chosen_on": "dev", "policy": "head[pre](h=0.8)"}
    se = RunSpec(set="dev", rule="ensemble", policy=SEAlternateSpec(4), rule_param=0.5)
    assert (se.family, se.param, se.label) == ("se-alternate", 4.0, "se-alternate(γ=4)")
    adaedl = SourceStopSpec("adaedl", "goodput", 0.05)
    assert RunSpec(set="dev", rule="speculative", policy=adaedl).label == "adaedl(γ=0.05)"  # not a count
    for spec in (head, se, RunSpec(set="dev", rule="greedy", policy=SVSpec("profile", 3))):
        assert run_policy(spec.family, spec.param, spec.artifact) == spec.policy  # the flat form reads back
