"""Length policies named by typed specs: a policy's kind and its own parameters, built through one registry.

A spec is what a plan, a results table or a config names (``FixedSpec(k=4)``, ``SourceStopSpec("head", "h", 0.8,
"pre")``); :meth:`PolicySpec.build` makes the :class:`~decode.policies.base.Policy` from the artifacts and costs it
needs (:class:`~decode.policies.base.PolicyInputs`), and :func:`policy_spec` reads one back from its flat form (its
kind, one parameter value, one artifact name). :func:`register_policy` adds a spec class to :data:`POLICY_SPECS` where
it is defined, in registration order.

A kind is a schedule's (``fixed``, ``svip``, ...) or an acceptance source under a stop rule (:class:`SourceStopSpec`,
the spec ``source-stop``): every source of :data:`~decode.policies.sources.SOURCES` under every rule of
:data:`~decode.policies.stops.STOPS` (:func:`source_stop_kinds`), named ``<source>-<stop>`` or, under the stop its
source names, by the source alone (``head`` is the head under the threshold stop ``h``; ``head-h`` reads as it).
Only what serving needs is here: how the evaluation sweeps, tables, times and draws each kind is declared in the
evaluation (``accept_heads.measure.families``; DESIGN §6).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, TypeVar

from typing_extensions import Self

from decode.metadata import recorded_k_range
from decode.policies.base import Policy, PolicyInputs
from decode.policies.bounds import Oracle
from decode.policies.schedules import SVIP, Confidence, Fixed, Heuristic, RefitConfidence
from decode.policies.sources import SOURCES
from decode.policies.stop_policy import StopPolicy
from decode.policies.stops import STOPS
from decode.policies.sv import SV


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
    def kinds(cls) -> list[str]:
        """The kinds it names, in table order (one: its ``kind``)."""
        return [cls.kind]

    @classmethod
    def of(cls, kind: str, value: float | None, artifact: str | None) -> NamedSpec:
        """The spec of ``kind`` from its flat form: the parameter value and the artifact name (a results-table row)."""
        return cls()


@dataclass(frozen=True)
class PolicySpec(NamedSpec):
    """A length policy of our decoder by kind and typed parameters (DESIGN §6)."""

    def build(self, inputs: PolicyInputs) -> Policy:
        raise NotImplementedError


#: Every policy spec class, in registration order, by the name it is registered under (:func:`register_policy`):
#: a schedule's kind, or ``source-stop`` for :class:`SourceStopSpec`, which names many kinds.
POLICY_SPECS: dict[str, type[PolicySpec]] = {}

Spec = TypeVar("Spec", bound=type[PolicySpec])


def register_policy(cls: Spec, name: str | None = None) -> Spec:
    """Class decorator: add a spec class to :data:`POLICY_SPECS` under ``name``, by default its ``kind`` (after the
    ones there)."""
    name = cls.kind if name is None else name
    if name in POLICY_SPECS and POLICY_SPECS[name] is not cls:
        raise ValueError(f"policy kind {name!r} is already registered by {POLICY_SPECS[name].__name__}")
    POLICY_SPECS[name] = cls
    return cls


@dataclass(frozen=True)
class CountParameter:
    """A mixin of specs whose parameter is a count ``k`` (candidates per round)."""

    k: int

    @property
    def value(self) -> float:
        return float(self.k)

    @classmethod
    def of(cls, kind: str, value: float | None, artifact: str | None) -> Self:
        return cls(int(value))


@dataclass(frozen=True)
class ThresholdParameter:
    """A mixin of specs whose parameter is a confidence threshold ``tau``."""

    tau: float

    @property
    def value(self) -> float:
        return self.tau

    @classmethod
    def of(cls, kind: str, value: float | None, artifact: str | None) -> Self:
        return cls(float(value))


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


@register_policy
@dataclass(frozen=True)
class RefitConfidenceSpec(PolicySpec):
    """transformers' confidence stop on ``q(y)`` with its threshold refitted on the verified rounds (from 0.4)."""

    kind: ClassVar[str] = "confidence-refit"

    def build(self, inputs: PolicyInputs) -> Policy:
        return RefitConfidence(k_max=inputs.k_max)


@register_policy
@dataclass(frozen=True)
class SVIPSpec(PolicySpec):
    """SVIP: stop once the draft's ``sqrt(H(q_i))`` exceeds ``h``."""

    h: float
    kind: ClassVar[str] = "svip"

    @property
    def value(self) -> float:
        return self.h

    @classmethod
    def of(cls, kind: str, value: float | None, artifact: str | None) -> Self:
        return cls(float(value))

    def build(self, inputs: PolicyInputs) -> Policy:
        return SVIP(self.h, k_max=inputs.k_max)


