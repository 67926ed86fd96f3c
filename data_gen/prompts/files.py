"""Local prompt files (``.jsonl`` / ``.json`` / ``.parquet``, the first two also gzipped), read through
``datasets.load_dataset``."""

from __future__ import annotations

from pathlib import Path

import datasets
from datasets.exceptions import DatasetsError

from data_gen.prompts.carve import Sizes, carve, content_key, first_per_id
from data_gen.prompts.types import PromptSourceError
from runtime.prompt import Prompt

STYLE = "text"
FILE_SUFFIXES: dict[str, str] = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}  # suffix -> builder
DEFAULT_SIZES: dict[str, int | float | None] = {"test": 0.1, "dev": 0.1, "train": None}
ALL = "all"  # the split that takes the whole file, uncarved


def file_suffix(path: str | Path) -> str:
    """The suffix that says what a file holds: ``.jsonl`` for ``x.jsonl`` and for ``x.jsonl.gz``."""
    path = Path(path)
    return Path(path.stem).suffix.lower() if path.suffix.lower() == ".gz" else path.suffix.lower()


def is_file_source(source: str) -> bool:
    """Whether ``source`` names a local prompt file (by its suffix)."""
    return file_suffix(source) in FILE_SUFFIXES


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``, at most 200 characters."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:200]


def read_table(path: str | Path, what: str = "prompt file") -> datasets.Dataset:
    """Every row of a local ``.jsonl`` / ``.json`` (records or a list of records) / ``.parquet`` file.

    ``what`` names the file in the one-line errors (prompt file, responses).
    """
    path = Path(path).expanduser()
    builder = FILE_SUFFIXES.get(file_suffix(path))
    if builder is None:
        raise PromptSourceError(f"{what} {path}: unsupported suffix; use one of {', '.join(FILE_SUFFIXES)}")
    if not path.is_file():
        raise PromptSourceError(f"{what} {path} does not exist; fix: give the path of an existing file")
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except (OSError, ValueError, DatasetsError) as error:
        raise PromptSourceError(f"cannot read {what} {path} ({one_line(error)}); fix: check its format") from error


def require_columns(table: datasets.Dataset, columns: tuple[str, ...], where: str, hint: str) -> None:
    """Raise ``PromptSourceError`` if the table lacks one of ``columns``."""
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise PromptSourceError(
            f"{where} has no field {', '.join(map(repr, missing))} (fields: {', '.join(table.column_names)}); {hint}"
        )


def file_prompts(
    path: str | Path,
    split: str,
    *,
    text_field: str = "text",
    id_field: str | None = None,
    sizes: Sizes | None = None,
) -> list[Prompt]:
    """Prompts of one split of a local file: ``all`` is the whole file, train/dev/test are carved from it.

    Ids are ``<file name>/<id field>`` or ``<file name>/<content hash>``; rows with an empty text are skipped.
    """
    table = read_table(path)
    columns = (text_field,) if id_field is None else (text_field, id_field)
    require_columns(table, columns, f"prompt file {path}", "fix: set text_field / id_field")
    name, source = Path(path).name, str(path)
    pool = []
    for row in table:
        text = row[text_field]
        if not isinstance(text, str) or not text.strip():
            continue
        key = content_key(text)[:16] if id_field is None else row[id_field]
        pool.append(Prompt(id=f"{name}/{key}", text=text, source=source, split=split, style=STYLE))
    pool = first_per_id(pool)
    if split == ALL:
        return pool
    return carve(pool, split, {**DEFAULT_SIZES, **(sizes or {})})
