"""Figures of an evaluation, drawn from saved :class:`~accept_heads.evaluation.results.Results` (matplotlib, Agg).

One figure per question. Every ``draw_*`` function returns a :class:`matplotlib.figure.Figure`, or ``None`` when the
results hold nothing to draw (e.g. no exported head); :func:`draw_all` saves them as PNGs. Runs are coloured by their
family (:func:`source_family`, :func:`family_color`); legends sit outside the axes.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from accept_heads.evaluation.reliability import expected_calibration_error, reliability
from accept_heads.evaluation.results import Results
from accept_heads.evaluation.table import at_dev_choice, best_training_free
from accept_heads.measure.families import families, family, family_names
from decode.policy_specs import source_stop_kinds
from decode.rules import Rule, from_spec

PALETTE = ("teal", "gold", "navy", "crimson", "olive")  # families that declare no colour, in table order
COST = "cost"  # the cost model's columns (cost.source: the configured pair, or this machine's measured costs)
THROUGHPUT = f"throughput_{COST}"  # what the best run of a family is chosen by on dev, as the dev choices are
REFERENCE = "best fixed K"  # the league's reference, first in each of its panels
BEST_FREE = "best training-free"  # the mark of the league family whose source is the best training-free one
MARKERS = "● learned source, ■ training-free source, ▲ bound, ◆ other policy"  # :func:`_marker`


def family_color(family: str) -> str:
    """A family's colour in every figure: its declared ``color``, else the next of :data:`PALETTE`."""
    registered = families()
    if family in registered and registered[family].color:
        return registered[family].color
    uncoloured = [name for name, f in registered.items() if not f.color]
    return PALETTE[uncoloured.index(family) % len(PALETTE)] if family in uncoloured else "grey"


def source_family(kind: str) -> str:
    """The family a run of ``kind`` is drawn as: the acceptance source it reads (``head-goodput`` → ``head``), else
    its kind."""
    return source_stop_kinds().get(kind, (kind,))[0]


def _marker(kind: str) -> str:
    """A run's marker by its side (:data:`MARKERS`)."""
    traits = family(kind)
    return {"learned": "o", "training-free": "s"}.get(traits.league or "", "^" if traits.bound else "D")


