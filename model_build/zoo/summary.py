"""Rich summary tables of a zoo: its models, and its realism figures against their targets."""

from __future__ import annotations

from rich.table import Table

from model_build.model_store import ROLES

from .realism import Realism, RealismCheck, RealismTargets
from .store import Zoo

_ACTIONS = {"verified": "verified", "installed": "installed from the package", "rebuilt": "rebuilt"}


def describe_origin(metadata: dict) -> str:
    """Where a trio comes from: the shipped reference build, or a rebuild (and whether it equals the shipped one)."""
    machine = metadata["machine"]
    built = (f"trained in {metadata['precision']} on a {machine['cpu_capability']} CPU path, {machine['threads']} "
             f"threads, torch {machine['torch']}, in {metadata['build_seconds']:.0f} s")
    if metadata["origin"] == "shipped":
        return f"the shipped reference build ({built})"
    same = metadata.get("matches_shipped")
    verdict = "byte-identical to" if same else "differs from"
    return f"a rebuild ({built}), {verdict} the shipped trio"


def zoo_summary_table(zoo: Zoo) -> Table:
    """Per model: layers, hidden size, params, steps, held-out loss and acceptance vs the target."""
    meta = zoo.record
    table = Table(
        title=f"{meta['name']} zoo {meta['zoo_version']} at {zoo.root}",
        caption=f"{_ACTIONS[zoo.action]} in {zoo.seconds:.2f} s: {describe_origin(meta)}; held-out loss in "
        f"nats/token on dev-split modules; acceptance = mean 1 - TV(p, q) along T = 1 target responses "
        f"to the evaluation's dev prompts",
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


def realism_table(realism: Realism, reference: Realism | None = None,
                  targets: RealismTargets = RealismTargets()) -> Table:
    """Every realism figure with its target and margin; beside ``reference`` (the shipped trio's) when given."""
    return checks_table("realism of the trio (model_build.zoo.realism)", realism.checks(targets),
                        reference.checks(targets) if reference else None)


def checks_table(title: str, checks: list[RealismCheck], reference: list[RealismCheck] | None = None) -> Table:
    """Figures against their targets, with margins (and a reference build's values beside them when given)."""
    table = Table(title=title, caption="margin: how far inside its target a figure is (negative: missed)")
    columns = ["prompt set / figure", "value", *(["shipped"] if reference else []), "target", "margin", "ok"]
    for column in columns:
        table.add_column(column, justify="left" if column == "prompt set / figure" else "right")
    shipped = {c.name: c.value for c in reference} if reference else {}
    for check in checks:
        verdict = "[green]yes[/green]" if check.ok else "[red]no[/red]"
        margin = "-" if check.margin is None else f"{check.margin:+.3f}"
        set_name = check.name.rpartition("/")[0]
        label = f"{set_name}: {check.figure}" if set_name else check.figure
        table.add_row(label, check.value, *([shipped.get(check.name, "-")] if reference else []), check.target,
                      margin, verdict)
    return table
