"""Typed metadata of heads and SV profiles: every field an artifact records, built once when it is read.

Training builds a :class:`HeadMetadata` / :class:`ProfileMetadata` (``accept_heads.training.export``);
:mod:`decode.artifacts.serialization` writes it into the safetensors header as one JSON document (:meth:`to_json`, with
the keys files always had) and builds it back once at load (:func:`from_json`), attached to the artifact as
``.metadata`` (None on an artifact made in memory). Nothing outside this module reads the document by key; files
written before a field existed load without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar, TypeVar

from decode.head_config import HeadConfig
from decode.json_types import JSON, JSONDict
from decode.rules import Rule, RuleSpec, from_spec
from decode.sampling import Sampling

FORMAT_VERSION = 1
Kind = TypeVar("Kind", bound="ArtifactMetadata")


@dataclass(frozen=True)
class TrainingData:
    """The collected data an artifact was fitted on."""

    manifest_sha256: str  # SHA-256 of the collection's manifest.json
    data_dir: str  # the collected data, relative to the run directory (paths.run_dir), never absolute
    exp_name: str | None
    positions: dict[str, int]  # split → labelled positions


@dataclass(frozen=True)
class InformationGain:
    """What the companion's (X, Y) bins tell about acceptance on one split, in bits."""

    h_a: float  # H(A), A cut into equal-width bins
    h_a_given_xy: float  # h_a − gain
    gain: float  # I(A; X, Y), shuffle-corrected
    gain_fraction: float  # gain / h_a
    gain_plugin: float | None = None  # the uncorrected plug-in estimate (biased upward; None: profiles before it)


@dataclass(frozen=True, kw_only=True)
class ArtifactMetadata:
    """What heads and profiles both record: how their training labels were made, and where they come from."""

    kind: ClassVar[str]
    draft: str  # the draft's model id
    tokenizer_hash: str  # decode.artifacts.hub.tokenizer_hash of the draft's tokenizer
    rule: RuleSpec  # the rule the labels were made under
    sampling: Sampling  # the transform the training responses were sampled under
    draft_revision: str | None = None
    target: str | None = None
    companion: str | None = None
    training_data: TrainingData | None = None
    seed: int | None = None  # the training run's seed
    k_max: int | None = None  # a head: the top of the drafting range it was calibrated with; a profile: the K it drafts
    code_version: str | None = None  # the code that wrote the file (save_head / save_profile stamp it)

    @classmethod
    def extending(cls: type[Kind], common: ArtifactMetadata, **own: object) -> Kind:
        """This kind's record: the fields ``common`` holds, and its own (which take precedence)."""
        return cls(**{**{f.name: getattr(common, f.name) for f in fields(ArtifactMetadata)}, **own})

    def build_rule(self) -> Rule:
        """The recorded rule, rebuilt."""
        return from_spec(self.rule["name"], **self.rule["params"])

    def k_range(self, k_min: int, k_max: int) -> tuple[int, int]:
        """The recorded drafting range, ``k_min`` / ``k_max`` where none is recorded."""
        return k_min, k_max if self.k_max is None else self.k_max

    def to_json(self) -> JSONDict:
        """The document written into the file: every field, plus ``kind`` and ``format_version``."""
        doc = {f.name: as_json(getattr(self, f.name)) for f in fields(self)}
        return {**doc, "kind": self.kind, "format_version": FORMAT_VERSION}

    @staticmethod
    def _common(doc: JSONDict) -> dict[str, object]:
        missing = [key for key in ("draft", "tokenizer_hash", "rule", "sampling") if key not in doc]
        if missing:
            raise ValueError(f"metadata lacks {', '.join(missing)}")
        data = doc.get("training_data")
        return dict(
            draft=doc["draft"], tokenizer_hash=doc["tokenizer_hash"], rule=doc["rule"],
            sampling=Sampling.from_dict(doc["sampling"]), draft_revision=doc.get("draft_revision"),
            target=doc.get("target"), companion=doc.get("companion"),
            training_data=None if data is None else TrainingData(**data), seed=doc.get("seed"),
            k_max=doc.get("k_max"), code_version=doc.get("code_version"),
        )


