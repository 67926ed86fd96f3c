"""The evaluation's registry of run families: how it sweeps, tables, times and draws each kind of run.

A run family is a kind of run in the results table: a length policy of our decoder (its spec in
``decode.policy_specs``: what serving needs) or a baseline (:mod:`~accept_heads.measure.specs`). What the
evaluation knows of a kind is one :class:`Family`. A schedule's or a baseline's is registered here by kind with
:func:`evaluated` (a class decorator above ``@register_policy``) or :func:`register_family`; an acceptance source
under a stop rule composes its family from the traits of its source (:class:`SourceTraits`: its league side, the
artifact it reads, its rows, its colours) and of its stop (:class:`StopTraits`: its parameter's grid, its perfect
bound, its name in the tables), so every source registered in decode gets every stop with nothing declared here.
The dev sweeps and their selection, the report, the wall clock, the figures and the batch axis iterate
:func:`families`; none lists a kind by hand (DESIGN §6).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from accept_heads.measure.specs import (
    HFConfidenceSpec,
    HFConstantSpec,
    HFHeuristicSpec,
    RunPolicy,
    SEAlternateSpec,
    SEPlainSpec,
    SESDSpec,
    TargetAloneSpec,
)
from ahconf.schema import ConfigError, EvaluateJob
from decode.policies.sources import SOURCES, HeadEstimate
from decode.policies.stops import STOPS, Threshold
from decode.policy_specs import (
    ConfidenceSpec,
    FixedSpec,
    HeuristicSpec,
    NamedSpec,
    OracleSpec,
    RefitConfidenceSpec,
    SourceStopSpec,
    SVIPSpec,
    SVSpec,
    policy_kind,
    policy_kinds,
    source_stop_kind,
    source_stop_kinds,
)

#: A tuned parameter's dev grid: its values, or how to read them off the job.
Grid = Sequence[float] | Callable[[EvaluateJob], Sequence[float]]
League = Literal["learned", "training-free"]


def no_variants(spec: Any, k: int) -> list[NamedSpec]:
    """A family decoded at the fixed K chosen on dev as it is otherwise: no variant."""
    return []


@dataclass(frozen=True)
class Family:
    """A kind of run and the evaluation's traits of it; its parameters are its spec class's."""

    name: str  # its kind
    spec: type[NamedSpec]
    runner: Literal["decode", "hf", "se"] = "decode"  # what decodes it: our decoder, HF assisted generation, SE
    reads: Literal["head", "profile"] | None = None  # the kind of artifact a run of it reads (None: none)
    symbol: str | None = None  # its parameter's symbol in labels (K, τ, h, k, γ)
    grid: Grid | None = None  # the dev grid its parameter is chosen over (``evaluate.grids.<kind>`` first; None: none)
    rows_alone: bool = False  # in a batch each row decides as it would alone, so the evaluation batches its prompts
    bound: bool = False  # an analysis bound (reads the target in hindsight; never a serving policy)
    perfect: str | None = None  # the perfect predictor with this kind's stop rule, its gain's bound (a bound's kind)
    color: str | None = None  # its colour in figures (None: one of a fixed cycle)
    stop: str | None = None  # the name of its stop in the league and heads tables (None: not there)
    timed: bool = False  # the wall clock times it (at its dev choice) against the target alone and the best fixed K
    # its variants at the fixed K chosen on dev for a rule, decoded beside it (SV drafting that K)
    at_fixed_k: Callable[[Any, int], list[NamedSpec]] = no_variants
    # its side in the predictor league: an acceptance source that is trained, or one that is not (None: neither)
    league: League | None = None
    # it decides at measured batch costs, so only the batch axis (evaluate.batch_axis.sizes) decodes it
    batch_only: bool = False
    # the kind whose dev choice it decodes at (a batch-only kind tuned by its source's parameter; None: its own)
    choice_of: str | None = None

    @classmethod
    def of_spec(cls, spec: type[NamedSpec], runner: Literal["decode", "hf", "se"] = "decode",
                **traits: Any) -> Family:
        """The family of a spec class's one kind."""
        return cls(spec.kind, spec, runner, spec.reads, **traits)

    @property
    def tuned(self) -> bool:
        """Its parameter is chosen on dev."""
        return self.grid is not None

    def dev_grid(self, job: EvaluateJob) -> list[float]:
        """The dev grid: ``evaluate.grids.<kind>``, else the grid it declares."""
        if self.name in job.evaluate.grids:
            return [float(v) for v in job.evaluate.grids[self.name]]
        grid = self.grid(job) if callable(self.grid) else self.grid
        return [float(v) for v in grid or ()]

    def of(self, value: float | None, artifact: str | None) -> NamedSpec:
        """A spec of this kind from its flat form."""
        return self.spec.of(self.name, value, artifact)

    def candidates(self, grid: list[float], heads: list[str], profiles: list[str]) -> list[NamedSpec]:
        """Every spec of this kind a sweep decodes: per artifact it reads, per grid value when tuned."""
        artifacts: list[str | None] = {"head": list(heads), "profile": list(profiles), None: [None]}[self.reads]
        values: list[float | None] = list(grid) if self.tuned else [None]
        return [self.of(value, artifact) for artifact in artifacts for value in values]


