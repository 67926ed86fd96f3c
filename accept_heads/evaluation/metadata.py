"""An evaluation's metadata record: what ``results.json`` (and the Parquet schema) holds, typed.

Every nested value is a typed record: the configs the run decoded by (:mod:`ahconf.schema`) and the records each stage
describes itself with, each defined beside what produces it (the trio, the prompt sets, the dev choices, the cost
models and fit, the latency, the heads and profiles, the HF baselines, the batch axis, the wall clock).
:meth:`EvaluationMetadata.to_dict` writes them as plain JSON (:func:`as_json`) and
:meth:`EvaluationMetadata.from_dict` builds them back by their annotations (:func:`build`).
"""

from __future__ import annotations

import types
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, ForwardRef, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

from accept_heads.evaluation.baselines import HFDescription
from accept_heads.evaluation.batch_axis import BatchAxisDescription
from accept_heads.evaluation.choice import Choice
from accept_heads.evaluation.wallclock import WallclockDescription
from accept_heads.measure.cost_models import CostFit, Latency, Pricing
from accept_heads.measure.inputs import HeadRecord, ProfileRecord, PromptSetDescription
from ahconf.schema import CostConfig, DecodingConfig, EvaluateConfig, RulesConfig, SamplingConfig
from decode.json_types import JSON, JSONDict
from decode.rules import RuleSpec
from runtime.models import TrioDescription


@dataclass(frozen=True)
class EvaluationMetadata:
    """Models, sampling, rules, prompt sets and seeds, the dev selection, costs and settings of one evaluation."""

    command: str
    exp_name: str
    code_version: str
    models: TrioDescription  # the trio's ids, resolved paths, revisions, dtypes, tokenizer hash and vocabulary
    device: str
    torch_threads: int
    sampling: SamplingConfig
    rules: RulesConfig  # the rules config (names, params)
    eval_rules: list[str]  # the rules decoded
    rule_specs: dict[str, RuleSpec]  # each decoded rule's spec (name, params)
    seed: int
    seeding: str
    max_new_tokens: int
    sets: list[PromptSetDescription]  # each prompt set: name, role, source, split, count, prompt ids
    selection_set: str
    selection: list[Choice]  # the dev choices
    selection_criterion: str
    cost: CostConfig  # the cost config
    cost_models: dict[str, Pricing]  # the model behind each *_cost / *_fitted column ("cost", "fitted")
    cost_fit: CostFit
    cost_fit_tuples: str
    batching: str
    latency: Latency  # the forward times measured at the start
    hf: HFDescription  # how the HF baselines ran
    decoding: DecodingConfig  # the decoding config the run decoded by
    evaluate: EvaluateConfig  # the evaluate config the run decoded by (evaluate.hf.baselines: whether they ran)
    dev_grids: dict[str, list[float]]
    heads: dict[str, HeadRecord]  # each evaluated head's file and metadata by name
    profiles: dict[str, ProfileRecord]  # each SV profile's file, metadata and tables by name
    workers: int
    notes: dict[str, str]
    batch_axis: BatchAxisDescription | None = None  # the batch axis's sizes, costs and meanings (None: none)
    wallclock: WallclockDescription | None = None  # the wall clock's settings (None: not timed)
    seconds: float | None = None  # the evaluation's wall time (None until it is over)

    def to_dict(self) -> JSONDict:
        """The JSON written: every field by name (:func:`as_json`), the optional ones only when set."""
        return {f.name: as_json(getattr(self, f.name)) for f in fields(self)
                if getattr(self, f.name) is not None or f.name not in OPTIONAL}

    @classmethod
    def from_dict(cls, record: JSONDict) -> EvaluationMetadata:
        """The record :meth:`to_dict` wrote, its values built back into their records (:func:`build`; keys it does
        not know ignored); a missing key or a value of another shape is a ValueError naming it."""
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in record and name not in OPTIONAL]
        if missing:
            raise ValueError(f"evaluation metadata lacks {', '.join(missing)}: written by an older version? "
                             "Run `python -m accept_heads.evaluate` again")
        hints = get_type_hints(cls)
        try:
            return cls(**{name: build(hints[name], record[name], name) for name in names if name in record})
        except ValueError as error:
            raise ValueError(f"evaluation metadata: {error}; written by another version? Run "
                             "`python -m accept_heads.evaluate` again") from error


