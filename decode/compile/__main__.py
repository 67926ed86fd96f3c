"""``python -m decode.compile``: list the compiled graphs stored on this machine (:mod:`decode.compile.store`), prune
each model to its newest folders, or clear the store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from decode.compile.key_lock import read_lock
from decode.compile.store import COMMAND, KEEP, MANIFEST, STORE_ENV, GraphStore, Stored


def folder_size(folder: Path) -> int:
    """Bytes of the files under ``folder``."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else 0


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def state(store: GraphStore, entry: Stored) -> str:
    """Whether ``entry`` is being built (by whom), verified, refused (why) or unfinished."""
    owner = read_lock(store.lock_file(entry.folder.name))
    if owner is not None and owner.live():
        return f"being built by {owner}"
    if entry.key is None:
        return "no manifest (an unfinished build)" if entry.folder.is_dir() else "a lock without a folder"
    problem = GraphStore._problem(entry.folder / MANIFEST, entry.folder)
    return "verified" if problem is None else f"refused: {problem}"


def table(rows: list[list[str]]) -> str:
    """``rows`` (the first the header) as plain columns, each as wide as its widest cell."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def row(store: GraphStore, entry: Stored) -> list[str]:
    """One folder's line of the listing."""
    key = entry.key
    known = [key.model, str(key.cache_length), str(key.rows), str(key.threads), key.dtype] if key else ["?"] * 5
    return [entry.folder.name, *known, mib(folder_size(entry.folder)), entry.written or "-", state(store, entry)]


def listing(store: GraphStore) -> str:
    """The store's folders as a table, and a line of totals."""
    entries = store.stored()
    if not entries:
        return f"no compiled graphs in {store.root}"
    header = ["folder", "model", "cache", "rows", "threads", "dtype", "size", "written", "state"]
    total = sum(folder_size(entry.folder) for entry in entries)
    return (f"{table([header, *(row(store, entry) for entry in entries)])}\n{len(entries)} folders, {mib(total)} in "
            f"{store.root}; --prune keeps the newest {KEEP} of each model, --clear removes them all")


def clear(store: GraphStore) -> str:
    """Remove every folder of the store no live process builds; one line saying what went and what stayed."""
    sizes = {entry.folder: folder_size(entry.folder) for entry in store.stored()}
    kept = [folder for folder in sizes if not store.remove(folder)]
    line = f"removed {len(sizes) - len(kept)} folders ({mib(sum(sizes.values()) - sum(sizes[f] for f in kept))})"
    return f"{line} from {store.root}" + "".join(
        f"; kept {folder.name}, being built by {read_lock(store.lock_file(folder.name))}" for folder in kept)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (and exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m decode.compile.store``."""
    parse = OneLineParser(prog=COMMAND, description="List the compiled graphs stored on this machine (one folder per "
                          "model, cache length and rows), or remove them.")
    parse.add_argument("--dir", type=Path, default=None,
                       help=f"the store (default ${STORE_ENV}, else ~/.cache/accept-heads/compiled)")
    action = parse.add_mutually_exclusive_group()
    action.add_argument("--clear", action="store_true", help="remove every folder no live process is building")
    action.add_argument("--prune", action="store_true",
                        help=f"keep the newest {KEEP} folders of each model, cache length and rows; remove the others")
    return parse


def main(argv: list[str] | None = None) -> int:
    """List, prune or clear the store; one line and exit status 2 for a store that is no folder."""
    args = parser().parse_args(argv)
    store = GraphStore(None if args.dir is None else args.dir.expanduser())
    if store.root.exists() and not store.root.is_dir():
        print(f"error: {store.root} is no folder", file=sys.stderr)
        return 2
    try:
        if args.clear:
            print(clear(store))
        elif args.prune:
            print(f"removed {store.prune()} folders from {store.root} (the newest {KEEP} of each model kept)")
        else:
            print(listing(store))
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