def _panels(count: int, columns: int = 3, width: float = 4.6, height: float = 3.8) -> tuple[Figure, list[Axes]]:
    columns = min(count, columns)
    rows = math.ceil(count / columns)
    figure = Figure(figsize=(width * columns, height * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel().tolist()
    for extra in axes[count:]:
        extra.set_visible(False)
    return figure, axes[:count]


def _legend_outside(ax: Axes) -> None:
    """The panel's legend to the right of its axes, never over the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, frameon=False)


def _cost_note(results: Results) -> str:
    """Which costs the figure is modelled at (the ``cost`` model's caption, wrapped for a title)."""
    return textwrap.fill(results.metadata.cost_models["cost"].caption, 110)


def _family_label(family: str, artifact: object) -> str:
    return f"{family}[{artifact}]" if isinstance(artifact, str) else family


def _sweep_set(results: Results) -> str:
    return results.metadata.selection_set


def _rule(results: Results, rule: str) -> Rule:
    """``rule`` as the evaluation configured it."""
    spec = results.metadata.rule_specs[rule]
    return from_spec(spec["name"], **spec["params"])


def _rule_title(results: Results, rule: str, rule_param: Any) -> str:
    """``rule``, with its swept parameter's value where the table tells its configurations apart by one."""
    return rule if pd.isna(rule_param) else f"{rule} ({_rule(results, rule).primary} = {rule_param:g})"


def _set_title(table: pd.DataFrame, set_name: str) -> str:
    role = table.loc[table["set"] == set_name, "role"].iloc[0]
    return set_name if role == set_name else f"{set_name} ({role.upper() if role == 'ood' else role})"


def _key(values: tuple) -> tuple:
    return tuple(None if pd.isna(v) else v for v in values)


def _matching(table: pd.DataFrame, **values: Any) -> pd.Series:
    """The rows whose columns equal ``values`` (a missing value matches a missing one)."""
    mask = pd.Series(True, index=table.index)
    for column, value in values.items():
        mask &= table[column].isna() if pd.isna(value) else table[column] == value
    return mask


def best_of_families(table: pd.DataFrame, kinds: list[str]) -> pd.Series:
    """The rows of each family's best run among ``kinds`` per rule and rule parameter: the kind, artifact and
    parameter at their dev choice whose dev run has the highest :data:`THROUGHPUT`; its rows in every set."""
    candidates = table["family"].isin(kinds) & at_dev_choice(table)
    dev = table[candidates & (table["role"] == "dev") & table[THROUGHPUT].notna()]
    keys = ["rule", "rule_param", "family", "artifact", "param"]
    groups = dev.groupby([dev["rule"], dev["rule_param"], dev["family"].map(source_family)], dropna=False, sort=False)
    best = {_key(dev.loc[index, keys]) for index in groups[THROUGHPUT].idxmax()}
    return candidates & pd.Series([_key(row) in best for row in table[keys].itertuples(index=False)],
                                  index=table.index)


def _configured(rule_params: pd.Series, results: Results, rule: str) -> pd.Series:
    """The rows at ``rule``'s configured parameters, not at another point of its swept parameter's grid."""
    value = _rule(results, rule).value
    return rule_params.isna() if value is None else rule_params == value


def _sweep_panels(results: Results, set_name: str, shown: pd.DataFrame) -> tuple[Figure, list[tuple[Axes, str]]]:
    """One panel per rule of ``shown`` (stacked, each with its legend at its right), titled by rule and set."""
    rules = list(dict.fromkeys(shown["rule"]))
    figure, axes = _panels(len(rules), columns=1, width=9.0, height=3.6)
    for ax, rule in zip(axes, rules):
        ax.set_title(f"{_rule_title(results, rule, _rule(results, rule).value)} — "
                     f"{_set_title(results.table, set_name)}")
        ax.grid(alpha=0.3)
    return figure, list(zip(axes, rules))


def _fixed_k(ax: Axes, rows: pd.DataFrame, x: str, y: str) -> None:
    """Fixed K over its grid (``rows``; each point named by its K where ``x`` is not K), ★ at its dev choice."""
    rows = rows.sort_values("param")
    named = x != "param"
    ax.plot(rows[x], rows[y], "o-", color=family_color("fixed"), ms=4,
            label="fixed K over its grid" + (" (each point's K beside it)" if named else ""))
    if named:
        for _, row in rows.iterrows():
            ax.annotate(f"{row['param']:g}", (row[x], row[y]), xytext=(3, 3), textcoords="offset points", fontsize=7,
                        color=family_color("fixed"))
    for _, row in rows[rows["chosen_on"] == "dev"].iterrows():
        ax.scatter(row[x], row[y], marker="*", s=220, color=family_color("fixed"), edgecolor="black", linewidth=0.7,
                   zorder=2.5, label=f"{row['policy']}, chosen on dev")


def _best_point(ax: Axes, row: pd.Series, x: float, y: float) -> None:
    """One family's best run, in its colour and league marker, labelled by its policy."""
    ax.plot(x, y, _marker(row["family"]), color=family_color(source_family(row["family"])), ms=8, mec="black",
            mew=0.6, alpha=0.9, label=row["policy"], zorder=3)


def _against_fixed_k(results: Results, set_name: str, x: str, y: str,
                     best_x: Callable[[pd.Series], float]) -> tuple[Figure, list[Axes]] | None:
    """Per rule on ``set_name``, ``y`` against ``x``: fixed K over its grid (★ its dev choice) and each family's best
    run (chosen on dev) at ``best_x`` of its row; None without fixed-K rows."""
    table = results.table[results.table[y].notna()]
    kinds = [k for k in family_names(runner="decode") if k != "fixed"]
    best = table[best_of_families(table, kinds) & (table["set"] == set_name)]
    fixed = table[(table["set"] == set_name) & (table["family"] == "fixed")]
    if fixed.empty:
        return None
    figure, panels = _sweep_panels(results, set_name, fixed)
    for ax, rule in panels:
        _fixed_k(ax, fixed[(fixed["rule"] == rule) & _configured(fixed["rule_param"], results, rule)], x, y)
        for _, row in best[(best["rule"] == rule) & _configured(best["rule_param"], results, rule)].iterrows():
            _best_point(ax, row, best_x(row), row[y])
        _legend_outside(ax)
    return figure, [ax for ax, _ in panels]


def draw_pareto(results: Results, set_name: str | None = None) -> Figure | None:
    """Verification rate against discard rate per rule: fixed K over its grid (★ its dev choice) and each family's
    best run (chosen on dev), lower-left better."""
    drawn = _against_fixed_k(results, set_name or _sweep_set(results), "discard_rate", "verification_rate",
                             lambda row: row["discard_rate"])
    if drawn is None:
        return None
    figure, axes = drawn
    for ax in axes:
        ax.set(xlabel="discard rate (discarded drafts / token)", ylabel="verification rate (target calls / token)")
    figure.suptitle(f"Pareto: fixed K against each family's best run (chosen on dev); lower-left is better\n{MARKERS}")
    return figure


def draw_throughput_vs_k(results: Results) -> Figure | None:
    """Modelled speed-up over the target alone against draft tokens per round, per rule on the sweep set: fixed K
    over its grid (★ its dev choice) and each family's best run at its mean drafted tokens per round."""
    drawn = _against_fixed_k(results, _sweep_set(results), "param", f"speedup_target_{COST}",
                             lambda row: row["drafted"] / row["rounds"])
    if drawn is None:
        return None
    figure, axes = drawn
    for ax in axes:
        ax.set(xlabel="draft tokens per round (K; a policy's mean)", ylabel="modelled speed-up over the target alone")
    figure.suptitle(f"Throughput against K: fixed K and each family's best run (chosen on dev), at\n"
                    f"{_cost_note(results)}\n{MARKERS}")
    return figure


def draw_throughput_vs_h(results: Results) -> Figure | None:
    """Modelled speed-up over the target alone against the stop threshold h, per rule on the sweep set: each family's
    best run with an h over its grid (★ its dev choice), against the best fixed K."""
    set_name = _sweep_set(results)
    table = results.table[results.table["set"] == set_name]
    kinds = [k for k in family_names(runner="decode", tuned=True) if family(k).symbol == "h"]
    best = table[best_of_families(table, kinds)]
    if best.empty:
        return None
    figure, panels = _sweep_panels(results, set_name, best)
    column = f"speedup_target_{COST}"
    for ax, rule in panels:
        fixed = table[(table["rule"] == rule) & (table["family"] == "fixed") & (table["chosen_on"] == "dev")
                      & _configured(table["rule_param"], results, rule)]
        for _, row in fixed.iterrows():
            ax.axhline(row[column], color=family_color("fixed"), ls="--", lw=1.2, label=f"best {row['policy']}")
        for _, row in best[(best["rule"] == rule) & _configured(best["rule_param"], results, rule)].iterrows():
            color = family_color(source_family(row["family"]))
            curve = table[_matching(table, rule=rule, rule_param=row["rule_param"], family=row["family"],
                                    artifact=row["artifact"])].sort_values("param")
            ax.plot(curve["param"], curve[column], ":" if family(row["family"]).bound else "-",
                    marker=_marker(row["family"]), ms=4, color=color,
                    label=_family_label(row["family"], row["artifact"]))
            ax.scatter(row["param"], row[column], marker="*", s=220, color=color, edgecolor="black", linewidth=0.7,
                       zorder=4)
        ax.set(xlabel="stop threshold h", ylabel="modelled speed-up over the target alone")
        _legend_outside(ax)
    figure.suptitle(f"Throughput against h: each family's best run with an h (★ = chosen on dev), at\n"
                    f"{_cost_note(results)}\n{MARKERS}; a bound dotted")
    return figure


def league_entries(table: pd.DataFrame) -> pd.DataFrame:
    """The league's rows on the test / OOD sets: the best fixed K (chosen on dev), then each league family's best
    source × stop (:func:`best_of_families`; learned, then training-free), with an ``entry`` column naming the
    reference or the family and a ``best_free`` column marking the family whose source is the best training-free one
    (:func:`best_training_free`, drawn once, as its family's entry)."""
    kinds = family_names(league="learned") + family_names(league="training-free")
    order = list(dict.fromkeys(map(source_family, kinds)))
    held_out = table["role"] != "dev"
    fixed = table[held_out & (table["family"] == "fixed") & (table["chosen_on"] == "dev")].assign(entry=REFERENCE)
    rows = held_out & best_of_families(table, kinds)
    league = table[rows].assign(entry=lambda r: r["family"].map(source_family),
                                best_free=best_training_free(table, THROUGHPUT)[rows])
    ordered = league.sort_values("entry", key=lambda c: c.map(order.index), kind="stable")
    return pd.concat([fixed.assign(best_free=False), ordered], ignore_index=True)


def _league_key() -> list[Line2D]:
    """What the league's marks mean (its panels' references are coloured by their family)."""
    grey = {"color": "grey", "mec": "black", "mew": 0.6, "ms": 7, "ls": "none"}
    return [Line2D([], [], marker="D", label="reference", **grey),
            Line2D([], [], marker="o", label="learned source", **grey),
            Line2D([], [], marker="s", label="training-free source", **grey),
            Line2D([], [], color=family_color("fixed"), lw=1, label="the best fixed K"),
            Line2D([], [], color="grey", ls="--", lw=1, label=f"the {BEST_FREE} source (labelled)")]


def draw_league(results: Results) -> Figure | None:
    """The predictor league per rule and test / OOD set: each family's best source × stop (chosen on dev) as × the best
    fixed K with its 95 % paired-bootstrap interval, below the best fixed K; the best training-free source is its
    family's entry, labelled and drawn as a dashed line through the panel."""
    entries = league_entries(results.table)
    families_drawn = entries[entries["entry"] != REFERENCE]
    if families_drawn.empty:
        return None
    panels = list(dict.fromkeys(_key(rule) for rule in zip(families_drawn["rule"], families_drawn["rule_param"])))
    sets = list(dict.fromkeys(families_drawn["set"]))
    height = 0.9 + 0.32 * entries.groupby(["set", "rule", "rule_param"], dropna=False).size().max()
    figure, axes = _panels(len(panels) * len(sets), columns=len(sets), width=7.0, height=height)
    column = f"speedup_fixed_{COST}"
    for ax, ((rule, rule_param), set_name) in zip(axes, ((p, s) for p in panels for s in sets)):
        rows = entries[_matching(entries, set=set_name, rule=rule, rule_param=rule_param)]
        for y, (_, row) in enumerate(rows.iterrows()):
            color = family_color(source_family(row["family"]))
            value, low, high = row[column], row[f"{column}_lo"], row[f"{column}_hi"]
            marker = "D" if row["entry"] == REFERENCE else _marker(row["family"])
            error = None if pd.isna(low) else [[value - low], [high - value]]
            ax.errorbar(value, y, xerr=error, fmt=marker, color=color, ms=7, mec="black", mew=0.6, capsize=3, lw=1.5)
        ax.axvline(1.0, color=family_color("fixed"), lw=1, zorder=0)
        for _, free in rows[rows["best_free"]].iterrows():
            ax.axvline(free[column], color=family_color(free["entry"]), ls="--", lw=1, zorder=0)
        ax.set_yticks(range(len(rows)), [f"{REFERENCE}: {policy}" if entry == REFERENCE
                                         else f"{policy} ({BEST_FREE})" if best_free else policy
                                         for entry, policy, best_free in zip(rows["entry"], rows["policy"],
                                                                             rows["best_free"])], fontsize=9)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.margins(x=0.12)
        ax.set_title(f"{_rule_title(results, rule, rule_param)} — {_set_title(results.table, set_name)}")
        ax.grid(axis="x", alpha=0.3)
    for ax in axes[-len(sets):]:
        ax.set_xlabel("modelled throughput × the best fixed K\n(95 % paired-bootstrap interval over prompts)")
    figure.legend(handles=_league_key(), loc="outside lower center", ncols=5, fontsize=9, frameon=False)
    figure.suptitle(f"Predictor league: each family's best source × stop (chosen on dev), at\n{_cost_note(results)}")
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
        ax.errorbar(bins["pred"], bins["label"], yerr=1.96 * bins["label_se"].fillna(0), fmt="o-", capsize=2,
                    color=family_color("head"),
                    label="head (±1.96 s.e. of a bin's mean label, positions as independent)")
        share = ax.twinx()
        share.bar((bins["lo"] + bins["hi"]) / 2, bins["count"].fillna(0) / len(rows), width=0.09, alpha=0.2,
                  color="grey")
        share.set_ylabel("share of positions")
        meta = results.metadata.heads[name].metadata
        auroc = meta.dev_metrics.get("val/auroc")
        auroc_text = f", AUROC {auroc:.3f}" if auroc is not None else ", AUROC undefined (one class)"
        ax.set(title=f"head[{name}] ({meta.head_config.timing}, {meta.rule['name']})\n"
                     f"ECE {expected_calibration_error(rows):.3f}{auroc_text}",
               xlabel="predicted acceptance P̂", ylabel="mean acceptance label", xlim=(0, 1), ylim=(0, 1))
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=9, frameon=False)
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
        table = np.asarray(profile.table, float)
        image = heat.imshow(table.T, origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=1)
        figure.colorbar(image, ax=heat, label="mean target acceptance")
        x_edges, y_edges = profile.x_edges, profile.y_edges
        heat.set_xticks(range(len(x_edges) - 1), [f"{(a + b) / 2:.2f}" for a, b in zip(x_edges, x_edges[1:])],
                        rotation=90, fontsize=7)
        heat.set_yticks(range(len(y_edges) - 1), [f"{(a + b) / 2:.2f}" for a, b in zip(y_edges, y_edges[1:])],
                        fontsize=7)
        heat.set(title=f"profile[{name}]: acceptance by (X, Y) bin", xlabel="X = Σ min(q, c) (bin centre)",
                 ylabel="Y = min(1, c(y)/q(y)) (bin centre)")
        information = profile.metadata.information
        splits = [s for s in ("train", "dev") if s in information]
        positions = np.arange(len(splits))
        bars.bar(positions - 0.2, [information[s].h_a for s in splits], width=0.4, label="H(A)")
        bars.bar(positions + 0.2, [information[s].h_a_given_xy for s in splits], width=0.4, label="H(A | X, Y)")
        for x, split in zip(positions, splits):
            bars.annotate(f"gain {100 * information[split].gain_fraction:.0f}%", (x, information[split].h_a),
                          ha="center", va="bottom", fontsize=8)
        bars.set_xticks(positions, splits)
        top = max((information[s].h_a for s in splits), default=1.0)
        bars.set(title="information gain of the profile", ylabel="bits", ylim=(0, 1.25 * top))
        _legend_outside(bars)
    figure.suptitle("Speculative Verification profile")
    return figure


def draw_fsd(results: Results) -> Figure | None:
    """FSD: divergence threshold T vs mean accepted length and vs agreement with the target's greedy token."""
    table = results.table
    k = next((c.param for c in results.metadata.selection if c.swept == "rule_param" and c.rule == "fuzzy"), None)
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
        _legend_outside(ax)
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
    cost = results.metadata.cost_models["cost"].model
    figure, (ax,) = _panels(1, width=9.5)
    for kind, group in se.groupby("family", sort=False):
        group = group.sort_values("param")
        ax.plot(group["param"], group[f"speedup_plain_ensemble_{COST}"], "o-",
                label=f"EnsembleDecoder {kind.removeprefix('se-')} ({group['set'].iloc[0]})")
    if not fixed.empty:
        ax.plot(fixed["param"], fixed[f"speedup_plain_ensemble_{COST}"], "s--", alpha=0.7,
                label=f"SpeculativeDecoder, ensemble rule, fixed K ({fixed['set'].iloc[0]})")
        first = [p[0] for p in fixed["per_position_acceptance"] if len(p) and not math.isnan(p[0])]
        if first:
            alpha = float(np.clip(np.mean(first), 1e-6, 1 - 1e-6))
            gamma = np.arange(1, int(fixed["param"].max()) + 1)
            ax.plot(gamma, se_expected_speedup(alpha, gamma, cost.t_draft / cost.t_target), ":", color="grey",
                    label=f"DESIGN §4 formula, α = {alpha:.2f}")
    ax.axhline(1.0, color="black", lw=0.8, label="plain ensemble")
    ax.set(xlabel="γ (draft proposals per round)", ylabel="modelled speed-up over the plain ensemble",
           title=f"Speculative Ensemble, at {_cost_note(results)}")
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    return figure


def draw_batch_axis(results: Results) -> Figure | None:
    """Throughput over the target alone vs batch size, per rule: modelled (solid) and measured (dashed)."""
    axis = results.batch_axis
    if axis.empty:
        return None
    test = axis[(axis["role"] == "test") & (axis["family"] != "target")]
    rules = list(dict.fromkeys(test["rule"]))
    figure, axes = _panels(len(rules), columns=1, width=9.0, height=4.2)
    for ax, rule in zip(axes, rules):
        rows = test[test["rule"] == rule]
        # one line per policy: fixed K and SV's drafted k chosen per B on dev (chosen_on) are one line each
        for (kind, artifact, chosen), group in rows.groupby(["family", "artifact", "chosen_on"], dropna=False,
                                                            sort=False):
            group = group.sort_values("batch")
            color = family_color(kind)
            per_b = " (K per B on dev)" if kind == "fixed" else " (k = K per B)" if kind == "sv" and chosen else ""
            ax.plot(group["batch"], group["x_target"], "s-." if kind == "sv" and chosen else "o-", color=color,
                    label=_family_label(kind, artifact) + per_b)
            ax.plot(group["batch"], group["x_target_measured"], "x--", color=color, alpha=0.5, lw=1)
        ax.axhline(1.0, color="black", lw=1, label="target alone")
        ax.set_xscale("log", base=2)
        ax.set(title=f"{rule} — {rows['set'].iloc[0]}", xlabel="batch size B", ylabel="throughput / target alone")
        ax.grid(alpha=0.3)
        _legend_outside(ax)
    figure.suptitle("Batch axis: solid = modelled at the batch costs measured on this device, dashed = measured")
    return figure


FIGURES: dict[str, Callable[[Results], Figure | None]] = {
    "league": draw_league,
    "throughput_vs_k": draw_throughput_vs_k,
    "throughput_vs_h": draw_throughput_vs_h,
    "pareto": draw_pareto,
    "calibration": draw_calibration,
    "sv_profile": draw_sv_profile,
    "fsd": draw_fsd,
    "se": draw_se,
    "batch_axis": draw_batch_axis,
}


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes (for ``IPython.display.Image`` in the notebooks), its legends and titles inside."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight", pad_inches=0.15)
    return buffer.getvalue()


def save(figure: Figure, path: Path) -> Path:
    """Write ``figure`` as a PNG (creating the folder), its legends and titles inside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.15)
    return path


def draw(name: str, results: Results) -> Path | None:
    """Draw one figure of :data:`FIGURES` into ``<results>/figures/<name>.png``; None when there is no data."""
    figure = FIGURES[name](results)
    return None if figure is None else save(figure, results.figure_dir / f"{name}.png")


def draw_all(results: Results) -> dict[str, Path | None]:
    """Every figure; ``None`` for those without data."""
    return {name: draw(name, results) for name in FIGURES}