@dataclass(frozen=True)
class SourceTraits:
    """The evaluation's traits of an acceptance source (:data:`decode.policies.sources.SOURCES`), shared by its kinds
    under every stop; a source registered without any gets these defaults."""

    symbol: str | None = None  # its parameter's symbol (None: it takes none)
    grid: Grid | None = None  # its parameter's dev grid
    rows_alone: bool = True  # False: it learns along a set's prompts in order, so they decode one after another
    colors: Mapping[str, str] = field(default_factory=dict)  # its colour under each stop (else one of a cycle)


@dataclass(frozen=True)
class StopTraits:
    """The evaluation's traits of a stop rule (:data:`decode.policies.stops.STOPS`), shared by every source under it."""

    label: str  # its name in the league and heads tables
    symbol: str | None = None  # its parameter's symbol (None: it takes none)
    grid: Grid | None = None  # its parameter's dev grid


#: The registered families by kind (:func:`register_family`); :func:`families` puts them in table order.
FAMILIES: dict[str, Family] = {}
#: The traits of each acceptance source and each stop rule by name; one missing has the defaults.
SOURCE_TRAITS: dict[str, SourceTraits] = {}
STOP_TRAITS: dict[str, StopTraits] = {}


def register_family(family: Family) -> Family:
    """Add ``family`` under its kind; a policy kind of our decoder must be registered with ``register_policy``."""
    if family.runner == "decode" and policy_kinds().get(family.name) is not family.spec:
        raise ValueError(f"policy kind {family.name!r} is not registered: put @register_policy under @evaluated")
    if family.name in FAMILIES and FAMILIES[family.name].spec is not family.spec:
        raise ValueError(f"run family {family.name!r} is already registered by {FAMILIES[family.name].spec.__name__}")
    FAMILIES[family.name] = family
    return family


def evaluated(**traits: Any) -> Callable[[type[NamedSpec]], type[NamedSpec]]:
    """Class decorator above ``@register_policy``: the evaluation's traits (:class:`Family` fields) of the kind."""
    def register(cls: type[NamedSpec]) -> type[NamedSpec]:
        register_family(Family.of_spec(cls, "decode", **traits))
        return cls

    return register


