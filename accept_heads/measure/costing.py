"""Per-generation records → one row per run with the DESIGN §5 metrics, and its modelled throughput under a cost
model: what the evaluation's table (:mod:`accept_heads.evaluation.table`) and a head's threshold choice
(:mod:`accept_heads.evaluation.h_choice`) both price runs by.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from accept_heads.measure.runs import Record, frame
from decode.costs import CostModel, LatencyShape, SourcePrice, source_seconds

#: Columns identifying a run (one table row each).
KEYS = ["set", "role", "split", "rule", "rule_param", "family", "param", "artifact", "chosen_on", "policy", "source"]
COUNTS = ["generated", "target_calls", "draft_calls", "companion_calls", "drafted", "accepted", "discarded",
          "rounds", "verified", "source_calls", "source_updates", "wall_s"]


def _position_sum(lists: pd.Series) -> list[int]:
    width = max((len(x) for x in lists), default=0)
    total = np.zeros(width, dtype=np.int64)
    for x in lists:
        total[: len(x)] += np.asarray(x, dtype=np.int64)
    return total.tolist()


def _weighted(values: pd.Series, weights: pd.Series) -> float:
    ok = values.notna() & (weights > 0)
    return float((values[ok] * weights[ok]).sum() / weights[ok].sum()) if ok.any() else math.nan


def source_key(keys: pd.Series) -> str | None:
    """The one price key of a run's generations (None: none priced)."""
    distinct = set(keys.dropna())
    if len(distinct) > 1:
        raise ValueError(f"one run's generations name several acceptance sources' prices: {sorted(distinct)}")
    return distinct.pop() if distinct else None


def run_source_seconds(table: pd.DataFrame, prices: Mapping[str, SourcePrice]) -> np.ndarray:
    """Each run's (or generation's) acceptance source's modelled seconds at ``prices`` (its estimates and folded
    rounds: :func:`decode.costs.source_seconds`)."""
    keys = [key if isinstance(key, str) else None for key in table["source_key"]]  # a frame holds None as NaN
    return source_seconds(prices, keys, table["source_calls"], table["source_updates"])


def aggregate(generations: pd.DataFrame) -> pd.DataFrame:
    """Sum the counts of each run's generations and derive the DESIGN §5 metrics."""
    rows = []
    for key, group in generations.groupby(KEYS, dropna=False, sort=False):
        row: dict[str, Any] = dict(zip(KEYS, key))
        row.update({c: group[c].sum() for c in COUNTS})
        row["prompts"] = len(group)
        row["source_key"] = source_key(group["source_key"])
        offered, accepted = _position_sum(group["position_offered"]), _position_sum(group["position_accepted"])
        row["per_position_acceptance"] = [a / o if o else math.nan for a, o in zip(accepted, offered)]
        row["rounds_by_length"] = _position_sum(group["verified_per_round"].map(
            lambda lengths: np.bincount(np.asarray(lengths, dtype=np.int64))))
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


def costed(records: Sequence[Record], cost: CostModel) -> pd.DataFrame:
    """The runs of ``records`` with their modelled throughput under ``cost`` (column suffix ``_cost``)."""
    table = aggregate(frame(records))
    add_costs(table, "cost", cost)
    return table


def verification_units(table: pd.DataFrame, shape: LatencyShape) -> np.ndarray:
    """Each run's ``Σ_r shape(L_r)``: exact from ``rounds_by_length`` (our decoder); HF and SE runs record
    only their total ``verified`` and are charged ``N_t·shape(mean L)``."""
    exact = table["rounds_by_length"].map(shape.units).to_numpy(float)
    mean = shape.mean_units(table["target_calls"], table["verified"])
    return np.where(table["rounds_by_length"].map(len).to_numpy() > 0, exact, mean)


def add_costs(table: pd.DataFrame, name: str, cost: CostModel) -> None:
    """Modelled throughput ``N / T`` under ``cost`` (every source's own compute priced where ``cost`` prices it) and
    speed-up over the target alone (``cost.target_alone`` seconds per token, the target's own step)."""
    units = verification_units(table, cost.latency)
    sources = run_source_seconds(table, dict(cost.sources))
    time = pd.Series(cost.times(table["draft_calls"], table["companion_calls"], units, sources), index=table.index)
    table[f"throughput_{name}"] = table["generated"] / time.where(time > 0)
    table[f"speedup_target_{name}"] = table[f"throughput_{name}"] * cost.target_alone
    plain = table["generated"] * (cost.t_draft + cost.t_target)  # a plain ensemble calls both models once per token
    table[f"speedup_plain_ensemble_{name}"] = (plain / time.where(time > 0)).where(table["rule"] == "ensemble")
