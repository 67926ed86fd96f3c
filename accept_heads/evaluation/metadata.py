"""An evaluation's metadata record: what ``results.json`` (and the Parquet schema) holds, typed.

Plain dataclasses and JSON values only, as :mod:`~accept_heads.evaluation.results` (where the notebooks start) reads
it. The nested values stay the JSON the stages describe themselves as (models, cost models, heads, ...).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

JSON = dict[str, Any]
#: Fields a results file may lack (written without the batch axis, the wall clock, a stored cost profile).
OPTIONAL = ("batch_axis", "wallclock", "cost_profile", "seconds")


@dataclass(frozen=True)
class EvaluationMetadata:
    """Models, sampling, rules, prompt sets and seeds, the dev selection, costs and settings of one evaluation."""

    command: str
    exp_name: str
    code_version: str
    models: JSON  # the trio's description (ids, revisions, dtypes, tokenizer hash)
    device: str
    torch_threads: int
    sampling: JSON
    rules: JSON  # the rules config (names, params)
    eval_rules: list[str]  # the rules decoded
    rule_specs: dict[str, JSON]  # each decoded rule's spec (name, params)
    seed: int
    seeding: str
    max_new_tokens: int
    sets: list[JSON]  # each prompt set's description (name, role, count, ...)
    selection_set: str
    selection: list[JSON]  # the dev choices (accept_heads.evaluation.plan.Choice as a dict)
    selection_criterion: str
    cost: JSON  # the cost config
    cost_models: dict[str, JSON]  # the model behind each *_cost / *_fitted column ("cost", "fitted")
    cost_fit: JSON
    cost_fit_tuples: str
    batching: str
    latency: JSON
    hf: JSON
    decoding: JSON  # the decoding config the run decoded by
    evaluate: JSON  # the evaluate config the run decoded by
    dev_grids: dict[str, list[float]]
    heads: dict[str, JSON]  # each evaluated head's metadata by name
    profiles: dict[str, JSON]  # each SV profile's by name
    workers: int
    notes: dict[str, str]
    cost_profile: JSON | None = None  # the measured cost profile (cost.source=measured)
    batch_axis: JSON | None = None  # evaluate.batch_axis's sizes, costs and meanings (None: no batch axis)
    wallclock: JSON | None = None  # evaluate.wallclock's settings (None: not timed)
    seconds: float | None = None  # the evaluation's wall time (None until it is over)

    def to_dict(self) -> JSON:
        """The JSON written: every field by name, the optional ones only when set."""
        record = asdict(self)
        return {name: value for name, value in record.items() if value is not None or name not in OPTIONAL}

    @classmethod
    def from_dict(cls, record: JSON) -> EvaluationMetadata:
        """The record :meth:`to_dict` wrote (keys it does not know ignored); a missing key is an error naming it."""
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in record and name not in OPTIONAL]
        if missing:
            raise ValueError(f"evaluation metadata lacks {', '.join(missing)}: written by an older version? "
                             "Run `python -m accept_heads.evaluate` again")
        return cls(**{name: record[name] for name in names if name in record})


