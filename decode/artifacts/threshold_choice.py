"""A head's stop threshold ``h``, chosen on dev by the evaluation, and the dev runs it was chosen from: one record,
:class:`ThresholdChoice`, in a file beside the head's (:func:`choice_name`: ``head.h_choice.json``; DESIGN §5).

``python -m accept_heads.evaluate`` decodes its dev prompts with the head at each ``h`` of its grid, chooses the one
of highest modelled throughput (ties to the smaller) and writes this record; a later evaluation whose key matches
(:meth:`ThresholdChoice.differences`) reuses its per-prompt rows. :func:`decode.load_head` reads ``h`` from the record
of that very file (:func:`matching_choice`) into ``head.threshold``, where :class:`decode.policies.Head` and the
``generate`` door find it; a head never evaluated has none.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from decode.artifacts.gguf import file_sha256
from decode.json_types import JSONDict

#: What a record's file is named after its head's file: ``head.safetensors`` → ``head.h_choice.json``.
CHOICE_SUFFIX = ".h_choice.json"
#: The key fields: equal keys decode equal dev rows (a threshold stop reads no price, so the prices the rows were
#: modelled at are recorded but no part of the key: a reuse models them again at its own). Each by the name a note
#: gives it.
KEY_FIELDS = {"head_sha256": "head", "prompts_sha256": "dev prompts", "settings": "settings"}


@dataclass(frozen=True)
class ThresholdChoice:
    """The ``h`` chosen for one head file, what it was chosen on and the dev runs it was chosen from.

    ``rows``: one per ``h`` of the grid, in order: ``h``, the run's totals over the dev prompts (``generated``,
    ``draft_calls``, ``target_calls``, ``discarded``, ``modelled_s`` at ``cost``, ``throughput`` in tokens per
    modelled second) and ``generations``, the evaluation's record of each dev prompt.
    """

    head_sha256: str  # of the head file it was chosen for
    prompts_sha256: str  # of the dev prompts: their ids and token ids, in order
    settings: JSONDict  # what else decides the dev rows: models, sampling, rule, seed, budget, K range, compile
    cost: JSONDict  # the prices the runs were modelled at and where they come from
    prompts: JSONDict  # the dev prompt set: source, split, count and prompt ids
    threshold: float  # the chosen h
    rows: tuple[JSONDict, ...]

    def differences(self, key: JSONDict) -> list[str]:
        """The key fields (:data:`KEY_FIELDS`, by name in ``key``) where ``key`` differs from this record's, by label
        (empty: the same dev runs)."""
        return [label for name, label in KEY_FIELDS.items() if getattr(self, name) != key[name]]

    def generations(self, h: float) -> list[JSONDict] | None:
        """The per-prompt records of the run at ``h`` (None: not in the grid)."""
        return next((list(row["generations"]) for row in self.rows if row["h"] == h), None)

    def write(self, path: Path) -> None:
        """Write the record to ``path`` (see :func:`decode.artifacts.serialization.save_threshold_choice`)."""
        path.write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> ThresholdChoice:
        """The record in ``path``; a one-line ValueError naming the file when it is not one."""
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            return cls(**{**doc, "threshold": float(doc["threshold"]), "rows": tuple(doc["rows"])})
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise ValueError(f"{path} is not a threshold choice written by accept_heads.evaluate ({error}): delete "
                             "it and evaluate again") from error


def choice_name(head_filename: str) -> str:
    """The name of a head file's record: ``head.safetensors`` → ``head.h_choice.json``."""
    return Path(head_filename).stem + CHOICE_SUFFIX


def choice_path(head_file: Path) -> Path:
    """Where the record of ``head_file`` lies: beside it."""
    return head_file.with_name(choice_name(head_file.name))


def matching_choice(head_file: Path, record: Path | None = None) -> ThresholdChoice | None:
    """The record of ``head_file`` (at ``record``, else :func:`choice_path`) when there is one and it was written
    for this very file (its sha256); None otherwise."""
    record = choice_path(head_file) if record is None else record
    if not record.is_file():
        return None
    choice = ThresholdChoice.read(record)
    return choice if choice.head_sha256 == file_sha256(head_file) else None

