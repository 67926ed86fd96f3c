"""Length policies named by typed specs: a policy's kind and its own parameters, built through one registry.

A spec is what a plan, a results table or a config names (``FixedSpec(k=4)``, ``HeadSpec("pre", 0.8)``);
:meth:`PolicySpec.build` makes the :class:`~decode.policies.Policy` from the artifacts and costs it needs
(:class:`PolicyInputs`), and :func:`policy_spec` reads one back from its flat form (one parameter value, one
artifact name). :func:`register_policy` adds a spec class to :data:`POLICY_SPECS` where it is defined, in
registration order. Only what serving needs is here: how the evaluation sweeps, tables, times and draws each
kind is declared in the evaluation (``accept_heads.evaluation.families``; DESIGN §6).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeVar

from typing_extensions import Self

from decode.batch_costs import BatchCosts
from decode.costs import CostModel
from decode.head import AcceptanceHead
from decode.metadata import recorded_k_range
from decode.policies.base import Policy
from decode.policies.bounds import Oracle, PerfectGoodput, PerfectHead
from decode.policies.schedules import SVIP, Confidence, Fixed, Heuristic, RefitConfidence
from decode.policies.sources import AcceptanceSource, DraftConfidence, EntropyBound, HeadEstimate, OnlineMargin
from decode.policies.stop_policy import GoodputHead, Head, StopPolicy
from decode.policies.stops import Goodput, SurvivalStop, Threshold
from decode.policies.sv import SV
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
        return (head, *recorded_k_range(head.metadata, self.k_min, self.k_max))

    def goodput_costs(self, kind: str) -> tuple[CostModel, BatchCosts | None]:
        """The costs a goodput stop of ``kind`` decides by: the measured batch costs' batch-1 model with them,
        else :attr:`costs`."""
        if self.batch_costs is not None:
            return self.batch_costs.batch_one(), self.batch_costs
        if self.costs is None:
            raise ValueError(f"a {kind} policy needs the cost model it stops by (PolicyInputs.costs)")
        return self.costs, None

    def goodput_stop(self, kind: str) -> Goodput:
        """The goodput stop of a ``kind`` run over this K range, at :meth:`goodput_costs`."""
        costs, batch_costs = self.goodput_costs(kind)
        return Goodput(costs, self.k_min, self.k_max, batch_costs)


@dataclass(frozen=True)
class NamedSpec:
    """A spec by kind and typed parameters, with its flat form: the one value it carries and the artifact it reads."""

    kind: ClassVar[str]
    reads: ClassVar[Literal["head", "profile"] | None] = None  # the kind of artifact it is built per (None: none)

    @property
    def value(self) -> float | None:
        """The parameter it carries (None: none)."""
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

    def build(self, inputs: PolicyInputs) -> Policy:
        raise NotImplementedError


#: Every policy kind and its spec class, in registration order (:func:`register_policy` adds to it).
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
    """A mixin of specs whose parameter is a count ``k`` (candidates per round)."""

    k: int

    @property
    def value(self) -> float:
        return float(self.k)

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> Self:
        return cls(int(value))


@dataclass(frozen=True)
class ThresholdParameter:
    """A mixin of specs whose parameter is a confidence threshold ``tau``."""

    tau: float

    @property
    def value(self) -> float:
        return self.tau

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> Self:
        return cls(float(value))


@dataclass(frozen=True)
class FloatParameter:
    """A mixin of specs whose one parameter is the float field named ``parameter`` (``h``, ``γ``, a threshold)."""

    parameter: ClassVar[str]

    @property
    def value(self) -> float:
        return float(getattr(self, self.parameter))

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> Self:
        return cls(**{cls.parameter: float(value)})


@register_policy
@dataclass(frozen=True)
class FixedSpec(CountParameter, PolicySpec):
    kind: ClassVar[str] = "fixed"

    def build(self, inputs: PolicyInputs) -> Policy:
        return Fixed(self.k)


@register_policy
@dataclass(frozen=True)
class HeuristicSpec(PolicySpec):
    kind: ClassVar[str] = "heuristic"

    def build(self, inputs: PolicyInputs) -> Policy:
        return Heuristic(k0=min(5, inputs.k_max), k_max=inputs.k_max)


@register_policy
@dataclass(frozen=True)
class ConfidenceSpec(ThresholdParameter, PolicySpec):
    kind: ClassVar[str] = "confidence"

    def build(self, inputs: PolicyInputs) -> Policy:
        return Confidence(self.tau, k_max=inputs.k_max)


@dataclass(frozen=True)
class SourceThresholdSpec(FloatParameter, PolicySpec):
    """A training-free acceptance source (:mod:`decode.policies.sources`) under the threshold stop on ``Π``."""

    threshold: float
    source: ClassVar[type[AcceptanceSource]]
    parameter: ClassVar[str] = "threshold"

    def build(self, inputs: PolicyInputs) -> Policy:
        return StopPolicy(self.source(), Threshold(self.threshold, inputs.k_min, inputs.k_max))


@dataclass(frozen=True)
class SourceGoodputSpec(PolicySpec):
    """A training-free acceptance source under the goodput stop (no parameter)."""

    source: ClassVar[type[AcceptanceSource]]

    def build(self, inputs: PolicyInputs) -> Policy:
        return StopPolicy(self.source(), inputs.goodput_stop(self.kind))


@register_policy
@dataclass(frozen=True)
class ConfidenceThresholdSpec(SourceThresholdSpec):
    """The draft's top probability as ``P̂`` under the threshold stop on ``Π`` (not per token)."""

    kind: ClassVar[str] = "confidence-h"
    source: ClassVar[type[AcceptanceSource]] = DraftConfidence


