"""The evaluation's registry of run families: how it sweeps, tables, times and draws each kind of run.

A run family is a kind of run in the results table: a length policy of our decoder (its spec class is in
``decode.policy_specs``, registered there with ``@register_policy``: what serving needs) or a baseline
(:mod:`~accept_heads.evaluation.specs`). What the evaluation knows of a kind is one :class:`Family`, registered
here by kind with :func:`evaluated` (a class decorator above ``@register_policy``) or :func:`register_family`.
The dev sweeps and their selection, the report, the wall clock, the figures and the batch axis iterate
:func:`families`; none lists a kind by hand (DESIGN §6).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from accept_heads.evaluation.specs import (
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
from decode.policy_specs import (
    POLICY_SPECS,
    AdaEDLSpec,
    ConfidenceGoodputSpec,
    ConfidenceSpec,
    ConfidenceThresholdSpec,
    FixedSpec,
    GoodputHeadSpec,
    HeadBudgetSpec,
    HeadSpec,
    HeuristicSpec,
    MarginBudgetSpec,
    MarginGoodputSpec,
    MarginSpec,
    NamedSpec,
    OracleSpec,
    PerfectGoodputSpec,
    PerfectHeadSpec,
    RefitConfidenceSpec,
    SVIPSpec,
    SVSpec,
)

#: A tuned parameter's dev grid: its values, or how to read them off the job.
Grid = Sequence[float] | Callable[[EvaluateJob], Sequence[float]]


def no_variants(spec: Any, k: int) -> list[NamedSpec]:
    """A family decoded at the fixed K chosen on dev as it is otherwise: no variant."""
    return []


@dataclass(frozen=True)
class Family:
    """A kind of run and the evaluation's traits of it; the kind and its parameters are its spec class's."""

    spec: type[NamedSpec]
    runner: Literal["decode", "hf", "se"] = "decode"  # what decodes it: our decoder, HF assisted generation, SE
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
    league: Literal["learned", "training-free"] | None = None
    # it decides at measured batch costs, so only the batch axis (evaluate.batch_sizes) decodes it
    batch_only: bool = False

    @property
    def name(self) -> str:
        return self.spec.kind

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

    def candidates(self, grid: list[float], heads: list[str], profiles: list[str]) -> list[NamedSpec]:
        """Every spec of this kind a sweep decodes: per artifact it reads, per grid value when tuned."""
        artifacts: list[str | None] = {"head": list(heads), "profile": list(profiles), None: [None]}[self.spec.reads]
        values: list[float | None] = list(grid) if self.tuned else [None]
        return [self.spec.of(value, artifact) for artifact in artifacts for value in values]


#: The registered families by kind (:func:`register_family`); :func:`families` puts them in table order.
FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Add ``family`` under its kind; a policy kind of our decoder must be registered with ``register_policy``."""
    if family.runner == "decode" and POLICY_SPECS.get(family.name) is not family.spec:
        raise ValueError(f"policy kind {family.name!r} is not registered: put @register_policy under @evaluated")
    if family.name in FAMILIES and FAMILIES[family.name].spec is not family.spec:
        raise ValueError(f"run family {family.name!r} is already registered by {FAMILIES[family.name].spec.__name__}")
    FAMILIES[family.name] = family
    return family


def evaluated(**traits: Any) -> Callable[[type[NamedSpec]], type[NamedSpec]]:
    """Class decorator above ``@register_policy``: the evaluation's traits (:class:`Family` fields) of the kind."""
    def register(cls: type[NamedSpec]) -> type[NamedSpec]:
        register_family(Family(cls, "decode", **traits))
        return cls

    return register


def families() -> dict[str, Family]:
    """Every run family of the results table, in table order: each policy kind of our decoder
    (:data:`~decode.policy_specs.POLICY_SPECS`; a kind without registered traits is untuned and decoded alone),
    then the baselines."""
    ours = {kind: FAMILIES.get(kind) or Family(spec) for kind, spec in POLICY_SPECS.items()}
    return ours | {name: family for name, family in FAMILIES.items() if family.runner != "decode"}


def family(kind: str) -> Family:
    """The family of ``kind``; unknown kinds name the valid ones."""
    registered = families()
    if kind not in registered:
        raise ValueError(f"unknown run family {kind!r}; valid: {', '.join(registered)}")
    return registered[kind]


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
    """The spec of a run of ``kind`` from its flat form (a results-table row); unknown kinds name the valid ones."""
    if kind == TargetAloneSpec.kind:
        return TargetAloneSpec()
    registered = families()
    if kind not in registered:
        raise ValueError(f"unknown run family {kind!r}; valid: {', '.join([*registered, TargetAloneSpec.kind])}")
    return registered[kind].spec.of(value, artifact)