def source_stop_kind(source: str, stop: str) -> str:
    """The kind of ``source`` under ``stop``: the source's name alone under the stop it names, else
    ``<source>-<stop>``."""
    return source if SOURCES[source].named_stop == stop else f"{source}-{stop}"


def source_stop_kinds() -> dict[str, tuple[str, str]]:
    """Every kind of an acceptance source under a stop rule → (source, stop), sources then stops in registration
    order: each pair but where both take a parameter (a kind's flat form carries one) and where a source read in
    hindsight meets a stop only a batch takes (the bounds decode one prompt at a time)."""
    return {source_stop_kind(name, stop): (name, stop) for name, source in SOURCES.items()
            for stop, rule in STOPS.items()
            if not (source.parameter and rule.parameter) and not (source.needs_hindsight and rule.batch_only)}


def source_stop_aliases() -> dict[str, str]:
    """``<source>-<stop>`` → the kind it names where that is the source's name alone (``head-h`` → ``head``)."""
    return {f"{source}-{stop}": kind for kind, (source, stop) in source_stop_kinds().items()
            if kind != f"{source}-{stop}"}


@dataclass(frozen=True)
class SourceStopSpec(PolicySpec):
    """An acceptance source under a stop rule (:class:`~decode.policies.stop_policy.StopPolicy`; DESIGN §2), by
    their registered names; ``parameter``: the one the source or the stop takes, ``head``: the head the source reads.

    The drafting range is the source's (a head's: the one it was calibrated with; DESIGN §5).
    """

    source: str
    stop: str
    parameter: float | None = None
    head: str | None = None

    @property
    def kind(self) -> str:  # a kind per pair, not per class
        return source_stop_kind(self.source, self.stop)

    @property
    def value(self) -> float | None:
        return self.parameter

    @property
    def artifact(self) -> str | None:
        return self.head

    @classmethod
    def kinds(cls) -> list[str]:
        return list(source_stop_kinds())

    @classmethod
    def of(cls, kind: str, value: float | None, artifact: str | None) -> SourceStopSpec:
        source, stop = source_stop_kinds()[source_stop_aliases().get(kind, kind)]
        takes = SOURCES[source].parameter or STOPS[stop].parameter
        return cls(source, stop, float(value) if takes else None, str(artifact) if SOURCES[source].reads else None)

    def build(self, inputs: PolicyInputs) -> Policy:
        source_class, stop_class = SOURCES[self.source], STOPS[self.stop]
        source = source_class.build(self.parameter if source_class.parameter else None, self.head, inputs)
        stop = stop_class.build(self.parameter if stop_class.parameter else None, inputs, self.kind,
                                source.companion is not None, *source.k_range(inputs))
        return StopPolicy(source, stop)


register_policy(SourceStopSpec, "source-stop")


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
    def of(cls, kind: str, value: float | None, artifact: str | None) -> PolicySpec:
        return cls(str(artifact), None if value is None else int(value))


@register_policy
@dataclass(frozen=True)
class OracleSpec(PolicySpec):
    """The realised oracle: stops before the first rejection its own verification draws decide (a bound)."""

    kind: ClassVar[str] = "oracle"

    def build(self, inputs: PolicyInputs) -> Policy:
        return Oracle()


def policy_kinds() -> dict[str, type[PolicySpec]]:
    """Every policy kind and the spec class that names it, in table order; an alias of a source-stop kind
    (:func:`source_stop_aliases`) is not listed."""
    return {kind: cls for cls in POLICY_SPECS.values() for kind in cls.kinds()}


def policy_kind(kind: str) -> str:
    """``kind`` itself, or the kind its alias names; unknown kinds name the valid ones."""
    kind = source_stop_aliases().get(kind, kind)
    if kind not in policy_kinds():
        raise ValueError(f"unknown policy kind {kind!r}; valid: {', '.join(policy_kinds())}")
    return kind


def policy_spec(kind: str, value: float | None = None, artifact: str | None = None) -> PolicySpec:
    """The spec of ``kind`` (or an alias of it) from its flat form (parameter value, artifact name); unknown kinds
    name the valid ones."""
    kind = policy_kind(kind)
    return policy_kinds()[kind].of(kind, value, artifact)