@register_policy
@dataclass(frozen=True)
class ConfidenceGoodputSpec(SourceGoodputSpec):
    """The draft's top probability as ``P̂`` under the goodput stop."""

    kind: ClassVar[str] = "confidence-goodput"
    source: ClassVar[type[AcceptanceSource]] = DraftConfidence


@register_policy
@dataclass(frozen=True)
class RefitConfidenceSpec(PolicySpec):
    """transformers' confidence stop on ``q(y)`` with its threshold refitted on the verified rounds (from 0.4)."""

    kind: ClassVar[str] = "confidence-refit"

    def build(self, inputs: PolicyInputs) -> Policy:
        return RefitConfidence(k_max=inputs.k_max)


@register_policy
@dataclass(frozen=True)
class SVIPSpec(FloatParameter, PolicySpec):
    """SVIP: stop once the draft's ``sqrt(H(q_i))`` exceeds ``h``."""

    h: float
    kind: ClassVar[str] = "svip"
    parameter: ClassVar[str] = "h"

    def build(self, inputs: PolicyInputs) -> Policy:
        return SVIP(self.h, k_max=inputs.k_max)


@register_policy
@dataclass(frozen=True)
class AdaEDLSpec(FloatParameter, PolicySpec):
    """AdaEDL's entropy bound ``1 − sqrt(γ·H)`` as ``P̂`` under the goodput stop; ``γ`` is its parameter."""

    gamma: float
    kind: ClassVar[str] = "adaedl"
    parameter: ClassVar[str] = "gamma"

    def build(self, inputs: PolicyInputs) -> Policy:
        return StopPolicy(EntropyBound(self.gamma), inputs.goodput_stop(self.kind))


@register_policy
@dataclass(frozen=True)
class MarginSpec(SourceThresholdSpec):
    """vLLM's online top-2-margin logistic as ``P̂`` under the threshold stop."""

    kind: ClassVar[str] = "margin"
    source: ClassVar[type[AcceptanceSource]] = OnlineMargin


@register_policy
@dataclass(frozen=True)
class MarginGoodputSpec(SourceGoodputSpec):
    """vLLM's online top-2-margin logistic as ``P̂`` under the goodput stop."""

    kind: ClassVar[str] = "margin-goodput"
    source: ClassVar[type[AcceptanceSource]] = OnlineMargin


@register_policy
@dataclass(frozen=True)
class HeadSpec(PolicySpec):
    head: str
    threshold: float
    kind: ClassVar[str] = "head"
    reads: ClassVar[Literal["head", "profile"] | None] = "head"

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

    def build(self, inputs: PolicyInputs) -> Policy:
        head, k_min, k_max = inputs.head(self.head)
        costs, batch_costs = inputs.goodput_costs(self.kind)
        return GoodputHead(head, costs, k_min=k_min, k_max=k_max, batch_costs=batch_costs)

    @property
    def artifact(self) -> str:
        return self.head

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> PolicySpec:
        return cls(str(artifact))