def source_stop_family(kind: str, source: str, stop: str) -> Family:
    """The family of ``source`` under ``stop``, composed from their traits: a source read in hindsight is a bound (out
    of the league, never timed); the others are in the league (learned where they read a head), measured against the
    perfect predictor under the same stop and timed by the wall clock where its rows decide as alone (a source that
    learns along the prompts would time another decode than the counted one); a stop that only a batch takes is
    decoded on the batch axis only, at the parameter its source's named kind chose on dev."""
    source_class, stop_class = SOURCES[source], STOPS[stop]
    traits, rule = SOURCE_TRAITS.get(source, SourceTraits()), STOP_TRAITS.get(stop, StopTraits(stop))
    bound, batch_only = source_class.needs_hindsight, stop_class.batch_only
    alone = traits.rows_alone and not batch_only  # a bound's rows too: its hindsight reads are per row
    league: League | None = None if bound else "learned" if source_class.reads == "head" else "training-free"
    perfect = next((source_stop_kind(name, stop) for name, cls in SOURCES.items() if cls.needs_hindsight
                    and source_stop_kind(name, stop) in source_stop_kinds()), None)
    tuned_by = traits if source_class.parameter else rule if stop_class.parameter else None
    label = f"{rule.label}, {traits.symbol}" if tuned_by is traits else rule.label
    named = source_class.named_stop
    choice_of = (source_stop_kind(source, named) if batch_only and tuned_by is traits and named is not None
                 and not STOPS[named].batch_only else None)
    return Family(kind, SourceStopSpec, reads=source_class.reads, symbol=tuned_by and tuned_by.symbol,
                  grid=tuned_by and tuned_by.grid, rows_alone=alone, bound=bound, perfect=perfect,
                  color=traits.colors.get(stop), stop=None if bound else label, timed=alone and not bound,
                  league=league,
                  batch_only=batch_only, choice_of=choice_of)


def families() -> dict[str, Family]:
    """Every run family of the results table, in table order: each policy kind of our decoder
    (:func:`~decode.policy_specs.policy_kinds`; a source under a stop composed from their traits, another kind
    without registered traits untuned and decoded alone), then the baselines."""
    pairs = source_stop_kinds()
    ours = {kind: FAMILIES.get(kind) or (source_stop_family(kind, *pairs[kind]) if kind in pairs else
                                         Family.of_spec(spec)) for kind, spec in policy_kinds().items()}
    return ours | {name: family for name, family in FAMILIES.items() if family.runner != "decode"}


def _kind(kind: str, registered: Mapping[str, Family], valid: Sequence[str]) -> str:
    """``kind``, or the policy kind it is an alias of; unknown kinds name the ``valid`` ones."""
    if kind in registered:
        return kind
    try:
        return policy_kind(kind)
    except ValueError:
        raise ValueError(f"unknown run family {kind!r}; valid: {', '.join(valid)}") from None


def family(kind: str) -> Family:
    """The family of ``kind`` (or of the policy kind it is an alias of); unknown kinds name the valid ones."""
    registered = families()
    return registered[_kind(kind, registered, list(registered))]


def family_names(*, runner: str | None = None, tuned: bool | None = None, rows_alone: bool | None = None,
                 bound: bool | None = None, timed: bool | None = None, league: str | None = None,
                 batch_only: bool | None = None) -> list[str]:
    """The families with these traits, in table order."""
    return [f.name for f in families().values() if (runner is None or f.runner == runner)
            and (tuned is None or f.tuned == tuned) and (rows_alone is None or f.rows_alone == rows_alone)
            and (bound is None or f.bound == bound) and (timed is None or f.timed == timed)
            and (league is None or f.league == league) and (batch_only is None or f.batch_only == batch_only)]


def perfect_for() -> dict[str, str]:
    """Family → the perfect predictor its gain is measured against: the same stop rule fed the true acceptance
    probabilities (each family's ``perfect``)."""
    return {name: f.perfect for name, f in families().items() if f.perfect}


def run_policy(kind: str, value: float | None = None, artifact: str | None = None) -> RunPolicy:
    """The spec of a run of ``kind`` (or of the policy kind it is an alias of) from its flat form (a results-table
    row); unknown kinds name the valid ones."""
    if kind == TargetAloneSpec.kind:
        return TargetAloneSpec()
    registered = families()
    return registered[_kind(kind, registered, [*registered, TargetAloneSpec.kind])].of(value, artifact)


def check_grids(job: EvaluateJob) -> None:
    """Refuse an ``evaluate.grids`` entry for a kind with no parameter chosen on dev, and a threshold ``h`` outside
    (0, 1)."""
    tuned = family_names(runner="decode", tuned=True)
    for kind, grid in job.evaluate.grids.items():
        if kind not in tuned:
            raise ConfigError(f"evaluate.grids.{kind}: {kind} has no parameter chosen on dev; "
                              f"tuned kinds: {', '.join(tuned)}")
        if family(kind).symbol == STOP_TRAITS["h"].symbol and any(not 0 < h < 1 for h in grid):
            raise ConfigError(f"evaluate.grids.{kind}={list(grid)}: a stop threshold h lies in (0, 1); give values "
                              "between 0 and 1")


