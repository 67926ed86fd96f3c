"""Responses produced outside the collection job: the file format, its sidecar, and reading them as token ids.

A responses source is a JSONL, JSON or Parquet file or an HF ``datasets`` directory (``save_to_disk``)
with one row per prompt:

``prompt_id`` (optional)      the prompt's id; default: a hash of the prompt
``split`` (optional)          train / dev / test; rows without one are carved by content hash
``prompt`` or ``prompt_ids``  the prompt exactly as the target saw it: rendered text, or token ids
``response`` or ``response_ids``  what the target produced after it (text, token ids, or both)
``finish_reason`` or ``finished``  ``"stop"`` / true: the response ended with EOS; ``"length"``: cut

Beside it, ``<PATH>.meta.json`` (:class:`ResponsesMeta`) says what produced the responses: the model
and its revision, the sampling transform, the token budget and whether the file is complete. The
collection checks it against the run's config, since labels describe the run's transform only if
the responses are samples of it (docs/collect-and-train.md, "Collecting from responses").

A directory written by ``data_gen.collect`` is a source too (its manifest is the sidecar): its
responses can be labelled again, e.g. for another draft, without running the target's decode loop.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from ahconf.schema import CollectJob, ConfigError, ModelSpec, SamplingConfig
from data_gen.manifest import read_manifest
from data_gen.prompts.carve import carve, content_key
from data_gen.prompts.files import read_table
from data_gen.shards import MANIFEST_FILE, load_split, write_json_atomic
from decode.json_types import JSON, JSONDict
from runtime.prompt import Prompt

RESPONSES_FORMAT = 1
META_SUFFIX = ".meta.json"


@dataclass(frozen=True)
class ResponsesMeta:
    """The sidecar ``<PATH>.meta.json``: what produced the responses of ``PATH``.

    ``model`` / ``revision``: the target as the run's ``models.target`` names it; ``sampling``: the
    transform (``temperature`` 0 = greedy, ``top_k``, ``top_p``); ``max_tokens``: the response
    budget; ``seed``: per-prompt seeds were :func:`runtime.seeding.prompt_seed` of it (null:
    unknown); ``complete``: false while a regeneration is still filling the file.
    """

    model: str
    sampling: JSONDict
    max_tokens: int
    complete: bool = True
    revision: str | None = None
    seed: int | None = None
    engine: str = "unknown"
    servers: list[str] = field(default_factory=list)
    served_model: str | None = None
    tokenizer_hash: str | None = None
    format: int = RESPONSES_FORMAT

    def to_dict(self) -> JSONDict:
        return asdict(self)

    def settings(self) -> JSONDict:
        """What decides the responses (a resumed regeneration must match it): not progress, nor which servers."""
        return {k: v for k, v in self.to_dict().items() if k not in ("complete", "servers", "served_model")}


def meta_path(path: str | Path) -> Path:
    """The sidecar of a responses source: ``<PATH>.meta.json`` beside the file or directory."""
    path = Path(path)
    return path.parent / f"{path.name}{META_SUFFIX}"


def write_meta(path: str | Path, meta: ResponsesMeta) -> None:
    write_json_atomic(meta_path(path), meta.to_dict())


def is_collection(path: str | Path) -> bool:
    """Whether ``path`` is a directory written by ``data_gen.collect`` (it has a manifest)."""
    return (Path(path) / MANIFEST_FILE).is_file()


def read_meta(path: str | Path) -> ResponsesMeta:
    """The sidecar of ``path``; a missing or malformed one is a :class:`ConfigError` naming what to write."""
    if is_collection(path):
        manifest, _ = read_manifest(path)
        target = manifest.model("target")
        model, revision = ("", None) if target is None else (target.id, target.revision)
        return ResponsesMeta(model=model, revision=revision, sampling=manifest.sampling,
                             max_tokens=manifest.max_new_tokens, seed=manifest.seed, engine="data_gen.collect",
                             tokenizer_hash=manifest.tokenizer_hash)
    sidecar = meta_path(path)
    example = ('{"model": "<the target\'s id>", "sampling": {"temperature": 1.0, "top_k": null, "top_p": null}, '
               '"max_tokens": 512}')
    if not sidecar.is_file():
        raise ConfigError(f"{path} has no sidecar {sidecar}; write one saying what produced the responses, "
                          f"e.g. {example}")
    try:
        doc = json.loads(sidecar.read_text())
        known = {f.name for f in fields(ResponsesMeta)}
        meta = ResponsesMeta(**{k: v for k, v in doc.items() if k in known})
        SamplingConfig(**meta.sampling)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{sidecar} is not a responses sidecar ({error}); it needs at least {example}") from None
    if meta.format > RESPONSES_FORMAT:
        raise ConfigError(f"{sidecar} is format {meta.format}; this version reads format {RESPONSES_FORMAT}")
    return meta


def check_meta(meta: ResponsesMeta, path: str | Path, *, target: str, revision: str | None,
               sampling: SamplingConfig) -> None:
    """Refuse responses that are not the run's target sampled under the run's transform, or unfinished."""
    if not meta.complete:
        raise ConfigError(f"{path} is incomplete (its regeneration was interrupted); run `python -m "
                          "data_gen.regenerate` again with the same config to finish it")
    if (meta.model, meta.revision) != (target, revision):
        raise ConfigError(f"{path} holds responses of {meta.model} (revision {meta.revision}), but the run's target is "
                          f"{target} (revision {revision}); labels need the target's own responses")
    wanted = asdict(sampling)
    given = {key: meta.sampling.get(key) for key in wanted}
    if given != wanted:
        raise ConfigError(f"{path} was sampled with {given}, but the run's sampling is {wanted}; labels describe the "
                          "run's transform only for responses sampled under it: set sampling.* to match")


@dataclass(frozen=True)
class GivenResponse:
    """One row of a responses source as token ids, ready to label (a finished response ends with EOS)."""

    prompt_id: str
    prompt_ids: list[int]
    response_ids: list[int]


def file_digest(path: str | Path) -> str:
    """SHA-256 over the source's bytes (a directory: its files in name order)."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def read_rows(path: str | Path) -> list[JSONDict]:
    """The rows of a JSONL file, a Parquet file, a ``save_to_disk`` dataset directory or a collection."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"responses {path} do not exist; pass responses=PATH to a JSONL, Parquet or dataset "
                                "directory (or produce one with `python -m data_gen.regenerate`)")
    if is_collection(path):
        manifest, _ = read_manifest(path)
        keep = ["prompt_id", "prompt_ids", "response_ids", "finished"]
        return [{**row, "split": split} for split, stats in manifest.splits.items() if stats["responses"]
                for row in load_split(path, split).select_columns(keep).to_list()]
    if path.is_dir():
        import datasets

        return datasets.load_from_disk(str(path)).to_list()
    if path.suffix == ".jsonl":
        return list(_jsonl_rows(path))  # line by line: a line cut short by a crash is named by its number
    return read_table(path, "responses").to_list()  # .json, .parquet (any other suffix: one line naming them)


def _jsonl_rows(path: Path) -> Iterator[JSONDict]:
    with path.open() as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"{path}:{number} is not a JSON object (a truncated line?); fix or remove it"
                                  ) from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{number} is not a JSON object")
            yield row


def _field(row: JSONDict, names: tuple[str, str], where: str) -> tuple[str, JSON]:
    for name in names:
        if row.get(name) is not None:
            return name, row[name]
    raise ConfigError(f"{where} has neither {' nor '.join(names)}; every row needs one of them")


@dataclass
class Tokenized:
    """What :func:`given_responses` kept; rows it skipped and what it noticed, by reason."""

    rows: list[GivenResponse]
    skipped: Counter = field(default_factory=Counter)  # duplicate_prompt_id, empty, too_long
    notes: Counter = field(default_factory=Counter)  # retokenization_differs, cut_to_max_new_tokens


def given_responses(
    rows: list[JSONDict],
    split: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    add_special_tokens: bool,
    sizes: dict[str, int],
    max_new_tokens: int,
    context: int,
    source: str,
) -> Tokenized:
    """The rows of ``split`` as token ids, as the decoder would see them.

    Text prompts are tokenized like :func:`runtime.encoding.encode_prompts` tokenizes a rendered
    prompt (``add_special_tokens``); text responses without special tokens, followed by EOS when the
    row finished. Where a row gives ``response_ids`` they are used (EOS appended to a finished row
    that lacks it), and a row whose text would re-tokenize differently is counted
    (``retokenization_differs``). Rows without a ``split`` are carved into ``sizes`` by content
    hash. A repeated prompt id keeps its first row; a row longer than the models' ``context`` is
    skipped; responses over ``max_new_tokens`` are cut to it (counted; no longer finished).
    """
    has_split = any(row.get("split") is not None for row in rows)
    skipped: Counter = Counter()
    notes: Counter = Counter()
    if has_split:
        picked = [(i, row) for i, row in enumerate(rows) if row.get("split") == split]
    else:
        pool = [Prompt(id=str(i), text=_prompt_key(row), source="responses", split="pool", style="")
                for i, row in enumerate(rows)]
        picked = [(int(p.id), rows[int(p.id)]) for p in carve(pool, split, sizes)]
    eos = tokenizer.eos_token_id
    seen: set[str] = set()
    kept: list[GivenResponse] = []
    for index, row in picked:
        where = f"{source} row {index}"
        prompt_id = str(row.get("prompt_id") or content_key(_prompt_key(row)))
        if prompt_id in seen:
            skipped["duplicate_prompt_id"] += 1
            continue
        seen.add(prompt_id)
        kind, prompt = _field(row, ("prompt_ids", "prompt"), where)
        prompt_ids = list(prompt) if kind == "prompt_ids" else tokenizer(
            prompt, add_special_tokens=add_special_tokens, verbose=False)["input_ids"]
        finished = _finished(row, where)
        kind, response = _field(row, ("response_ids", "response"), where)
        if kind == "response_ids":
            response_ids = [int(t) for t in response]
            if finished and eos is not None and response_ids[-1:] != [eos]:
                response_ids.append(eos)
            text = row.get("response")
            if text is not None and _encode_response(tokenizer, text, finished) != response_ids:
                notes["retokenization_differs"] += 1
        else:
            response_ids = _encode_response(tokenizer, response, finished)
        if not prompt_ids or not response_ids:
            skipped["empty"] += 1
            continue
        if len(response_ids) > max_new_tokens:
            response_ids = response_ids[:max_new_tokens]
            notes["cut_to_max_new_tokens"] += 1
        if len(prompt_ids) + len(response_ids) > context:
            skipped["too_long"] += 1
            continue
        kept.append(GivenResponse(prompt_id, [int(t) for t in prompt_ids], response_ids))
    return Tokenized(kept, skipped, notes)


def _prompt_key(row: JSONDict) -> str:
    prompt = row.get("prompt") if row.get("prompt") is not None else row.get("prompt_ids")
    return prompt if isinstance(prompt, str) else json.dumps([int(t) for t in prompt or []])


def _finished(row: JSONDict, where: str) -> bool:
    if row.get("finished") is not None:
        return bool(row["finished"])
    reason = row.get("finish_reason")
    if reason in ("stop", "eos"):
        return True
    if reason in ("length", None):
        return False
    raise ConfigError(f"{where}: finish_reason {reason!r} is neither 'stop' nor 'length' (a stop string or an abort "
                      "leaves a response the target did not end); drop the row or regenerate it")


def _encode_response(tokenizer: PreTrainedTokenizerBase, text: str, finished: bool) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return list(ids) + ([tokenizer.eos_token_id] if finished and tokenizer.eos_token_id is not None else [])


@dataclass
class ResponsesSource:
    """A responses source opened for labelling: checked against the run, read once, split by split."""

    path: Path
    meta: ResponsesMeta
    rows: list[JSONDict]
    digest: str
    notes: dict[str, dict[str, int]] = field(default_factory=dict)  # split → :attr:`Tokenized.notes`

    @classmethod
    def open(cls, path: str | Path, target: ModelSpec, sampling: SamplingConfig) -> ResponsesSource:
        """Read ``path`` after checking its sidecar against the run's target and sampling (:func:`check_meta`)."""
        if not Path(path).exists():
            read_rows(path)  # the one-line error for a missing source
        meta = read_meta(path)
        check_meta(meta, path, target=target.id, revision=target.revision, sampling=sampling)
        rows = read_rows(path)
        if not rows:
            raise ConfigError(f"responses {path} hold no rows")
        return cls(Path(path).resolve(), meta, rows, file_digest(path))

    def describe(self) -> JSONDict:
        """What identifies the source (the collection's fingerprint and manifest record it)."""
        return {"path": str(self.path), "sha256": self.digest, "meta": self.meta.settings()}

    def record(self) -> JSONDict:
        """What the manifest records: :meth:`describe` and, per split, what the tokenization noticed."""
        return {**self.describe(), "notes": self.notes}

    def split(self, split: str, tokenizer: PreTrainedTokenizerBase, job: CollectJob, context: int) -> Tokenized:
        """:func:`given_responses` of ``split`` under the run's template, sizes and budget."""
        tokenized = given_responses(
            self.rows, split, tokenizer, add_special_tokens=job.prompts.template != "chat",
            sizes=dict(job.prompts.sizes), max_new_tokens=job.collect.max_new_tokens, context=context,
            source=str(self.path),
        )
        self.notes[split] = dict(tokenized.notes)
        return tokenized


class ResponsesWriter:
    """Append-only JSONL of regenerated responses; resumable after any interruption, ``kill -9`` included.

    Each row is one ``write`` of one line followed by ``flush`` and ``fsync``. On opening, a last
    line cut short by a crash is dropped (the file is truncated to its last newline) and the
    ``(split, prompt_id)`` keys already written are returned by :meth:`done`, so a rerun writes
    every missing row once and nothing twice.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._done: set[tuple[str, str]] = set()
        if self.path.exists():
            self._truncate_partial_line()
            self._done = {(row["split"], row["prompt_id"]) for row in _jsonl_rows(self.path)}
        self._handle = self.path.open("a")

    def _truncate_partial_line(self) -> None:
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            with self.path.open("r+b") as handle:
                handle.truncate(end)

    def done(self) -> set[tuple[str, str]]:
        return set(self._done)

    def write(self, row: JSONDict) -> None:
        key = (row["split"], row["prompt_id"])
        if key in self._done:
            return
        self._handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._done.add(key)

    def close(self) -> None:
        self._handle.close()
