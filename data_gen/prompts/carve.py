"""Deterministic train/dev/test carving of a single pool of prompts (for sources with one split)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence

from runtime.prompt import Prompt

# int: a count; float in (0, 1]: a fraction of the pool; None: all that is left.
Sizes = Mapping[str, int | float | None]

CARVE_ORDER: tuple[str, ...] = ("test", "dev", "train")  # held-out splits first: they move least as the pool grows


def content_key(text: str, context: str = "") -> str:
    """Hex SHA-256 of a prompt's content (text and context); identical prompts share a key."""
    return hashlib.sha256(f"{text}\0{context}".encode()).hexdigest()


def first_per_id(pool: Sequence[Prompt]) -> list[Prompt]:
    """The pool with later prompts that repeat an earlier prompt's id dropped."""
    by_id: dict[str, Prompt] = {}
    for prompt in pool:
        by_id.setdefault(prompt.id, prompt)
    return list(by_id.values())


def carve(pool: Sequence[Prompt], split: str, sizes: Sizes) -> list[Prompt]:
    """The prompts of ``split``, relabelled, from a pool ordered by content hash.

    Duplicated content is kept once, so the same prompt never lands in two splits. Splits are
    taken in ``CARVE_ORDER`` as consecutive runs of the hash order; a split absent from
    ``sizes`` gets nothing. Which prompts land in which split depends on the pool's contents,
    not on its order.
    """
    by_key: dict[str, Prompt] = {}
    for prompt in pool:
        by_key.setdefault(content_key(prompt.text, prompt.context), prompt)
    ordered = [by_key[key] for key in sorted(by_key)]
    start = 0
    for name in CARVE_ORDER:
        size = sizes.get(name, 0)
        if size is None:
            count = len(ordered) - start
        elif isinstance(size, float):
            count = round(size * len(ordered))
        else:
            count = size
        if name == split:
            return [dataclasses.replace(p, split=split) for p in ordered[start : start + count]]
        start += count
    raise ValueError(f"cannot carve split {split!r}; carved splits are {', '.join(CARVE_ORDER)}")


def check_sizes(sizes: Sizes) -> None:
    """Raise ``ValueError`` unless every key is a split and every value a count, a fraction or None."""
    for name, size in sizes.items():
        if name not in CARVE_ORDER:
            raise ValueError(f"sizes: unknown split {name!r}; choose from {', '.join(CARVE_ORDER)}")
        ok = (
            size is None
            or (isinstance(size, float) and 0.0 < size <= 1.0)
            or (isinstance(size, int) and not isinstance(size, bool) and size >= 0)
        )
        if not ok:
            raise ValueError(
                f"sizes[{name!r}] = {size!r}; use a count (int >= 0), a fraction in (0, 1], or None for the rest"
            )