def sv_at_k(spec: SVSpec, k: int) -> list[NamedSpec]:
    """SV drafting the fixed-K baseline's K too, beside its profile's ``k_max``: the SV paper's comparison."""
    return [SVSpec(spec.profile, k)] if spec.k is None else []


#: The family of a head stopping at its threshold ``h``: the ``h`` a head serves at (DESIGN §5).
HEAD_THRESHOLD = source_stop_kind(HeadEstimate.name, Threshold.name)

# Each grid is declared here, with its kind, source or stop; ``evaluate.grids.<kind>`` overrides it.
SOURCE_TRAITS.update({
    "confidence": SourceTraits(colors={"h": "darkgreen", "goodput": "yellowgreen"}),
    # the bound's γ: a real draft's sqrt(H) is often near 2 nats^½, where γ ≥ 0.25 leaves no bound at all
    "adaedl": SourceTraits(symbol="γ", grid=(0.02, 0.05, 0.1, 0.2, 0.5), colors={"goodput": "goldenrod"}),
    # the online logistic learns along a set's prompts in order, so they decode one after another
    "margin": SourceTraits(rows_alone=False, colors={"h": "tab:gray", "goodput": "darkslategray",
                                                     "budget": "slateblue"}),
    # vLLM's released estimator learns along a set's prompts in order too, from its cold start
    "vllm": SourceTraits(rows_alone=False, colors={"h": "orchid", "goodput": "darkmagenta", "budget": "magenta"}),
    "head": SourceTraits(colors={"h": "tab:red", "goodput": "tab:brown", "budget": "darkred"}),
    # recalibrated on each request's own rounds from the head as exported: rows decide as alone
    "head-online": SourceTraits(colors={"h": "orangered", "goodput": "sienna", "budget": "firebrick"}),
    "perfect": SourceTraits(colors={"h": "dimgrey", "goodput": "silver"}),
})
STOP_TRAITS.update({
    # every source's h, a head's too: the evaluation chooses it on dev and records a head's beside it
    "h": StopTraits("h", symbol="h", grid=(0.3, 0.5, 0.7, 0.85, 0.95)),
    "goodput": StopTraits("goodput"),
    "budget": StopTraits("survival budget"),
})

for _family in (
    # grown on dev past an edge choice (accept_heads.evaluate)
    Family.of_spec(FixedSpec, symbol="K", grid=tuple(range(1, 11)), rows_alone=True, color="tab:blue", timed=True),
    Family.of_spec(HeuristicSpec, rows_alone=True, color="tab:orange"),
    Family.of_spec(ConfidenceSpec, symbol="τ", grid=(0.3, 0.5, 0.7), rows_alone=True, color="tab:green", timed=True,
                   stop="τ", league="training-free"),
    # transformers' refitted threshold learns along a set's prompts in order, so they decode one after another
    Family.of_spec(RefitConfidenceSpec, color="olivedrab", stop="q(y) ≥ τ refitted", league="training-free"),
    # thresholds on the draft's sqrt(H(q)) (nats), from confident to near-uniform drafts
    Family.of_spec(SVIPSpec, symbol="√H", grid=(0.5, 0.75, 1.0, 1.5, 2.0, 2.5), rows_alone=True, color="teal",
                   stop="√H", league="training-free"),
    Family.of_spec(SVSpec, symbol="k", color="tab:purple", at_fixed_k=sv_at_k),
    Family.of_spec(OracleSpec, bound=True, rows_alone=True, color="black"),
    Family.of_spec(HFConstantSpec, "hf", symbol="K", color="tab:cyan", timed=True),
    Family.of_spec(HFHeuristicSpec, "hf", color="tab:olive", timed=True),
    Family.of_spec(HFConfidenceSpec, "hf", symbol="τ", color="tab:pink"),
    Family.of_spec(SEPlainSpec, "se"),
    Family.of_spec(SESDSpec, "se", symbol="γ", grid=lambda job: job.evaluate.se_gammas),
    Family.of_spec(SEAlternateSpec, "se", symbol="γ", grid=lambda job: job.evaluate.se_gammas),
):
    register_family(_family)
