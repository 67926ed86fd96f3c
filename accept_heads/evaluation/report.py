"""Terminal output of an evaluation (rich): results per set, the dev selection, the cost fit, the files."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from accept_heads.evaluation.choice import Choice
from accept_heads.evaluation.metadata import EvaluationMetadata
from accept_heads.evaluation.table import at_dev_choice, best_training_free
from accept_heads.evaluation.wallclock import WallclockDescription
from accept_heads.measure.cost_models import Pricing
from accept_heads.measure.families import families, family, family_names
from accept_heads.measure.inputs import HeadRecord
from decode.batch_costs import BatchCosts
from decode.policy_specs import source_stop_kinds
from decode.rules import RULES

WIDTH = 180


def _num(value: Any, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}{suffix}"


def _positions(values: list[float], shown: int = 4) -> str:
    return " ".join(_num(v, 2) for v in list(values)[:shown]) or "—"


def _with_interval(row: pd.Series, column: str, digits: int, suffix: str, scale: float = 1.0) -> str:
    """``value [lo, hi]`` with the 95 % paired-bootstrap interval when the table has one."""
    value = _num(scale * row[column], digits, suffix) if pd.notna(row[column]) else _num(None)
    low, high = row.get(f"{column}_lo"), row.get(f"{column}_hi")
    if low is None or pd.isna(low) or pd.isna(high):
        return value
    return f"{value} [{scale * low:.{digits}f}, {scale * high:.{digits}f}]"


def results_table(table: pd.DataFrame, set_name: str, cost: Pricing) -> Table:
    """One set's rows (the grid points of a sweep are left to the saved table and the figures); ``cost``: the
    ``cost`` model (its caption says which costs)."""
    rows = table[(table["set"] == set_name) & (table["chosen_on"] != "grid")]
    out = Table(title=f"{set_name} — modelled at {cost.caption} (cost) and at the fitted t_d, t_c, t_t(L)",
                title_justify="left")
    for column in ("rule", "policy", "chosen on", "discard", "verif.", "acc. len", "accept @1..4",
                   "×target", "×target fit", "×best K [95% CI]", "oracle gap [95% CI]", "perfect gap [95% CI]"):
        out.add_column(column, justify="left" if column in ("rule", "policy", "accept @1..4") else "right")
    for _, row in rows.iterrows():
        rule = row["rule"] if pd.isna(row["rule_param"]) else f"{row['rule']} ({row['rule_param']:g})"
        out.add_row(
            rule, escape(row["policy"]), row["chosen_on"] or "—", _num(row["discard_rate"]),
            _num(row["verification_rate"]), _num(row["mean_accepted_length"]),
            _positions(row["per_position_acceptance"]), _num(row["speedup_target_cost"], suffix="×"),
            _num(row["speedup_target_fitted"], suffix="×"), _with_interval(row, "speedup_fixed_cost", 3, "×"),
            _with_interval(row, "oracle_gap_share_cost", 0, "%", 100),
            _with_interval(row, "perfect_gap_share_cost", 0, "%", 100),
        )
    return out


def selection_table(selection: list[Choice], caption: str) -> Table:
    """The parameters chosen on dev (at the costs ``caption`` names)."""
    out = Table(title=f"chosen on the dev split (max modelled throughput at {caption})", title_justify="left")
    for column in ("rule", "family", "artifact", "value", "chosen on", "dev tokens / modelled s"):
        out.add_column(column)
    for choice in selection:
        rule = choice.rule if choice.rule_param is None else f"{choice.rule} ({choice.rule_param:g})"
        if choice.swept == "param":
            value = f"{family(choice.family).symbol}={choice.value:g}"
        else:
            value = f"{RULES[choice.rule].swept}={choice.value:g} at K={choice.param:g}"
        out.add_row(rule, choice.family, escape(choice.artifact or "—"), value, choice.chosen_on,
                    _num(choice.dev_throughput))
    return out


def _run_row(rows: pd.DataFrame, family: str) -> pd.Series | None:
    """The one row of ``family`` that the report shows (a tuned family at its dev choice), else None."""
    picked = rows[(rows["family"] == family) & (rows["chosen_on"] != "grid")]
    return picked.iloc[0] if len(picked) else None


def _cell(row: pd.Series | None, column: str, digits: int, suffix: str, scale: float = 1.0) -> str:
    return _with_interval(row, column, digits, suffix, scale) if row is not None else "—"


def heads_table(table: pd.DataFrame, heads: dict[str, HeadRecord], caption: str) -> Table:
    """Per head decoded here, test / OOD set, source (the head, or the head recalibrated per request) and stop rule
    (each family with a ``stop``: threshold h chosen on dev, goodput): the best fixed K, the head and both bounds (the
    perfect predictor with the same stop, the realised oracle) as × the best fixed K, and the head's share of the gap
    from the best fixed K to each bound, with 95 % intervals (DESIGN §5), at the costs ``caption`` names."""
    sets = list(dict.fromkeys(table.loc[table["role"] != "dev", "set"]))
    decoded = set(table.loc[table["role"] != "dev", "artifact"].dropna())
    out = Table(title=f"heads and bounds — × best fixed K at {caption}, and the share of the gap to each bound "
                      "[95% paired-bootstrap CI over prompts]", title_justify="left")
    for column in ("head", "rule", "dev AUROC", "set", "stop", "best K ×target", "head ×best K", "perfect ×best K",
                   "oracle ×best K", "share of perfect gap", "share of oracle gap"):
        out.add_column(column, justify="left" if column in ("head", "rule", "set", "stop") else "right")
    for name, head in ((n, h.metadata) for n, h in heads.items() if n in decoded):
        rule = head.rule["name"] + "".join(f" {k}={v}" for k, v in head.rule["params"].items())
        auroc = head.dev_metrics.get("val/auroc")
        for set_name in sets:
            same = table[(table["set"] == set_name) & (table["rule"] == head.rule["name"])]
            fixed = same[(same["family"] == "fixed") & (same["chosen_on"] == "dev")]
            best = (f"K={fixed['param'].iloc[0]:g} {fixed['speedup_target_cost'].iloc[0]:.2f}×" if len(fixed)
                    else "—")
            oracle = _run_row(same, "oracle")
            for kind in (f for f in families().values() if f.stop is not None):
                row = _run_row(same[same["artifact"] == name], kind.name)
                if row is None:
                    continue
                source = source_stop_kinds().get(kind.name, (kind.name,))[0]  # the head, or it recalibrated
                stop = f"{source}, " + (f"{kind.stop}={row['param']:g} (dev)" if kind.tuned else kind.stop)
                out.add_row(escape(name), escape(rule), "undefined" if auroc is None else _num(auroc, 3), set_name,
                            stop, best, _cell(row, "speedup_fixed_cost", 3, "×"),
                            _cell(_run_row(same, kind.perfect), "speedup_fixed_cost", 3, "×"),
                            _cell(oracle, "speedup_fixed_cost", 3, "×"),
                            _cell(row, "perfect_gap_share_cost", 0, "%", 100),
                            _cell(row, "oracle_gap_share_cost", 0, "%", 100))
    return out


def league_table(table: pd.DataFrame, caption: str) -> Table:
    """The predictor league per test / OOD set and rule: every acceptance source under each of its stops (learned
    heads and training-free sources, each at its dev choice) as × the best fixed K and × the best training-free
    source chosen on dev, with 95 % intervals, at the costs ``caption`` names; the best fixed K first."""
    league = family_names(league="learned") + family_names(league="training-free")
    rows = table[(table["role"] != "dev") & at_dev_choice(table)
                 & (table["family"].isin(league) | ((table["family"] == "fixed") & (table["chosen_on"] == "dev")))]
    best_free = best_training_free(table, "throughput_cost")
    out = Table(title="predictor league — each acceptance source and stop at its dev choice, × the best fixed K and "
                      f"× the best training-free source (chosen on dev) at {caption} [95% paired-bootstrap CI]",
                title_justify="left")
    for column in ("set", "rule", "side", "source", "stop", "×target", "×best K [95% CI]",
                   "×best training-free [95% CI]"):
        out.add_column(column, justify="left" if column in ("set", "rule", "side", "source", "stop") else "right")
    for _, row in rows.iterrows():
        kind = family(row["family"])
        side = kind.league or "baseline"
        if row.name in best_free.index and best_free[row.name]:
            side += " (best, dev)"
        source = row["family"] if pd.isna(row["artifact"]) else f"{row['family']} [{row['artifact']}]"
        name = kind.stop or kind.symbol
        stop = f"{name}={row['param']:g}" if kind.tuned and pd.notna(row["param"]) else name or "—"
        out.add_row(row["set"], row["rule"], side, escape(source), stop,
                    _num(row["speedup_target_cost"], suffix="×"), _with_interval(row, "speedup_fixed_cost", 3, "×"),
                    _with_interval(row, "speedup_free_cost", 3, "×"))
    return out


def source_calibration_table(calibration: pd.DataFrame) -> Table:
    """Per dev / test / OOD set, rule and league source at its dev choice: how its ``P̂`` scored the candidates whose
    outcome decoding observed."""
    out = Table(title="acceptance sources in decoding — P̂ against the observed outcome of each candidate up to a "
                      "round's first rejection", title_justify="left")
    for column in ("set", "rule", "source", "param", "scored", "accepted", "mean P̂", "AUROC", "ECE", "Brier"):
        out.add_column(column, justify="left" if column in ("set", "rule", "source") else "right")
    for _, row in calibration.iterrows():
        source = row["family"] if pd.isna(row["artifact"]) else f"{row['family']} [{row['artifact']}]"
        out.add_row(row["set"], row["rule"], escape(source), _num(row["param"], 3), str(row["n"]),
                    _num(row["accept_rate"], 3), _num(row["mean_estimate"], 3), _num(row["auroc"], 3),
                    _num(row["ece"], 3), _num(row["brier"], 3))
    return out


def batch_axis_table(axis: pd.DataFrame, batch_costs: BatchCosts) -> Table:
    """Per test set, rule, policy and batch size: measured (meas.) and modelled (model) tokens/s, × the target
    alone and × the best fixed K (chosen on dev at that B)."""
    rows = axis[axis["role"] != "dev"]
    draft_ms = " ".join(f"B={b}: {1e3 * t:.2f}" for b, t in zip(batch_costs.batches, batch_costs.draft))
    out = Table(title=f"batch axis — throughput per batch size B (modelled at the batch costs measured here; "
                      f"draft forward ms {draft_ms})", title_justify="left")
    for column in ("set", "rule", "policy", "chosen on", "B", "tokens", "tok/s meas.", "×target meas.",
                   "tok/s model", "×target model", "×best K(B) model"):
        out.add_column(column, justify="left" if column in ("set", "rule", "policy") else "right",
                       overflow="fold" if column == "policy" else "ellipsis")
    for _, row in rows.iterrows():
        out.add_row(row["set"], row["rule"], escape(row["policy"]), row["chosen_on"] or "—", str(row["batch"]),
                    str(row["tokens"]), _num(row["tokens_per_s"], 1), _num(row["x_target_measured"], 3, "×"),
                    _num(row["modelled_tokens_per_s"], 1), _num(row["x_target"], 3, "×"),
                    _num(row["x_best_fixed_k"], 3, "×"))
    return out


def wallclock_table(wall: pd.DataFrame, described: WallclockDescription, caption: str) -> Table:
    """Per timed set, rule and method: measured tokens/s at batch 1, × the target alone and × the best fixed K
    (measured, with 95 % paired-bootstrap intervals), the modelled × best fixed K (at the costs ``caption`` names and
    the fitted ones), and whether the timed outputs were the counted runs' own."""
    out = Table(title=f"wall clock — batch 1, methods taking turns per prompt ({described.device}, "
                      f"{described.dtype}, {described.threads} threads; {described.forwards}); ×best K model at "
                      f"{caption}", title_justify="left")
    for column in ("set", "rule", "policy", "prompts", "tok/s", "×target [95% CI]", "×best K [95% CI]",
                   "×best K model", "×best K fitted", "same output"):
        out.add_column(column, justify="left" if column in ("set", "rule", "policy") else "right",
                       overflow="fold" if column == "policy" else "ellipsis")
    for _, row in wall.iterrows():
        out.add_row(row["set"], row["rule"], escape(row["policy"]), str(row["prompts"]), _num(row["tokens_per_s"], 1),
                    _with_interval(row, "x_target", 3, "×"), _with_interval(row, "x_fixed", 3, "×"),
                    _num(row["speedup_fixed_cost"], 3, "×"), _num(row["speedup_fixed_fitted"], 3, "×"),
                    _num(row["matches"], 0, "%") if pd.isna(row["matches"]) else f"{100 * row['matches']:.0f}%")
    return out


