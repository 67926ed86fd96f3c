"""The running Python's standard library source: the zoo's training corpus, and what the shipped text was cut from.

Only maintainers' commands read it: ``python -m model_build.zoo --rebuild`` trains on the train split,
``python -m data_gen.prompts --rebuild`` cuts the built-in prompt sets and the held-out dev text
shipped in ``data_gen/prompts/data``, which every other path reads (:mod:`data_gen.prompts.shipped`).

Modules are assigned to ``train`` / ``dev`` / ``test`` by a stable hash of their dotted
name, so the split is the same on every machine and Python version that has the module.
Test packages (``test``, ``tests``, ``idle_test`` …) and ``test_*.py`` files are excluded.
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

Split = Literal["train", "dev", "test"]
SPLITS: tuple[Split, ...] = ("train", "dev", "test")

# Percent of modules (by name hash) in each split: 80 / 10 / 10.
_SPLIT_BOUNDS = {"train": 80, "dev": 90, "test": 100}
_EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib-dynload"}
)
_EXCLUDED_PREFIXES = ("config-",)  # build config directories, not library code


@dataclass(frozen=True)
class StdlibModule:
    """One source file of the standard library."""

    name: str  # dotted module name, e.g. "json.decoder"
    path: Path

    @property
    def split(self) -> Split:
        return split_of(self.name)

    def read(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace")


def stdlib_root() -> Path:
    """Directory holding the standard library's ``.py`` files (also inside a venv)."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(module_name: str) -> Split:
    """Stable, machine-independent split of a module, by the hash of its dotted name."""
    bucket = int(hashlib.sha256(module_name.encode()).hexdigest(), 16) % 100
    for split in SPLITS:
        if bucket < _SPLIT_BOUNDS[split]:
            return split
    raise AssertionError("unreachable")


def _is_excluded(relative: Path) -> bool:
    parts = relative.parts
    if any(p in _EXCLUDED_DIRS or p.startswith(_EXCLUDED_PREFIXES) for p in parts[:-1]):
        return True
    return parts[-1].startswith("test_")


@lru_cache(maxsize=4)
def stdlib_modules(root: Path | None = None) -> tuple[StdlibModule, ...]:
    """All non-test standard-library modules, sorted by dotted name."""
    root = Path(root) if root is not None else stdlib_root()
    modules = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if _is_excluded(relative):
            continue
        dotted = ".".join(relative.with_suffix("").parts)
        if dotted.endswith(".__init__"):
            dotted = dotted[: -len(".__init__")]
        modules.append(StdlibModule(dotted, path))
    return tuple(sorted(modules, key=lambda m: m.name))


def modules_in(split: Split, root: Path | None = None) -> tuple[StdlibModule, ...]:
    """Modules of one split."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    return tuple(m for m in stdlib_modules(root) if m.split == split)


def corpus_hash(modules: Sequence[tuple[str, str]]) -> str:
    """SHA-256 over ``(module name, text)`` pairs: identifies the exact training or held-out text."""
    digest = hashlib.sha256()
    for name, text in modules:
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()
