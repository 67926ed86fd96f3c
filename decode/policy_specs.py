"""Length policies named by typed specs: a policy's kind and its own parameters, built through one registry.

A spec is what a plan, a results table or a config names (``FixedSpec(k=4)``, ``HeadSpec("pre", 0.8)``);
:meth:`PolicySpec.build` makes the :class:`~decode.policies.Policy` from the artifacts and costs it needs
(:class:`PolicyInputs`). :func:`register_policy` adds a spec class to :data:`POLICY_SPECS` where it is
defined, in table order, and the evaluation iterates that registry (its sweep, tables and figures list no
kind by hand). Each class declares which parameter it carries (``symbol``), whether that parameter is
chosen on dev (``tuned``) over which grid (``grid``, or the config field ``grid_setting``), which
artifacts it is built per (``reads``), whether its rows decide in a batch exactly as alone
(``rows_alone``; SV chooses a batch's lengths jointly, the hindsight policies are batch 1 only), whether it
is an analysis bound (``bound``: the realised oracle and the perfect predictors, which read the target in
hindsight), the perfect predictor its gain is measured against (``perfect``) and its colour in figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeVar

from decode.batch_costs import BatchCosts
from decode.costs import CostModel
from decode.head import AcceptanceHead
from decode.metadata import ArtifactMetadata
from decode.policies import (
    SV,
    Confidence,
    Fixed,
    GoodputHead,
    Head,
    Heuristic,
    Oracle,
    PerfectGoodput,
    PerfectHead,
    Policy,
)
from decode.profile import SVProfile


@dataclass(frozen=True)
class PolicyInputs:
    """What building a policy may need: the heads and profiles by name, the cost models and the K range.

    ``k_min`` / ``k_max`` apply where a head's metadata does not carry the range it was calibrated with.
    """

    heads: Mapping[str, AcceptanceHead] = field(default_factory=dict)
    profiles: Mapping[str, SVProfile] = field(default_factory=dict)
    costs: CostModel | None = None  # the goodput stop's cost model at batch size 1
    batch_costs: BatchCosts | None = None  # measured batch costs: the goodput head and SV decide at a batch's prices
    k_min: int = 1
    k_max: int = 20

    def head(self, name: str) -> tuple[AcceptanceHead, int, int]:
        """Head ``name`` with its calibrated ``k_min`` and ``k_max``."""
        head = self.heads[name]
        return (head, *ArtifactMetadata.of(head).k_range(self.k_min, self.k_max))


@dataclass(frozen=True)
class NamedSpec:
    """Anything a run decodes with, by kind and typed parameters: a length policy here, a baseline in the evaluation."""

    kind: ClassVar[str]
    symbol: ClassVar[str | None] = None  # the parameter's symbol in labels (K, τ, h, k, γ)
    tuned: ClassVar[bool] = False  # the parameter is chosen on dev
    rows_alone: ClassVar[bool] = False  # in a batch each row decides as it would alone
    bound: ClassVar[bool] = False  # an analysis bound (hindsight; never a serving policy)
    color: ClassVar[str | None] = None  # its colour in figures (None: one of a fixed cycle)
    perfect: ClassVar[str | None] = None  # the perfect predictor with this kind's stop rule (a bound's kind)

    @property
    def value(self) -> float | None:
        """The parameter a plan sweeps (None: none)."""
        return None

    @property
    def artifact(self) -> str | None:
        """The head or profile it reads (None: none)."""
        return None

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> NamedSpec:
        """The spec from its flat form: the parameter value and the artifact name (a results-table row)."""
        return cls()


@dataclass(frozen=True)
class PolicySpec(NamedSpec):
    """A length policy of our decoder by kind and typed parameters (DESIGN §6)."""

    rows_alone: ClassVar[bool] = True
    grid: ClassVar[tuple[float, ...]] = ()  # a tuned parameter's dev grid (``evaluate.grids.<kind>`` overrides)
    grid_setting: ClassVar[str | None] = None  # the ``evaluate`` field that holds the grid instead
    reads: ClassVar[Literal["head", "profile"] | None] = None  # one spec per matching head / profile

    def build(self, inputs: PolicyInputs) -> Policy:
        raise NotImplementedError

    def batch_variants(self, k: int) -> list[PolicySpec]:
        """Further specs the batch axis decodes beside this one, given the fixed K chosen at that batch size."""
        return []

    @classmethod
    def candidates(cls, grid: list[float], heads: list[str], profiles: list[str]) -> list[PolicySpec]:
        """Every spec of this kind a dev sweep decodes: per artifact it reads, per grid value when tuned."""
        artifacts: list[str | None] = {"head": list(heads), "profile": list(profiles), None: [None]}[cls.reads]
        values: list[float | None] = list(grid) if cls.tuned else [None]
        return [cls.of(value, artifact) for artifact in artifacts for value in values]


#: Every policy kind and its spec class, in table order (:func:`register_policy` adds to it).
POLICY_SPECS: dict[str, type[PolicySpec]] = {}

Spec = TypeVar("Spec", bound=type[PolicySpec])


def register_policy(cls: Spec) -> Spec:
    """Class decorator: add a spec class to :data:`POLICY_SPECS` under its ``kind`` (after the ones there)."""
    if cls.kind in POLICY_SPECS and POLICY_SPECS[cls.kind] is not cls:
        raise ValueError(f"policy kind {cls.kind!r} is already registered by {POLICY_SPECS[cls.kind].__name__}")
    POLICY_SPECS[cls.kind] = cls
    return cls


Counted = TypeVar("Counted", bound="CountParameter")
Thresholded = TypeVar("Thresholded", bound="ThresholdParameter")


@dataclass(frozen=True)
class CountParameter:
    """A spec whose parameter is a count ``k`` (candidates per round); mixed into policy and baseline specs."""

    k: int

    @property
    def value(self) -> float:
        return float(self.k)

    @classmethod
    def of(cls: type[Counted], value: float | None, artifact: str | None) -> Counted:
        return cls(int(value))


@dataclass(frozen=True)
class ThresholdParameter:
    """A spec whose parameter is a confidence threshold ``tau``; mixed into policy and baseline specs."""

    tau: float

    @property
    def value(self) -> float:
        return self.tau

    @classmethod
    def of(cls: type[Thresholded], value: float | None, artifact: str | None) -> Thresholded:
        return cls(float(value))


@register_policy
@dataclass(frozen=True)
class FixedSpec(CountParameter, PolicySpec):
    kind: ClassVar[str] = "fixed"
    symbol: ClassVar[str | None] = "K"
    tuned: ClassVar[bool] = True
    grid_setting: ClassVar[str | None] = "fixed_k"
    color: ClassVar[str | None] = "tab:blue"

    def build(self, inputs: PolicyInputs) -> Policy:
        return Fixed(self.k)


@register_policy
@dataclass(frozen=True)
class HeuristicSpec(PolicySpec):
    kind: ClassVar[str] = "heuristic"
    color: ClassVar[str | None] = "tab:orange"

    def build(self, inputs: PolicyInputs) -> Policy:
        return Heuristic(k0=min(5, inputs.k_max), k_max=inputs.k_max)


@register_policy
@dataclass(frozen=True)
class ConfidenceSpec(ThresholdParameter, PolicySpec):
    kind: ClassVar[str] = "confidence"
    symbol: ClassVar[str | None] = "τ"
    tuned: ClassVar[bool] = True
    grid_setting: ClassVar[str | None] = "confidence_taus"
    color: ClassVar[str | None] = "tab:green"

    def build(self, inputs: PolicyInputs) -> Policy:
        return Confidence(self.tau, k_max=inputs.k_max)


@register_policy
@dataclass(frozen=True)
class HeadSpec(PolicySpec):
    head: str
    threshold: float
    kind: ClassVar[str] = "head"
    symbol: ClassVar[str | None] = "h"
    tuned: ClassVar[bool] = True
    grid_setting: ClassVar[str | None] = "thresholds"
    reads: ClassVar[Literal["head", "profile"] | None] = "head"
    perfect: ClassVar[str | None] = "perfect"
    color: ClassVar[str | None] = "tab:red"

    def build(self, inputs: PolicyInputs) -> Policy:
        head, k_min, k_max = inputs.head(self.head)
        return Head(head, threshold=self.threshold, k_min=k_min, k_max=k_max)

    @property
    def value(self) -> float:
        return self.threshold

    @property
    def artifact(self) -> str:
        return self.head

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> PolicySpec:
        return cls(str(artifact), float(value))


@register_policy
@dataclass(frozen=True)
class GoodputHeadSpec(PolicySpec):
    head: str
    kind: ClassVar[str] = "head-goodput"
    reads: ClassVar[Literal["head", "profile"] | None] = "head"
    perfect: ClassVar[str | None] = "perfect-goodput"
    color: ClassVar[str | None] = "tab:brown"

    def build(self, inputs: PolicyInputs) -> Policy:
        head, k_min, k_max = inputs.head(self.head)
        if inputs.batch_costs is not None:
            return GoodputHead(head, inputs.batch_costs.batch_one(), k_min=k_min, k_max=k_max,
                               batch_costs=inputs.batch_costs)
        if inputs.costs is None:
            raise ValueError("a head-goodput policy needs the cost model it stops by (PolicyInputs.costs)")
        return GoodputHead(head, inputs.costs, k_min=k_min, k_max=k_max)

    @property
    def artifact(self) -> str:
        return self.head

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> PolicySpec:
        return cls(str(artifact))


@register_policy
@dataclass(frozen=True)
class SVSpec(PolicySpec):
    profile: str
    k: int | None = None  # candidates drafted per round (None: the profile's k_max)
    kind: ClassVar[str] = "sv"
    symbol: ClassVar[str | None] = "k"
    rows_alone: ClassVar[bool] = False
    reads: ClassVar[Literal["head", "profile"] | None] = "profile"
    color: ClassVar[str | None] = "tab:purple"

    def build(self, inputs: PolicyInputs) -> Policy:
        profile = inputs.profiles[self.profile]
        k = self.k if self.k is not None else ArtifactMetadata.of(profile).k_range(1, profile.latency.numel())[1]
        batch = inputs.batch_costs
        return SV(profile, k=int(k), batch_latency=batch.verify_time if batch is not None else None)

    @property
    def value(self) -> float | None:
        return None if self.k is None else float(self.k)

    def batch_variants(self, k: int) -> list[PolicySpec]:
        """SV drafting the fixed-K baseline's K at a batch size too, as the SV paper does."""
        return [SVSpec(self.profile, k)] if self.k is None else []

    @property
    def artifact(self) -> str:
        return self.profile

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> PolicySpec:
        return cls(str(artifact), None if value is None else int(value))