def cost_lines(metadata: EvaluationMetadata) -> list[str]:
    """The fitted ``t_d``, ``t_c``, ``t_t(L)`` and R², and which costs the ``cost`` model has."""
    fit, fitted = metadata.cost_fit, metadata.cost_models["fitted"].model.latency.values
    t_c = f"{1000 * fit.t_companion:.2f} ms" if fit.companion_runs else "not identified (no companion run)"
    ratio = fit.t_draft / fit.t_target if fit.t_target > 0 else math.nan
    lengths = " ".join(f"{1000 * fit.t_target * v:.2f}" for v in fitted)
    return [
        f"cost fit (least squares, no intercept, on {fit.n} runs, {fit.companion_runs} with the companion): "
        f"t_d = {1000 * fit.t_draft:.2f} ms, t_c = {t_c}, t_t(L=1) = {1000 * fit.t_target:.2f} ms "
        f"(t_d/t_t = {_num(ratio, 3)}), R² (uncentred) = {fit.r2:.3f}",
        f"fitted t_t(L) for L = 1..{len(fitted)} (ms, measured latency shape): {lengths}",
        _cost_model_line(metadata.cost_models["cost"]),
    ]


def _cost_model_line(cost: Pricing) -> str:
    """What the ``cost`` model prices at: the configured pair, or the measured profile (and where it is stored)."""
    model = cost.model
    if cost.profile is None:
        return (f"cost pair: t_d = {model.t_draft:g} s, t_t = {model.t_target:g} s (flat in L), "
                f"t_c = {model.t_companion:.4g} s ({cost.t_companion_from})")
    return (f"cost model: {cost.caption} (t_d = {1000 * model.t_draft:.2f} ms, t_t = T(2) = "
            f"{1000 * model.t_target:.2f} ms, t_c = {1000 * model.t_companion:.2f} ms; stored in "
            f"{cost.profile.stored.path})")


