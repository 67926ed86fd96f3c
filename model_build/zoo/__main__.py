"""``python -m model_build.zoo``: install (or verify) the shipped tiny-code trio, or rebuild it; print its tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from model_build.zoo.paths import ENV_VAR

from .realism import Realism
from .recipe import PRECISIONS, ZooRecipe
from .store import SHIPPED_DIR, ZooError, ZooRealismError, ensure_zoo, rebuild_zoo, shipped_metadata
from .summary import describe_origin, realism_table, zoo_summary_table


def parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m model_build.zoo",
        description="Install the shipped tiny-code target/draft/companion trio (copied, sha256-checked: the same "
        "bytes on every machine), or rebuild it from its recipe, and print its models and realism figures.",
    )
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help=f"zoo directory (default: ${ENV_VAR} or ~/.cache/accept-heads/zoo/<version>)")
    parser.add_argument("--reinstall", action="store_true",
                        help="replace what the directory holds (a rebuild, an old version, a corrupt file) with "
                        "the shipped trio")
    parser.add_argument("--rebuild", action="store_true",
                        help="train the trio from its recipe (how long it takes: docs/zoo.md), compare it with the "
                        "shipped one and install it only if it meets every realism target")
    parser.add_argument("--force", action="store_true", help="with --rebuild: install it even if it misses a target")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="with --rebuild: training precision (the shipped trio trained in fp32; bf16 autocast "
                        "needs a CPU with native bfloat16, else the rebuild trains in fp32; it trains other bytes)")
    parser.add_argument("--ship", action="store_true",
                        help=f"maintainers, with --rebuild: write the rebuild into the package ({SHIPPED_DIR}) as "
                        "the new shipped trio")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit status (0 ok, 1 a rebuild missed a realism target, 2 a bad zoo)."""
    args = parser().parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # logs and pipes: do not squeeze the tables into 80 columns
    if (args.force or args.ship or args.precision != "fp32") and not args.rebuild:
        print("error: --force, --ship and --precision go with --rebuild", file=sys.stderr)
        return 2
    try:
        if args.rebuild:
            recipe = ZooRecipe(precision=args.precision)
            target = SHIPPED_DIR if args.ship else args.cache_dir
            zoo = rebuild_zoo(target, recipe, require_realism=not args.force, ship=args.ship)
        else:
            zoo = ensure_zoo(args.cache_dir, reinstall=args.reinstall)
    except ZooRealismError as miss:
        console.print(realism_table(Realism.from_dict(miss.record["realism"]), _shipped_realism()))
        print(f"warning: {miss} [{describe_origin(miss.record)}]", file=sys.stderr)
        return 1
    except ZooError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    console.print(zoo_summary_table(zoo))
    console.print(realism_table(zoo.realism, _shipped_realism() if zoo.action == "rebuilt" else None))
    return 0


def _shipped_realism() -> Realism | None:
    shipped = shipped_metadata()
    return None if shipped is None else Realism.from_dict(shipped["realism"])


if __name__ == "__main__":
    sys.exit(main())
