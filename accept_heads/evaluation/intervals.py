"""The results table's 95 % paired-bootstrap interval columns (speed-up over the best fixed K and over the best
training-free source, share of the gap to the realised oracle and to the perfect predictor), by the paired draws of
:mod:`accept_heads.measure.bootstrap`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from accept_heads.evaluation.table import best_training_free, bound_rows
from accept_heads.measure.bootstrap import (
    PromptCosts,
    gap_share_interval,
    generation_seconds,
    paired_draws,
    ratio_interval,
)
from accept_heads.measure.costing import KEYS
from accept_heads.measure.families import perfect_for
from decode.costs import CostModel


def run_costs(generations: pd.DataFrame, seconds: np.ndarray) -> dict[tuple, PromptCosts]:
    """Run key (the table's :data:`KEYS`) → its per-prompt generated tokens and modelled seconds."""
    frame = generations[KEYS + ["prompt_id", "generated"]].assign(_seconds=seconds)
    runs = {}
    for key, group in frame.groupby(KEYS, dropna=False, sort=False):
        group = group.sort_values("prompt_id")
        runs[key] = PromptCosts(tuple(group["prompt_id"]), group["generated"].to_numpy(float),
                                group["_seconds"].to_numpy(float))
    return runs


def add_intervals(table: pd.DataFrame, generations: pd.DataFrame, name: str, cost: CostModel, seed: int) -> None:
    """Columns ``speedup_fixed_{name}_lo/_hi``, ``speedup_free_{name}_lo/_hi``, ``oracle_gap_share_{name}_lo/_hi``
    and ``perfect_gap_share_{name}_lo/_hi`` (95 %, paired over prompts).

    The references of a row are the ones :func:`~accept_heads.evaluation.table.add_comparisons` uses:
    the fixed K chosen on dev, the best training-free source chosen on dev, the realised oracle and the perfect
    predictor with the row's stop rule, in the same set, rule and rule parameter.
    """
    runs = run_costs(generations, generation_seconds(generations, cost))
    keyed = table.assign(_key=[tuple(row) for row in table[KEYS].itertuples(index=False)])
    free = best_training_free(table, f"throughput_{name}")
    metrics = ("speedup_fixed", "speedup_free", "oracle_gap_share", "perfect_gap_share")
    columns = {f"{metric}_{name}_{end}": np.full(len(table), np.nan) for metric in metrics for end in ("lo", "hi")}
    perfect = perfect_for()
    for _, group in keyed.groupby(["set", "rule", "rule_param"], dropna=False, sort=False):
        fixed = group[(group["family"] == "fixed") & (group["chosen_on"] == "dev")]
        if fixed.empty:
            continue
        reference = runs[_lookup(runs, fixed["_key"].iloc[0])]
        bounds = {bound: runs[_lookup(runs, rows["_key"].iloc[0])]
                  for bound in ("oracle", *perfect.values()) if len(rows := group[bound_rows(group, bound)])}
        best_free = group[free[group.index]]
        free_run = runs[_lookup(runs, best_free["_key"].iloc[0])] if len(best_free) else None
        draws = paired_draws(len(reference.prompt_ids), seed)
        for index, key, family in zip(group.index, group["_key"], group["family"]):
            run = runs[_lookup(runs, key)]
            if run.prompt_ids != reference.prompt_ids:
                continue  # another prompt set (cannot be paired)
            position = table.index.get_loc(index)
            low, high = ratio_interval(run, reference, draws)
            columns[f"speedup_fixed_{name}_lo"][position], columns[f"speedup_fixed_{name}_hi"][position] = low, high
            if free_run is not None and free_run.prompt_ids == run.prompt_ids:
                low, high = ratio_interval(run, free_run, draws)
                columns[f"speedup_free_{name}_lo"][position], columns[f"speedup_free_{name}_hi"][position] = low, high
            for metric, bound in (("oracle_gap_share", "oracle"), ("perfect_gap_share", perfect.get(family))):
                if bound in bounds and bounds[bound].prompt_ids == run.prompt_ids:
                    low, high = gap_share_interval(run, reference, bounds[bound], draws)
                    columns[f"{metric}_{name}_lo"][position], columns[f"{metric}_{name}_hi"][position] = low, high
    for column, values in columns.items():
        table[column] = values


def _lookup(runs: dict[tuple, PromptCosts], key: tuple) -> tuple:
    """The run key equal to ``key`` (NaN-aware: table and groupby keys carry NaN for missing values)."""
    for candidate in runs:
        if all(_same(a, b) for a, b in zip(candidate, key)):
            return candidate
    raise KeyError(f"no generations for run {key}")


def _same(a: object, b: object) -> bool:
    missing_a = a is None or (isinstance(a, float) and np.isnan(a))
    missing_b = b is None or (isinstance(b, float) and np.isnan(b))
    return (missing_a and missing_b) or (not missing_a and not missing_b and a == b)
