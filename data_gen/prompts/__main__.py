"""``python -m data_gen.prompts``: check the shipped prompt sets and held-out text; ``--rebuild`` cuts them again.

The rebuild is a maintainer's tool: it reads the running Python's standard library, so on another
release than the manifest's it writes other prompts, and the README's tables no longer describe them.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

from data_gen.corpus import SPLITS, modules_in
from data_gen.prompts.shipped import (
    DATA_DIR,
    HELD_OUT_FILE,
    MANIFEST,
    Record,
    manifest,
    prompt_set_file,
    read_records,
    write_files,
)
from data_gen.prompts.stdlib_prompts import cut_prompts
from data_gen.prompts.types import PromptSourceError


def parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m data_gen.prompts",
        description="Check the built-in prompt sets and the zoo's held-out text shipped in data_gen/prompts/data "
        "against their sha256, and list them.",
    )
    parser.add_argument("--rebuild", action="store_true",
                        help="maintainers: cut them again from this Python's standard library and rewrite the files "
                        "and their manifest (another Python release writes other prompts)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help=f"the files' directory (default {DATA_DIR})")
    return parser


def stdlib_files() -> dict[str, list[Record]]:
    """Every shipped file's records, cut from the running Python's standard library."""
    files: dict[str, list[Record]] = {}
    for split in SPLITS:
        for style, prompts in cut_prompts(split).items():
            files[prompt_set_file(split, style)] = [{"id": p.id, "text": p.text, "reference": p.reference}
                                                    for p in prompts]
    files[HELD_OUT_FILE] = [{"module": module.name, "text": module.read()} for module in modules_in("dev")]
    return files


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit status (0 ok, 2 a file does not match its manifest)."""
    args = parser().parse_args(argv)
    try:
        before = {}
        if args.rebuild:
            if (args.data_dir / MANIFEST).is_file():
                before = manifest(args.data_dir)["files"]
            write_files(stdlib_files(), platform.python_version(), args.data_dir)
        shipped = manifest(args.data_dir)
        for name, entry in shipped["files"].items():
            read_records(name, args.data_dir)  # checks the sha256
            change = "" if not args.rebuild else " (unchanged)" if before.get(name) == entry else " (changed)"
            print(f"{name}: {entry['records']} records, sha256 {entry['sha256']}{change}")
    except PromptSourceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"cut from Python {shipped['python']}'s standard library")
    return 0


if __name__ == "__main__":
    sys.exit(main())
