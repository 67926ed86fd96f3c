"""Figures of an evaluation, drawn from saved :class:`~accept_heads.evaluation.results.Results` (matplotlib, Agg).

Every ``draw_*`` function returns a :class:`matplotlib.figure.Figure`, or ``None`` when the results
hold nothing to draw (e.g. no exported head). :func:`draw_all` saves them as PNGs.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from accept_heads.evaluation.plan import recorded_choices
from accept_heads.evaluation.reliability import expected_calibration_error, reliability
from accept_heads.evaluation.results import Results
from accept_heads.measure.families import families, family_names
from decode.rules import from_spec

PALETTE = ("teal", "gold", "navy", "crimson", "olive")  # families that declare no colour, in table order


def family_color(family: str) -> str:
    """A family's colour in every figure: its declared ``color``, else the next of :data:`PALETTE`."""
    registered = families()
    if family in registered and registered[family].color:
        return registered[family].color
    uncoloured = [name for name, f in registered.items() if not f.color]
    return PALETTE[uncoloured.index(family) % len(PALETTE)] if family in uncoloured else "grey"


COST = "cost"  # the cost model's columns (cost.source: the configured pair, or this machine's measured costs)


def _panels(count: int, width: float = 4.6, height: float = 3.8) -> tuple[Figure, list[Axes]]:
    columns = min(count, 3)
    rows = math.ceil(count / columns)
    figure = Figure(figsize=(width * columns, height * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel().tolist()
    for extra in axes[count:]:
        extra.set_visible(False)
    return figure, axes[:count]


def _cost_note(results: Results) -> str:
    """Which costs the figure is modelled at (the ``cost`` model's caption, wrapped for a title)."""
    return textwrap.fill(results.metadata.cost_models["cost"]["caption"], 110)


def _family_label(family: str, artifact: object) -> str:
    return f"{family}[{artifact}]" if isinstance(artifact, str) else family


def _sweep_set(results: Results) -> str:
    return results.metadata.selection_set


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points not dominated in (x, y), both minimised, sorted by x."""
    order = np.lexsort((y, x))
    front, best = [], math.inf
    for i in order:
        if y[i] < best:
            front.append(i)
            best = y[i]
    return np.asarray(front, dtype=int)


def _configured(rule_params: pd.Series, results: Results, rule: str) -> pd.Series:
    """The rows at ``rule``'s configured parameters, not at another point of its swept parameter's grid."""
    spec = results.metadata.rule_specs[rule]
    value = from_spec(spec["name"], **spec["params"]).value
    return rule_params.isna() if value is None else rule_params == value


def draw_pareto(results: Results, set_name: str | None = None) -> Figure | None:
    """Verification rate vs discard rate, one panel per rule, one frontier per policy family."""
    set_name = set_name or _sweep_set(results)
    table = results.table[(results.table["set"] == set_name) & results.table["discard_rate"].notna()]
    if table.empty:
        return None
    rules = list(dict.fromkeys(table["rule"]))
    figure, axes = _panels(len(rules))
    for ax, rule in zip(axes, rules):
        rows = table[(table["rule"] == rule) & _configured(table["rule_param"], results, rule)]
        for (family, artifact), group in rows.groupby(["family", "artifact"], dropna=False, sort=False):
            x, y = group["discard_rate"].to_numpy(float), group["verification_rate"].to_numpy(float)
            color = family_color(family)
            label = _family_label(family, artifact)
            ax.scatter(x, y, color=color, s=18, alpha=0.6, label=label)
            if len(group) > 1:
                front = pareto_front(x, y)
                ax.plot(x[front], y[front], color=color, lw=1.2)
            chosen = group[group["chosen_on"] == "dev"]
            ax.scatter(chosen["discard_rate"], chosen["verification_rate"], color=color, marker="*", s=120,
                       edgecolor="black", linewidth=0.5)
        ax.set(title=f"{rule} — {set_name}", xlabel="discard rate (discarded / token)",
               ylabel="verification rate (target calls / token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figure.suptitle("Pareto frontier per policy family (lower-left is better; ★ = chosen on dev)")
    return figure


def draw_throughput_vs_k(results: Results) -> Figure | None:
    """Modelled speed-up (∝ throughput) of fixed K per rule, with the other policies' values as references."""
    set_name = _sweep_set(results)
    table = results.table[results.table["set"] == set_name]
    fixed = table[table["family"] == "fixed"]
    if fixed.empty:
        return None
    rules = list(dict.fromkeys(fixed["rule"]))
    figure, axes = _panels(len(rules))
    for ax, rule in zip(axes, rules):
        rows = fixed[fixed["rule"] == rule].sort_values("param")
        ax.plot(rows["param"], rows[f"speedup_target_{COST}"], "o-", color=family_color("fixed"),
                label="fixed K (cost model)")
        ax.plot(rows["param"], rows["speedup_target_fitted"], "o--", color="grey", alpha=0.7,
                label="fixed K (fitted pair)")
        chosen = rows[rows["chosen_on"] == "dev"]
        ax.scatter(chosen["param"], chosen[f"speedup_target_{COST}"], marker="*", s=160, color="gold",
                   edgecolor="black", zorder=3, label="chosen on dev")
        same_rule = table[table["rule"] == rule]
        others = same_rule[same_rule["family"].isin(family_names(runner="decode")) & (same_rule["family"] != "fixed")
                           & (~same_rule["family"].isin(family_names(tuned=True)) | (same_rule["chosen_on"] == "dev"))]
        for _, row in others.iterrows():
            ax.axhline(row[f"speedup_target_{COST}"], color=family_color(row["family"]), ls=":", lw=1,
                       label=row["policy"])
        ax.set(title=f"{rule} — {set_name}", xlabel="K (draft tokens per round)",
               ylabel="modelled speed-up over the target alone")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figure.suptitle(f"Throughput vs K, at {_cost_note(results)}")
    return figure


def draw_throughput_vs_h(results: Results) -> Figure | None:
    """Modelled throughput of every head vs its stop threshold h, against the best fixed K."""
    set_name = _sweep_set(results)
    table = results.table[results.table["set"] == set_name]
    heads = table[table["family"] == "head"]
    if heads.empty:
        return None
    keys = list(dict.fromkeys(zip(heads["rule"], heads["artifact"])))
    figure, axes = _panels(len(keys))
    for ax, (rule, artifact) in zip(axes, keys):
        rows = heads[(heads["rule"] == rule) & (heads["artifact"] == artifact)].sort_values("param")
        ax.plot(rows["param"], rows[f"speedup_target_{COST}"], "o-", color=family_color("head"),
                label=f"head[{artifact}]")
        chosen = rows[rows["chosen_on"] == "dev"]
        ax.scatter(chosen["param"], chosen[f"speedup_target_{COST}"], marker="*", s=160, color="gold",
                   edgecolor="black", zorder=3, label="chosen on dev")
        fixed = table[(table["rule"] == rule) & (table["family"] == "fixed") & (table["chosen_on"] == "dev")]
        for _, row in fixed.iterrows():
            ax.axhline(row[f"speedup_target_{COST}"], color=family_color("fixed"), ls="--",
                       label=f"best {row['policy']}")
        ax.set(title=f"{rule} — head[{artifact}] — {set_name}", xlabel="stop threshold h",
               ylabel="modelled speed-up over the target alone")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figure.suptitle(f"Throughput vs h, at {_cost_note(results)}")
    return figure


def draw_calibration(results: Results) -> Figure | None:
    """Reliability diagram of every head on its dev positions (mean label per predicted-probability bin)."""
    frame = results.calibration
    if frame.empty:
        return None
    heads = list(dict.fromkeys(frame["head"]))
    figure, axes = _panels(len(heads))
    for ax, name in zip(axes, heads):
        rows = frame[frame["head"] == name]
        bins = reliability(rows)
        ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, label="perfect calibration")
        ax.plot(bins["pred"], bins["label"], "o-", color=family_color("head"), label="head")
        share = ax.twinx()
        share.bar((bins["lo"] + bins["hi"]) / 2, bins["count"].fillna(0) / len(rows), width=0.09, alpha=0.2,
                  color="grey")
        share.set_ylabel("share of positions")
        meta = results.metadata.heads.get(name, {})
        auroc = meta.get("dev_metrics", {}).get("val/auroc")
        auroc_text = f", AUROC {auroc:.3f}" if auroc is not None else ", AUROC undefined (one class)"
        ax.set(title=f"head[{name}] ({meta.get('timing', '?')}, {meta.get('rule', {}).get('name', '?')})\n"
                     f"ECE {expected_calibration_error(rows):.3f}{auroc_text}",
               xlabel="predicted acceptance P̂", ylabel="mean acceptance label", xlim=(0, 1), ylim=(0, 1))
        ax.legend(fontsize=7, loc="upper left")
    figure.suptitle(f"Head calibration on dev positions ({len(frame)} positions)")
    return figure


def draw_sv_profile(results: Results) -> Figure | None:
    """SV profile: mean acceptance per (X-bin, Y-bin), and H(A) vs H(A | X, Y)."""
    profiles = results.metadata.profiles
    if not profiles:
        return None
    figure, axes = _panels(2 * len(profiles))
    for index, (name, profile) in enumerate(profiles.items()):
        heat, bars = axes[2 * index], axes[2 * index + 1]
        table = np.asarray(profile["table"], float)
        image = heat.imshow(table.T, origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=1)
        figure.colorbar(image, ax=heat, label="mean target acceptance")
        x_edges, y_edges = profile["x_edges"], profile["y_edges"]
        heat.set_xticks(range(len(x_edges) - 1), [f"{(a + b) / 2:.2f}" for a, b in zip(x_edges, x_edges[1:])],
                        rotation=90, fontsize=6)
        heat.set_yticks(range(len(y_edges) - 1), [f"{(a + b) / 2:.2f}" for a, b in zip(y_edges, y_edges[1:])],
                        fontsize=6)
        heat.set(title=f"profile[{name}]: acceptance by (X, Y) bin", xlabel="X = Σ min(q, c) (bin centre)",
                 ylabel="Y = min(1, c(y)/q(y)) (bin centre)")
        information = profile.get("information", {})
        splits = [s for s in ("train", "dev") if s in information]
        positions = np.arange(len(splits))
        bars.bar(positions - 0.2, [information[s]["h_a"] for s in splits], width=0.4, label="H(A)")
        bars.bar(positions + 0.2, [information[s]["h_a_given_xy"] for s in splits], width=0.4, label="H(A | X, Y)")
        for x, split in zip(positions, splits):
            bars.annotate(f"gain {100 * information[split]['gain_fraction']:.0f}%", (x, information[split]["h_a"]),
                          ha="center", va="bottom", fontsize=8)
        bars.set_xticks(positions, splits)
        top = max((information[s]["h_a"] for s in splits), default=1.0)
        bars.set(title="information gain of the profile", ylabel="bits", ylim=(0, 1.25 * top))
        bars.legend(fontsize=7, loc="upper right")
    figure.suptitle("Speculative Verification profile")
    return figure


def draw_fsd(results: Results) -> Figure | None:
    """FSD: divergence threshold T vs mean accepted length and vs agreement with the target's greedy token."""
    table = results.table
    k = next((c.param for c in recorded_choices(results.metadata) if c.swept == "rule_param" and c.rule == "fuzzy"),
             None)
    fuzzy = table[(table["rule"] == "fuzzy") & (table["role"] != "dev") & (table["family"] == "fixed")
                  & (table["source"] == "decode") & (table["param"] == k)]
    fuzzy = fuzzy[fuzzy["set"] == (fuzzy["set"].iloc[0] if not fuzzy.empty else None)].sort_values("rule_param")
    if fuzzy["rule_param"].nunique() < 2:
        return None
    set_name = fuzzy["set"].iloc[0]
    references = table[(table["set"] == set_name) & table["rule"].isin(["speculative", "greedy"])
                       & (table["family"] == "fixed") & (table["chosen_on"] == "dev")]
    figure, (length_ax, quality_ax) = _panels(2)
    divergence = results.metadata.rule_specs["fuzzy"]["params"]["divergence"].upper()
    length_ax.plot(fuzzy["rule_param"], fuzzy["mean_accepted_length"], "o-", color="tab:brown",
                   label=f"fuzzy, {fuzzy['policy'].iloc[0]}")
    quality_ax.plot(fuzzy["rule_param"], fuzzy["target_agreement"], "o-", color="tab:brown", label="fuzzy")
    for _, row in references.iterrows():
        style = {"speculative": "--", "greedy": ":"}[row["rule"]]
        length_ax.axhline(row["mean_accepted_length"], color="grey", ls=style, label=f"{row['rule']} {row['policy']}")
        quality_ax.axhline(row["target_agreement"], color="grey", ls=style, label=f"{row['rule']} (lossless)")
    length_ax.set(xlabel=f"{divergence} threshold T", ylabel="mean accepted length (tokens / target call)",
                  title=f"FSD acceptance length — {set_name}")
    quality_ax.set(xlabel=f"{divergence} threshold T", ylabel="agreement with the target's greedy token",
                   title="quality proxy (teacher-forced target argmax match)")
    for ax in (length_ax, quality_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figure.suptitle("Fuzzy speculative decoding: divergence threshold trade-off")
    return figure


def se_expected_speedup(alpha: float, gamma: np.ndarray, c: float) -> np.ndarray:
    """DESIGN §4: ``(1 − α^γ)(1 + c) / ((1 − α)(1 + cγ))``."""
    return (1 - alpha**gamma) * (1 + c) / ((1 - alpha) * (1 + c * gamma))


def draw_se(results: Results) -> Figure | None:
    """Speculative Ensemble: speed-up over the plain ensemble (both models every token) vs the proposal length γ,
    on the sweep set (dev)."""
    table = results.table[(results.table["rule"] == "ensemble") & (results.table["set"] == _sweep_set(results))]
    se = table[table["family"].isin(["se-sd", "se-alternate"])]
    fixed = table[table["family"] == "fixed"].sort_values("param")
    if se.empty and fixed.empty:
        return None
    cost = results.metadata.cost_models["cost"]
    figure, (ax,) = _panels(1, width=6.5)
    for family, group in se.groupby("family", sort=False):
        group = group.sort_values("param")
        ax.plot(group["param"], group[f"speedup_plain_ensemble_{COST}"], "o-",
                label=f"EnsembleDecoder {family.removeprefix('se-')} ({group['set'].iloc[0]})")
    if not fixed.empty:
        ax.plot(fixed["param"], fixed[f"speedup_plain_ensemble_{COST}"], "s--", alpha=0.7,
                label=f"SpeculativeDecoder, ensemble rule, fixed K ({fixed['set'].iloc[0]})")
        first = [p[0] for p in fixed["per_position_acceptance"] if len(p) and not math.isnan(p[0])]
        if first:
            alpha = float(np.clip(np.mean(first), 1e-6, 1 - 1e-6))
            gamma = np.arange(1, int(fixed["param"].max()) + 1)
            ax.plot(gamma, se_expected_speedup(alpha, gamma, cost["t_draft"] / cost["t_target"]), ":", color="grey",
                    label=f"DESIGN §4 formula, α = {alpha:.2f}")
    ax.axhline(1.0, color="black", lw=0.8, label="plain ensemble")
    ax.set(xlabel="γ (draft proposals per round)", ylabel="modelled speed-up over the plain ensemble",
           title=f"Speculative Ensemble, at {_cost_note(results)}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return figure


def draw_batch_axis(results: Results) -> Figure | None:
    """Throughput over the target alone vs batch size, per rule: modelled (solid) and measured (dashed)."""
    axis = results.batch_axis
    if axis.empty:
        return None
    test = axis[(axis["role"] == "test") & (axis["family"] != "target")]
    rules = list(dict.fromkeys(test["rule"]))
    figure, axes = _panels(len(rules))
    for ax, rule in zip(axes, rules):
        rows = test[test["rule"] == rule]
        # one line per policy: fixed K and SV's drafted k chosen per B on dev (chosen_on) are one line each
        for (family, artifact, chosen), group in rows.groupby(["family", "artifact", "chosen_on"], dropna=False,
                                                              sort=False):
            group = group.sort_values("batch")
            color = family_color(family)
            per_b = " (K per B on dev)" if family == "fixed" else " (k = K per B)" if family == "sv" and chosen else ""
            ax.plot(group["batch"], group["x_target"], "s-." if family == "sv" and chosen else "o-", color=color,
                    label=_family_label(family, artifact) + per_b)
            ax.plot(group["batch"], group["x_target_measured"], "x--", color=color, alpha=0.5, lw=1)
        ax.axhline(1.0, color="black", lw=1, label="target alone")
        ax.set_xscale("log", base=2)
        ax.set(title=f"{rule} — {rows['set'].iloc[0]}", xlabel="batch size B", ylabel="throughput / target alone")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figure.suptitle("Batch axis: solid = modelled at the batch costs measured on this device, dashed = measured")
    return figure


FIGURES: dict[str, Callable[[Results], Figure | None]] = {
    "pareto": draw_pareto,
    "throughput_vs_k": draw_throughput_vs_k,
    "throughput_vs_h": draw_throughput_vs_h,
    "calibration": draw_calibration,
    "sv_profile": draw_sv_profile,
    "fsd": draw_fsd,
    "se": draw_se,
    "batch_axis": draw_batch_axis,
}


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes (for ``IPython.display.Image`` in the notebooks)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def save(figure: Figure, path: Path) -> Path:
    """Write ``figure`` as a PNG (creating the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def draw(name: str, results: Results) -> Path | None:
    """Draw one figure of :data:`FIGURES` into ``<results>/figures/<name>.png``; None when there is no data."""
    figure = FIGURES[name](results)
    return None if figure is None else save(figure, results.figure_dir / f"{name}.png")


def draw_all(results: Results) -> dict[str, Path | None]:
    """Every figure; ``None`` for those without data."""
    return {name: draw(name, results) for name in FIGURES}