def check_grids(job: EvaluateJob) -> None:
    """Refuse an ``evaluate.grids`` entry for a kind with no parameter chosen on dev."""
    tuned = family_names(runner="decode", tuned=True)
    for kind in job.evaluate.grids:
        if kind not in tuned:
            raise ConfigError(f"evaluate.grids.{kind}: {kind} has no parameter chosen on dev; "
                              f"tuned kinds: {', '.join(tuned)}")


def sv_at_k(spec: SVSpec, k: int) -> list[NamedSpec]:
    """SV drafting the fixed-K baseline's K too, beside its profile's ``k_max``: the SV paper's comparison."""
    return [SVSpec(spec.profile, k)] if spec.k is None else []


def head_thresholds(job: EvaluateJob) -> list[float]:
    """The head stop thresholds ``h`` the job sweeps."""
    return job.thresholds


#: SVIP's dev grid: thresholds on the draft's ``sqrt(H(q))`` (nats), from confident to near-uniform drafts.
SVIP_GRID = (0.5, 0.75, 1.0, 1.5, 2.0, 2.5)
#: AdaEDL's dev grid: the bound's ``γ`` (a real draft's ``sqrt(H)`` is often near 2 nats^½, where ``γ ≥ 0.25`` leaves
#: no bound at all).
ADAEDL_GAMMAS = (0.02, 0.05, 0.1, 0.2, 0.5)


for _family in (
    Family(FixedSpec, symbol="K", grid=lambda job: job.evaluate.fixed_k, rows_alone=True, color="tab:blue",
           timed=True),
    Family(HeuristicSpec, rows_alone=True, color="tab:orange"),
    Family(ConfidenceSpec, symbol="τ", grid=lambda job: job.evaluate.confidence_taus, rows_alone=True,
           color="tab:green", timed=True, stop="τ", league="training-free"),
    Family(ConfidenceThresholdSpec, symbol="h", grid=head_thresholds, rows_alone=True, color="darkgreen", stop="h",
           league="training-free"),
    Family(ConfidenceGoodputSpec, rows_alone=True, color="yellowgreen", stop="goodput", league="training-free"),
    # transformers' refitted threshold learns along a set's prompts in order, so they decode one after another
    Family(RefitConfidenceSpec, color="olivedrab", stop="q(y) ≥ τ refitted", league="training-free"),
    Family(SVIPSpec, symbol="√H", grid=SVIP_GRID, rows_alone=True, color="teal", stop="√H",
           league="training-free"),
    Family(AdaEDLSpec, symbol="γ", grid=ADAEDL_GAMMAS, rows_alone=True, color="goldenrod", stop="goodput, γ",
           league="training-free"),
    # the online logistic learns along a set's prompts in order, so they decode one after another
    Family(MarginSpec, symbol="h", grid=head_thresholds, color="tab:gray", stop="h", league="training-free"),
    Family(MarginGoodputSpec, color="darkslategray", stop="goodput", league="training-free"),
    Family(HeadSpec, symbol="h", grid=head_thresholds, rows_alone=True, perfect="perfect", color="tab:red", stop="h",
           timed=True, league="learned"),
    Family(GoodputHeadSpec, rows_alone=True, perfect="perfect-goodput", color="tab:brown", stop="goodput",
           timed=True, league="learned"),
    Family(HeadBudgetSpec, color="darkred", stop="survival budget", league="learned", batch_only=True),
    Family(MarginBudgetSpec, color="slateblue", stop="survival budget", league="training-free", batch_only=True),
    Family(SVSpec, symbol="k", color="tab:purple", at_fixed_k=sv_at_k),
    Family(PerfectHeadSpec, symbol="h", grid=head_thresholds, bound=True, perfect="perfect", color="dimgrey"),
    Family(PerfectGoodputSpec, bound=True, perfect="perfect-goodput", color="silver"),
    Family(OracleSpec, bound=True, color="black"),
    Family(HFConstantSpec, "hf", symbol="K", color="tab:cyan", timed=True),
    Family(HFHeuristicSpec, "hf", color="tab:olive", timed=True),
    Family(HFConfidenceSpec, "hf", symbol="τ", color="tab:pink"),
    Family(SEPlainSpec, "se"),
    Family(SESDSpec, "se", symbol="γ", grid=lambda job: job.evaluate.se_gammas),
    Family(SEAlternateSpec, "se", symbol="γ", grid=lambda job: job.evaluate.se_gammas),
):
    register_family(_family)
