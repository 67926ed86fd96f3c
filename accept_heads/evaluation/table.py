"""The results table: per-generation records → one row per run, cost-model throughput, speed-ups, selection."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from accept_heads.config import RULE_NAMES
from accept_heads.evaluation.plan import TUNED, Choice

#: Columns identifying a run (one table row each).
KEYS = ["set", "role", "split", "rule", "rule_param", "family", "param", "artifact", "chosen_on", "policy", "source"]
COUNTS = ["generated", "target_calls", "draft_calls", "companion_calls", "drafted", "accepted", "discarded",
          "rounds", "wall_s"]


def _position_sum(lists: pd.Series) -> list[int]:
    width = max((len(x) for x in lists), default=0)
    total = np.zeros(width, dtype=np.int64)
    for x in lists:
        total[: len(x)] += np.asarray(x, dtype=np.int64)
    return total.tolist()


def _weighted(values: pd.Series, weights: pd.Series) -> float:
    ok = values.notna() & (weights > 0)
    return float((values[ok] * weights[ok]).sum() / weights[ok].sum()) if ok.any() else math.nan


def aggregate(generations: pd.DataFrame) -> pd.DataFrame:
    """Sum the counts of each run's generations and derive the DESIGN §5 metrics."""
    rows = []
    for key, group in generations.groupby(KEYS, dropna=False, sort=False):
        row: dict[str, Any] = dict(zip(KEYS, key))
        row.update({c: group[c].sum() for c in COUNTS})
        row["prompts"] = len(group)
        offered, accepted = _position_sum(group["position_offered"]), _position_sum(group["position_accepted"])
        row["per_position_acceptance"] = [a / o if o else math.nan for a, o in zip(accepted, offered)]
        row["target_agreement"] = _weighted(group["target_agreement"], group["generated"])
        row["target_nll"] = _weighted(group["target_nll"], group["generated"])
        rows.append(row)
    table = pd.DataFrame(rows)
    n = table["generated"].where(table["generated"] > 0)
    table["discard_rate"] = table["discarded"] / n
    table["verification_rate"] = table["target_calls"] / n
    table["mean_accepted_length"] = table["generated"] / table["target_calls"].where(table["target_calls"] > 0)
    table["wall_tokens_per_s"] = table["generated"] / table["wall_s"]
    for column in ("param", "rule_param"):
        table[column] = pd.to_numeric(table[column]).astype(float)
    table["artifact"] = table["artifact"].astype(object).where(table["artifact"].notna(), None)
    return table


def add_costs(table: pd.DataFrame, name: str, t_draft: float, t_target: float) -> None:
    """Modelled throughput ``N / (t_d·(N_d + N_c) + t_t·N_t)`` and speed-up over the target alone (``1/t_t``)."""
    time = t_draft * (table["draft_calls"] + table["companion_calls"]) + t_target * table["target_calls"]
    table[f"throughput_{name}"] = table["generated"] / time.where(time > 0)
    table[f"speedup_target_{name}"] = table[f"throughput_{name}"] * t_target
    plain = table["generated"] * (t_draft + t_target)  # a plain ensemble calls both models once per token
    table[f"speedup_plain_ensemble_{name}"] = (plain / time.where(time > 0)).where(table["rule"] == "ensemble")


def select(table: pd.DataFrame, column: str) -> list[Choice]:
    """Best K / τ / h per rule, rule parameter and artifact by ``column``, from the dev rows only.

    Ties go to the smaller parameter value.
    """
    dev = table[(table["role"] == "dev") & table["family"].isin(TUNED) & table[column].notna()]
    choices = []
    for (rule, param, family, artifact), group in dev.groupby(["rule", "rule_param", "family", "artifact"],
                                                              dropna=False, sort=True):
        best = group.assign(neg=-group["param"]).sort_values([column, "neg"], ascending=False).iloc[0]
        choices.append(Choice(rule=rule, rule_param=None if pd.isna(param) else float(param), family=family,
                              artifact=None if pd.isna(artifact) else artifact, value=float(best["param"]),
                              dev_throughput=float(best[column])))
    return choices


def _reference(table: pd.DataFrame, mask: pd.Series, column: str) -> pd.Series:
    """Per row: ``column`` of the row matching ``mask`` in the same set, rule and rule parameter."""
    keys = ["set", "rule", "rule_param"]
    ref = table[mask].drop_duplicates(keys)[keys + [column]].rename(columns={column: "_ref"})
    merged = table[keys].astype(object).merge(ref.astype(object), on=keys, how="left")
    return pd.to_numeric(merged["_ref"], errors="coerce").set_axis(table.index)


def add_comparisons(table: pd.DataFrame, name: str) -> None:
    """Speed-up over the best fixed K (chosen on dev) and, for greedy, the share of the oracle gap captured."""
    column = f"throughput_{name}"
    fixed = _reference(table, (table["family"] == "fixed") & (table["chosen_on"] == "dev"), column)
    table[f"speedup_fixed_{name}"] = table[column] / fixed
    oracle = _reference(table, table["family"] == "oracle", column)
    gap = (oracle - fixed).where((oracle - fixed) > 0)
    table[f"oracle_gap_share_{name}"] = ((table[column] - fixed) / gap).where(table["rule"] == "greedy")


ORDER = {family: i for i, family in enumerate(["fixed", "heuristic", "confidence", "head", "sv", "oracle",
                                                "hf-constant", "hf-heuristic", "hf-confidence",
                                                "se-plain", "se-sd", "se-alternate"])}


def sort_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Sets in run order, then rule (speculative, greedy, fuzzy, ensemble), family, artifact and parameter."""
    order = {"set": {name: i for i, name in enumerate(dict.fromkeys(table["set"]))},
             "rule": {name: i for i, name in enumerate(RULE_NAMES)}, "family": ORDER}
    return table.sort_values(
        ["set", "rule", "rule_param", "family", "artifact", "param"],
        key=lambda c: c.map(order[c.name]) if c.name in order else c,
        na_position="first",
    ).reset_index(drop=True)


def mark_dev_choices(generations: pd.DataFrame, choices: list[Choice]) -> pd.DataFrame:
    """Label the dev records of the chosen grid points ``chosen_on='dev'`` (they were decoded as ``grid``)."""
    frame = generations.copy()
    for c in choices:
        same_param = frame["rule_param"].isna() if c.rule_param is None else frame["rule_param"] == c.rule_param
        same_artifact = frame["artifact"].isna() if c.artifact is None else frame["artifact"] == c.artifact
        mask = ((frame["role"] == "dev") & (frame["rule"] == c.rule) & same_param & (frame["family"] == c.family)
                & same_artifact & (frame["param"] == c.value))
        frame.loc[mask, "chosen_on"] = "dev"
    return frame
