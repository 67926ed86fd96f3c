"""``python -m data_gen.zoo``: ensure the tiny-code zoo and print its summary table."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from decode.zoo_dir import ENV_VAR

from . import ensure_zoo, zoo_summary_table
from .summary import realism_table
from .precision import PRECISIONS
from .recipe import ZooRecipe


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, build or load the zoo, print the summary."""
    parser = argparse.ArgumentParser(
        prog="python -m data_gen.zoo",
        description="Build (or load from cache) the tiny-code target/draft/companion models.",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"zoo directory (default: ${ENV_VAR} or ~/.cache/accept-heads/zoo/<version>)",
    )
    parser.add_argument("--rebuild", action="store_true", help="rebuild even if the cache is complete")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help="training precision: bf16 autocast or fp32; auto = bf16 only where the CPU runs it natively "
        "(a non-default choice is part of the recipe: give it its own --cache-dir)",
    )
    args = parser.parse_args(argv)
    zoo = ensure_zoo(args.cache_dir, rebuild=args.rebuild, recipe=ZooRecipe(precision=args.precision))
    console = Console()
    console.print(zoo_summary_table(zoo))
    console.print(realism_table(zoo))


if __name__ == "__main__":
    main()