def survival_budget(source: AcceptanceSource, inputs: PolicyInputs, kind: str, k_min: int, k_max: int) -> Policy:
    """``source`` under :class:`~decode.policies.SurvivalBudget` at the measured batch costs."""
    if inputs.batch_costs is None:
        raise ValueError(f"a {kind} policy decides at measured batch costs (PolicyInputs.batch_costs): the "
                         "evaluation's batch axis measures them")
    return StopPolicy(source, SurvivalStop(inputs.batch_costs, k_min, k_max))


@register_policy
@dataclass(frozen=True)
class HeadBudgetSpec(PolicySpec):
    """A trained head's ``P̂`` under the batch's survival budget."""

    head: str
    kind: ClassVar[str] = "head-budget"
    reads: ClassVar[Literal["head", "profile"] | None] = "head"

    def build(self, inputs: PolicyInputs) -> Policy:
        head, k_min, k_max = inputs.head(self.head)
        return survival_budget(HeadEstimate(head), inputs, self.kind, k_min, k_max)

    @property
    def artifact(self) -> str:
        return self.head

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> PolicySpec:
        return cls(str(artifact))


@register_policy
@dataclass(frozen=True)
class MarginBudgetSpec(PolicySpec):
    """vLLM's online top-2-margin logistic under the batch's survival budget (vLLM's adaptive verification)."""

    kind: ClassVar[str] = "margin-budget"

    def build(self, inputs: PolicyInputs) -> Policy:
        return survival_budget(OnlineMargin(), inputs, self.kind, inputs.k_min, inputs.k_max)


@register_policy
@dataclass(frozen=True)
class SVSpec(PolicySpec):
    profile: str
    k: int | None = None  # candidates drafted per round (None: the profile's k_max)
    kind: ClassVar[str] = "sv"
    reads: ClassVar[Literal["head", "profile"] | None] = "profile"

    def build(self, inputs: PolicyInputs) -> Policy:
        profile = inputs.profiles[self.profile]
        k = self.k if self.k is not None else recorded_k_range(profile.metadata, 1, profile.latency.numel())[1]
        batch = inputs.batch_costs
        return SV(profile, k=int(k), batch_latency=batch.verify_time if batch is not None else None)

    @property
    def value(self) -> float | None:
        return None if self.k is None else float(self.k)

    @property
    def artifact(self) -> str:
        return self.profile

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> PolicySpec:
        return cls(str(artifact), None if value is None else int(value))


@register_policy
@dataclass(frozen=True)
class PerfectHeadSpec(FloatParameter, PolicySpec):
    """The head's threshold stop fed the true acceptance probabilities (a bound)."""

    threshold: float
    kind: ClassVar[str] = "perfect"
    parameter: ClassVar[str] = "threshold"

    def build(self, inputs: PolicyInputs) -> Policy:
        return PerfectHead(self.threshold, k_max=inputs.k_max)


@register_policy
@dataclass(frozen=True)
class PerfectGoodputSpec(PolicySpec):
    """The goodput stop fed the true acceptance probabilities (a bound)."""

    kind: ClassVar[str] = "perfect-goodput"

    def build(self, inputs: PolicyInputs) -> Policy:
        if inputs.costs is None:
            raise ValueError(f"a {self.kind} policy needs the cost model it stops by (PolicyInputs.costs)")
        return PerfectGoodput(inputs.costs, k_max=inputs.k_max)


@register_policy
@dataclass(frozen=True)
class OracleSpec(PolicySpec):
    """The realised oracle: stops before the first rejection its own verification draws decide (a bound)."""

    kind: ClassVar[str] = "oracle"

    def build(self, inputs: PolicyInputs) -> Policy:
        return Oracle()


def policy_spec(kind: str, value: float | None = None, artifact: str | None = None) -> PolicySpec:
    """The spec of ``kind`` from its flat form (parameter value, artifact name); unknown kinds name the valid ones."""
    try:
        cls = POLICY_SPECS[kind]
    except KeyError:
        raise ValueError(f"unknown policy kind {kind!r}; valid: {', '.join(POLICY_SPECS)}") from None
    return cls.of(value, artifact)
