"""The one entry point: ``load_prompts(source, split, ...)``, plus the valid choices for config checks."""

from __future__ import annotations

import logging
import random

from data_gen.corpus import SPLITS
from data_gen.prompts import builtin
from data_gen.prompts.carve import Sizes, check_sizes
from data_gen.prompts.files import ALL, FILE_SUFFIXES, file_prompts, is_file_source
from data_gen.prompts.hub_datasets import HUB_SOURCES, hub_prompts
from data_gen.prompts.types import PromptSourceError
from runtime.prompt import Prompt
from runtime.templates import TEMPLATES

log = logging.getLogger(__name__)

FILE = "file"  # the kind of a source given as a path to a local file
SOURCES: tuple[str, ...] = (builtin.SOURCE, *HUB_SOURCES)  # plus any path ending in FILE_SUFFIXES
STYLES: dict[str, tuple[str, ...]] = {
    builtin.SOURCE: builtin.STYLES,
    **{name: (spec.style,) for name, spec in HUB_SOURCES.items()},
    FILE: ("text",),
}


def source_kind(source: str) -> str:
    """``builtin``, a hub dataset's name, or ``file`` for a local file path; ``ValueError`` otherwise."""
    if is_file_source(source):
        return FILE
    if source in SOURCES:
        return source
    raise ValueError(
        f"unknown prompt source {source!r}; choose one of {', '.join(SOURCES)}, "
        f"or a path to a {' / '.join(FILE_SUFFIXES)} file"
    )


def parse_source(spec: str) -> tuple[str, str | None]:
    """``source[:style]`` -> ``(source, style)``, e.g. ``builtin:module``; a file path comes back whole."""
    if is_file_source(spec) or ":" not in spec:
        return spec, None
    source, style = spec.rsplit(":", 1)
    return source, style


def available_splits(source: str) -> tuple[str, ...]:
    """The splits ``source`` offers (a local file also offers ``all``: the whole file)."""
    kind = source_kind(source)
    if kind == FILE:
        return (*SPLITS, ALL)
    if kind == builtin.SOURCE:
        return SPLITS
    return HUB_SOURCES[kind].splits


def validate(source: str, split: str, style: str | None = None, template: str | None = None) -> None:
    """Raise ``ValueError`` naming the valid choices if a source, split, style or template is unknown."""
    splits = available_splits(source)
    if split not in splits:
        raise ValueError(f"prompt source {source!r} has no split {split!r}; choose one of {', '.join(splits)}")
    styles = STYLES[source_kind(source)]
    if style is not None and style not in styles:
        raise ValueError(f"prompt source {source!r} has no style {style!r}; choose one of {', '.join(styles)}")
    if template is not None and template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {', '.join(TEMPLATES)}")


def load_prompts(
    source: str,
    split: str,
    *,
    size: int | None = None,
    style: str | None = None,
    seed: int = 0,
    path: str | None = None,
    revision: str | None = None,
    text_field: str = "text",
    id_field: str | None = None,
    sizes: Sizes | None = None,
    max_chars: int | None = None,
) -> list[Prompt]:
    """Prompts of one split of a source, shuffled with ``seed`` and capped at ``size``.

    Args:
        source: ``builtin``, ``alpaca``, ``humaneval``, ``gsm8k``, ``sharegpt``, or a path to a
            local ``.jsonl`` / ``.json`` / ``.parquet`` file.
        split: ``train`` / ``dev`` / ``test`` (see ``available_splits``; a file also has ``all``).
        size: keep the first ``size`` prompts of the seeded shuffle (a larger ``size`` is a
            superset); None: ``sizes[split]`` when that is a count, else all.
        style: builtin: ``function`` or ``module`` (None: both); other sources have one style.
        seed: shuffle seed; the same arguments always give the same list.
        path: hub sources only: a mirror hub id, or a local file with the dataset's fields.
        revision: hub sources only: the dataset revision to load.
        text_field, id_field: local files: the prompt field and an optional id field.
        sizes: prompts per split: a count, a fraction of the pool, or None for the rest. Data
            with one split (Alpaca, ShareGPT, local files, GSM8K's dev) is carved by these
            (defaults per source, e.g. Alpaca 40k / 10k / 2k); elsewhere a count caps the split.
        max_chars: drop prompts longer than this (default: keep all; the builtin prompts are cut
            to at most 600 characters).

    Raises:
        PromptSourceError: the data cannot be read (unreachable hub dataset, missing file) or
            yields no prompts. ``ValueError``: an unknown source, split, style or bad argument.
    """
    validate(source, split, style)
    kind = source_kind(source)
    if path is not None and kind not in HUB_SOURCES:
        raise ValueError(f"path= is for hub sources ({', '.join(HUB_SOURCES)}); give a file as source= instead")
    check_sizes(sizes or {})
    if size is None and isinstance((sizes or {}).get(split), int):
        size = sizes[split]
    if size is not None and size < 1:
        raise ValueError(f"size must be a positive number of prompts or None, not {size!r} (split {split!r})")
    if max_chars is not None and max_chars < 1:
        raise ValueError(f"max_chars must be a positive number of characters or None, not {max_chars!r}")
    if kind == builtin.SOURCE:
        prompts = [p for s in ([style] if style else builtin.STYLES) for p in builtin.builtin_prompts(split, s)]
    elif kind == FILE:
        prompts = file_prompts(source, split, text_field=text_field, id_field=id_field, sizes=sizes)
    else:
        prompts = hub_prompts(kind, split, path=path, revision=revision, sizes=sizes)
    if max_chars is not None:
        prompts = [p for p in prompts if len(p.message) <= max_chars]
    if not prompts:
        raise PromptSourceError(
            f"prompt source {source!r} split {split!r} (style {style}, max_chars {max_chars}) has no prompts"
        )
    random.Random(seed).shuffle(prompts)
    if size is not None and size > len(prompts):
        log.warning("prompt source %r split %r has %d prompts, fewer than size=%d", source, split, len(prompts), size)
    return prompts[:size]
