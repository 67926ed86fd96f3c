"""The results table: per-generation records → one row per run, cost-model throughput, speed-ups, selection."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from accept_heads.evaluation.choice import Choice
from accept_heads.evaluation.plan import rule_k
from accept_heads.measure.families import families, family_names, perfect_for
from accept_heads.measure.selection import best_value
from ahconf.schema import rule_names


def select(table: pd.DataFrame, column: str, swept: str = "param") -> list[Choice]:
    """Best value of ``swept`` by ``column`` per run (the other key columns), from the dev rows only.

    ``swept="param"``: K / τ / h / γ per rule, rule parameter, family and artifact.
    ``swept="rule_param"``: the rule's swept parameter (the FSD threshold T) per rule, family, artifact and
    policy parameter (pass the rows of that sweep only). Ties go to the smaller value.
    """
    held = "rule_param" if swept == "param" else "param"
    dev = table[(table["role"] == "dev") & table["family"].isin(family_names(tuned=True)) & table[column].notna()]
    choices = []
    for (rule, fixed, family, artifact), group in dev.groupby(["rule", held, "family", "artifact"],
                                                              dropna=False, sort=True):
        value = best_value(group[swept].tolist(), group[column].tolist())
        best = group[group[swept] == value].iloc[0]
        held_values = {"rule_param": None, "param": None, held: None if pd.isna(fixed) else float(fixed)}
        choices.append(Choice(rule=rule, family=family, artifact=None if pd.isna(artifact) else artifact,
                              value=float(best[swept]), dev_throughput=float(best[column]), swept=swept,
                              **held_values))
    return choices


def select_rule_param(table: pd.DataFrame, column: str, rule: str, choices: list[Choice]) -> list[Choice]:
    """``rule``'s swept parameter (the FSD threshold T) chosen on dev by ``column`` among its runs at its chosen K."""
    k = rule_k(choices, rule)
    if k is None:
        return []
    return select(table[(table["rule"] == rule) & (table["family"] == "fixed") & (table["param"] == k)], column,
                  swept="rule_param")


def _reference(table: pd.DataFrame, mask: pd.Series, column: str) -> pd.Series:
    """Per row: ``column`` of the row matching ``mask`` in the same set, rule and rule parameter."""
    keys = ["set", "rule", "rule_param"]
    ref = table[mask].drop_duplicates(keys)[keys + [column]].rename(columns={column: "_ref"})
    merged = table[keys].astype(object).merge(ref.astype(object), on=keys, how="left")
    return pd.to_numeric(merged["_ref"], errors="coerce").set_axis(table.index)


def bound_rows(table: pd.DataFrame, bound: str) -> pd.Series:
    """The rows of run family ``bound`` that a comparison uses (a tuned bound at its dev choice)."""
    rows = table["family"] == bound
    return rows & (table["chosen_on"] == "dev") if families()[bound].tuned else rows


def at_dev_choice(table: pd.DataFrame) -> pd.Series:
    """The rows a set reports for their family: a tuned family's at its dev choice, an untuned family's every row."""
    return (table["chosen_on"] == "dev") | ~table["family"].isin(family_names(tuned=True))


def best_training_free(table: pd.DataFrame, column: str) -> pd.Series:
    """The rows of the best training-free source per rule and rule parameter: the family of the predictor league's
    training-free side whose dev run, at its dev choice, has the highest ``column``; its rows in every set."""
    candidates = table["family"].isin(family_names(league="training-free")) & at_dev_choice(table)
    dev = table[candidates & (table["role"] == "dev") & table[column].notna()]
    best = {_rule_key(rule, param): group.loc[group[column].idxmax(), "family"]
            for (rule, param), group in dev.groupby(["rule", "rule_param"], dropna=False)}
    chosen = [best.get(_rule_key(rule, param)) == kind
              for rule, param, kind in zip(table["rule"], table["rule_param"], table["family"])]
    return candidates & pd.Series(chosen, index=table.index)


def _rule_key(rule: str, param: Any) -> tuple[str, float | None]:
    return rule, None if pd.isna(param) else float(param)


def _gap_share(value: pd.Series, fixed: pd.Series, bound: pd.Series) -> pd.Series:
    gap = (bound - fixed).where((bound - fixed) > 0)
    return (value - fixed) / gap


def add_comparisons(table: pd.DataFrame, name: str) -> None:
    """Speed-up over the best fixed K (chosen on dev) and over the best training-free source (chosen on dev,
    :func:`best_training_free`), and the share of the gap from the best fixed K to each bound that a run captures
    (DESIGN §5): to the realised oracle (every run) and to the perfect predictor with the run's own stop rule (heads
    and perfect predictors; :func:`~accept_heads.measure.specs.perfect_for`)."""
    column = f"throughput_{name}"
    fixed = _reference(table, (table["family"] == "fixed") & (table["chosen_on"] == "dev"), column)
    table[f"speedup_fixed_{name}"] = table[column] / fixed
    table[f"speedup_free_{name}"] = table[column] / _reference(table, best_training_free(table, column), column)
    table[f"oracle_gap_share_{name}"] = _gap_share(table[column], fixed,
                                                   _reference(table, bound_rows(table, "oracle"), column))
    share = pd.Series(np.nan, index=table.index)
    bounds = perfect_for()
    for bound in dict.fromkeys(bounds.values()):
        perfect = _reference(table, bound_rows(table, bound), column)
        stops = table["family"].map(bounds) == bound
        share = share.where(~stops, _gap_share(table[column], fixed, perfect))
    table[f"perfect_gap_share_{name}"] = share


def sort_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Sets in run order, then rule (speculative, greedy, fuzzy, ensemble), family, artifact and parameter."""
    order = {"set": {name: i for i, name in enumerate(dict.fromkeys(table["set"]))},
             "rule": {name: i for i, name in enumerate(rule_names())},
             "family": {family: i for i, family in enumerate(families())}}
    return table.sort_values(
        ["set", "rule", "rule_param", "family", "artifact", "param"],
        key=lambda c: c.map(order[c.name]) if c.name in order else c,
        na_position="first",
    ).reset_index(drop=True)


def _matches(column: pd.Series, value: Any) -> pd.Series:
    return column.isna() if value is None else column == value


def mark_dev_choices(generations: pd.DataFrame, choices: list[Choice]) -> pd.DataFrame:
    """Label the dev records of the chosen grid points ``chosen_on='dev'`` (they were decoded as ``grid``)."""
    frame = generations.copy()
    for c in choices:
        param, rule_param = c.run_params()
        mask = ((frame["role"] == "dev") & (frame["rule"] == c.rule) & _matches(frame["rule_param"], rule_param)
                & (frame["family"] == c.family) & _matches(frame["artifact"], c.artifact)
                & _matches(frame["param"], param))
        frame.loc[mask, "chosen_on"] = "dev"
    return frame
