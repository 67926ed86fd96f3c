"""Rich summary tables of a built zoo: its models, and its realism figures against their targets."""

from __future__ import annotations

from rich.table import Table

from .build import Zoo
from .realism import Realism, RealismTargets
from .recipe import ROLES


def zoo_summary_table(zoo: Zoo) -> Table:
    """Per model: layers, hidden size, params, held-out loss and acceptance vs the target."""
    meta = zoo.metadata
    precision = meta.get("precision", {}).get("training", "bf16-autocast")
    built = f"built in {meta['build_seconds']:.1f} s with {meta['threads']} threads, {precision} training"
    timing = f"cache hit ({zoo.seconds:.2f} s; {built})" if zoo.cache_hit else built
    table = Table(
        title=f"{meta['name']} zoo {meta['zoo_version']} at {zoo.root}",
        caption=f"{timing}; held-out loss in nats/token on dev-split modules; "
        f"acceptance = mean 1 - TV(p, q) along target samples at temperature 1",
    )
    for column in ("model", "layers", "hidden", "params", "steps", "held-out loss", "acceptance vs target"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for role in ROLES:
        info = meta["models"][role]
        acceptance = info["acceptance_vs_target"]
        table.add_row(
            role,
            str(info["layers"]),
            str(info["hidden_size"]),
            f"{info['params'] / 1e6:.2f}M",
            str(info["steps"]),
            f"{info['held_out_loss']:.3f}",
            "-" if acceptance is None else f"{acceptance:.3f}",
        )
    return table


def realism_table(zoo: Zoo, targets: RealismTargets = RealismTargets()) -> Table:
    """The four realism figures of :mod:`data_gen.zoo.realism`, each with its target and a verdict."""
    record = dict(zoo.metadata["realism"])
    record.pop("failures")
    realism = Realism(**record)
    table = Table(title="realism on dev prompts (data_gen.zoo.realism)",
                  caption="enforced: a build that misses the target fails; tracked: reported only")
    for column in ("figure", "value", "target", "ok", "check"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for check in realism.checks(targets):
        verdict = "[green]yes[/green]" if check.ok else "[red]no[/red]"
        table.add_row(check.figure, check.value, check.target, verdict, "enforced" if check.enforced else "tracked")
    return table