#: Fields a results file may lack (written without the batch axis, the wall clock, or before the run was over).
OPTIONAL = tuple(f.name for f in fields(EvaluationMetadata) if f.default is None)


def as_json(value: object) -> JSON:
    """``value`` as ``results.json`` holds it: a record in its own JSON form where it has one (``to_dict``, or
    ``to_json`` as :mod:`decode.metadata`'s), else field by field; tuples as lists."""
    if is_dataclass(value) and not isinstance(value, type):
        own = getattr(value, "to_dict", None) or getattr(value, "to_json", None)
        return as_json(own() if own is not None else {f.name: getattr(value, f.name) for f in fields(value)})
    if isinstance(value, (list, tuple)):
        return [as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: as_json(item) for key, item in value.items()}
    return value


#: The JSON values of each scalar annotation (a bool is no number, an int is a float).
SCALARS: dict[type, tuple[type, ...]] = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}


def build(kind: Any, value: JSON, where: str) -> Any:
    """``value`` (JSON) as the annotation ``kind`` says: a record by its own ``from_dict`` (or ``from_json``) where it
    has one, else field by field (keys it does not know ignored, a missing one with a default left to it); lists,
    tuples, dicts, optional values and scalars checked. A value of another shape is a ValueError naming ``where``."""
    if kind in (Any, object, JSON) or isinstance(kind, ForwardRef):
        return value
    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, types.UnionType):
        options = [option for option in args if option is not type(None)]
        if value is None and len(options) < len(args):
            return None
        if len(options) == 1:
            return build(options[0], value, where)
        for option in options:
            try:
                return build(option, value, where)
            except ValueError:
                continue
        raise _wrong(kind, value, where)
    if origin is Literal:
        if value in args:
            return value
        raise _wrong(kind, value, where)
    if is_dataclass(kind) or is_typeddict(kind):
        return _record(kind, value, where)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise _wrong(kind, value, where)
        if origin is list or args[-1:] == (Ellipsis,):
            items = [build(args[0], item, f"{where}[{index}]") for index, item in enumerate(value)]
            return items if origin is list else tuple(items)
        if len(value) != len(args):
            raise _wrong(kind, value, where)
        return tuple(build(item_kind, item, f"{where}[{index}]")
                     for index, (item_kind, item) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise _wrong(kind, value, where)
        return {key: build(args[1], item, f"{where}.{key}") for key, item in value.items()}
    if kind in SCALARS:
        if isinstance(value, SCALARS[kind]) and (kind is bool or not isinstance(value, bool)):
            return value
        raise _wrong(kind, value, where)
    raise TypeError(f"{where}: no JSON form for {kind!r}")


def _record(kind: type, value: JSON, where: str) -> Any:
    """A dataclass or TypedDict ``kind`` from the JSON object ``value``."""
    if not isinstance(value, dict):
        raise _wrong(kind, value, where)
    own = getattr(kind, "from_dict", None) or getattr(kind, "from_json", None)
    if own is not None:
        try:
            return own(value)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{where} is no {kind.__name__} ({type(error).__name__}: {error})") from error
    hints = get_type_hints(kind, localns={"JSON": JSON})  # the alias names itself in JSONDict's values
    if is_typeddict(kind):
        lacking = sorted(kind.__required_keys__ - value.keys())
        if lacking:
            raise ValueError(f"{where} lacks {', '.join(lacking)}")
        return {key: build(hints[key], item, f"{where}.{key}") for key, item in value.items() if key in hints}
    built = {}
    for f in (f for f in fields(kind) if f.init):
        if f.name in value:
            built[f.name] = build(hints[f.name], value[f.name], f"{where}.{f.name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ValueError(f"{where} lacks {f.name}")
    try:
        return kind(**built)
    except (TypeError, ValueError) as error:  # the record's own checks refuse it
        raise ValueError(f"{where}: {error}") from error


def _wrong(kind: Any, value: JSON, where: str) -> ValueError:
    name = kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")
    return ValueError(f"{where} is {value!r:.80}; expected {name}")