@register_policy
@dataclass(frozen=True)
class PerfectHeadSpec(PolicySpec):
    """The head's threshold stop fed the true acceptance probabilities (a bound)."""

    threshold: float
    kind: ClassVar[str] = "perfect"
    symbol: ClassVar[str | None] = "h"
    tuned: ClassVar[bool] = True
    rows_alone: ClassVar[bool] = False
    bound: ClassVar[bool] = True
    grid_setting: ClassVar[str | None] = "thresholds"
    perfect: ClassVar[str | None] = "perfect"
    color: ClassVar[str | None] = "dimgrey"

    def build(self, inputs: PolicyInputs) -> Policy:
        return PerfectHead(self.threshold, k_max=inputs.k_max)

    @property
    def value(self) -> float:
        return self.threshold

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> PolicySpec:
        return cls(float(value))


@register_policy
@dataclass(frozen=True)
class PerfectGoodputSpec(PolicySpec):
    """The goodput stop fed the true acceptance probabilities (a bound)."""

    kind: ClassVar[str] = "perfect-goodput"
    rows_alone: ClassVar[bool] = False
    bound: ClassVar[bool] = True
    perfect: ClassVar[str | None] = "perfect-goodput"
    color: ClassVar[str | None] = "silver"

    def build(self, inputs: PolicyInputs) -> Policy:
        if inputs.costs is None:
            raise ValueError("a perfect-goodput policy needs the cost model it stops by (PolicyInputs.costs)")
        return PerfectGoodput(inputs.costs, k_max=inputs.k_max)


@register_policy
@dataclass(frozen=True)
class OracleSpec(PolicySpec):
    """The realised oracle: stops before the first rejection its own verification draws decide (a bound)."""

    kind: ClassVar[str] = "oracle"
    rows_alone: ClassVar[bool] = False
    bound: ClassVar[bool] = True
    color: ClassVar[str | None] = "black"

    def build(self, inputs: PolicyInputs) -> Policy:
        return Oracle()


def policy_spec(kind: str, value: float | None = None, artifact: str | None = None) -> PolicySpec:
    """The spec of ``kind`` from its flat form (parameter value, artifact name); unknown kinds name the valid ones."""
    try:
        cls = POLICY_SPECS[kind]
    except KeyError:
        raise ValueError(f"unknown policy kind {kind!r}; valid: {', '.join(POLICY_SPECS)}") from None
    return cls.of(value, artifact)