@dataclass(frozen=True, kw_only=True)
class HeadMetadata(ArtifactMetadata):
    """A SpecDec++ head's metadata: its shape, dev metrics and recipe (its stop threshold ``h`` is chosen later, by the
    evaluation: :mod:`decode.artifacts.threshold_choice`)."""

    kind: ClassVar[str] = "head"
    head_config: HeadConfig  # the head's shape (written with its hidden size beside it)
    k_min: int | None = None
    dev_metrics: dict[str, float | None] = field(default_factory=dict)  # metric → value (None: undefined)
    train_config: JSONDict | None = None  # the recipe as configured: {"head": ..., "loss": ..., "optim": ...}
    probability: str | None = None  # what the output means (the folded prior shift)

    @property
    def mixing_r(self) -> float | None:
        """The token-mixing ``r`` the head was trained with (None: not recorded)."""
        head = (self.train_config or {}).get("head")
        return head.get("mixing_r") if isinstance(head, dict) else None

    def k_range(self, k_min: int, k_max: int) -> tuple[int, int]:
        return k_min if self.k_min is None else self.k_min, super().k_range(k_min, k_max)[1]

    def to_json(self) -> JSONDict:
        return {**super().to_json(), "hidden_size": self.head_config.hidden_size}

    @classmethod
    def from_json(cls, doc: JSONDict) -> HeadMetadata:
        if "head_config" not in doc:
            raise ValueError("metadata lacks head_config")
        return cls(
            **cls._common(doc), head_config=HeadConfig.from_dict(doc["head_config"]), k_min=doc.get("k_min"),
            dev_metrics=doc.get("dev_metrics") or {}, train_config=doc.get("train_config"),
            probability=doc.get("probability"),
        )


@dataclass(frozen=True, kw_only=True)
class ProfileMetadata(ArtifactMetadata):
    """An SV profile's metadata: its bins, how they were fitted, and what they tell about acceptance."""

    kind: ClassVar[str] = "sv_profile"
    bins: tuple[int, int]  # (X bins, Y bins) of the fitted table
    requested_bins: tuple[int, int] | None = None
    min_bin_count: int | None = None  # bins with fewer positions were backed off to their X-row
    a_bins: int | None = None  # acceptance bins of the information estimate
    information: dict[str, InformationGain] = field(default_factory=dict)  # split → gain
    latency_device: str | None = None  # where the latency tables were measured
    latency_batches: tuple[int, ...] | None = None  # batch sizes of the batch latency table

    @classmethod
    def from_json(cls, doc: JSONDict) -> ProfileMetadata:
        if "bins" not in doc:
            raise ValueError("metadata lacks bins")
        requested, batches = doc.get("requested_bins"), doc.get("latency_batches")
        return cls(
            **cls._common(doc), bins=tuple(doc["bins"]), requested_bins=None if requested is None else tuple(requested),
            min_bin_count=doc.get("min_bin_count"), a_bins=doc.get("a_bins"),
            information={split: InformationGain(**gain) for split, gain in (doc.get("information") or {}).items()},
            latency_device=doc.get("latency_device"), latency_batches=None if batches is None else tuple(batches),
        )


#: Each artifact kind's record, by the ``kind`` its document records.
KINDS: dict[str, type[HeadMetadata] | type[ProfileMetadata]] = {"head": HeadMetadata, "sv_profile": ProfileMetadata}


def from_json(doc: JSON, expected: str | None = None) -> HeadMetadata | ProfileMetadata:
    """The record of an artifact's document (a ``expected`` one, when given); ValueError saying why it is none."""
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if expected is not None and kind != expected:
        raise ValueError(f"holds a {kind!r} artifact, expected {expected!r}")
    if kind not in KINDS:
        raise ValueError(f"holds no head or SV profile metadata (kind {kind!r})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"format version {doc.get('format_version')} unsupported (this code reads {FORMAT_VERSION})")
    try:
        return KINDS[kind].from_json(doc)
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"malformed {kind} metadata ({type(error).__name__}: {error})") from error


def recorded_k_range(metadata: ArtifactMetadata | None, k_min: int, k_max: int) -> tuple[int, int]:
    """The drafting range an artifact's metadata records, ``k_min`` / ``k_max`` where it records none (or there is
    none: an artifact made in memory)."""
    return (k_min, k_max) if metadata is None else metadata.k_range(k_min, k_max)


def as_json(value: object) -> JSON:
    """A field (or a part of one) as the document holds it: Sampling and HeadConfig in their own JSON form, tuples
    as lists, and a nested record without the later fields it lacks (default None), as files written before them."""
    if isinstance(value, (Sampling, HeadConfig)):
        return value.to_dict()
    if isinstance(value, (TrainingData, InformationGain)):
        return {f.name: as_json(getattr(value, f.name)) for f in fields(value)
                if not (f.default is None and getattr(value, f.name) is None)}
    if isinstance(value, (tuple, list)):
        return [as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: as_json(item) for key, item in value.items()}
    return value