def print_report(table: pd.DataFrame, metadata: EvaluationMetadata, files: dict[str, Path],
                 figures: dict[str, Path | None], batch_axis: pd.DataFrame | None = None,
                 wallclock: pd.DataFrame | None = None, source_calibration: pd.DataFrame | None = None) -> None:
    """Everything the user needs at the end of a run."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=WIDTH)  # logs and pipes: do not squeeze the table into 80 columns
    cost = metadata.cost_models["cost"]
    console.print(selection_table(metadata.selection, cost.caption))
    for set_name in dict.fromkeys(table.loc[table["role"] != "dev", "set"]):
        console.print(results_table(table, set_name, cost))
    console.print(league_table(table, cost.caption))
    if source_calibration is not None and len(source_calibration):
        console.print(source_calibration_table(source_calibration))
    if metadata.heads:
        console.print(heads_table(table, metadata.heads, cost.caption))
    if batch_axis is not None and len(batch_axis):
        console.print(batch_axis_table(batch_axis, metadata.batch_axis.batch_costs))
    if wallclock is not None and len(wallclock):
        console.print(wallclock_table(wallclock, metadata.wallclock, cost.caption))
    for line in cost_lines(metadata):
        console.print(line, markup=False)
    for note in metadata.notes.values():
        console.print(f"note: {note}", markup=False)
    console.print("results: " + ", ".join(str(p) for p in files.values()), markup=False)
    for name, path in figures.items():
        console.print(f"figure {name}: {path if path else 'skipped (no data)'}", markup=False)
    console.print(f"evaluation took {metadata.seconds:.0f} s")
