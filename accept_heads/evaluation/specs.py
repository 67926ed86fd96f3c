"""What a run decodes with, by kind and typed parameters: our length policies and the baselines.

Our decoder's policies are :mod:`decode.policy_specs`; the baselines are here: HF assisted generation
(constant K, HF's heuristic schedule, a confidence threshold), Speculative Ensemble (the plain
ensemble, speculative and alternate proposals at a proposal length γ) and, on the batch axis, the
target alone. :func:`families` lists every kind of the results table, in table order, with the
runner that decodes it; :func:`run_policy` reads a spec back from a table row's flat form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from decode.policy_specs import POLICY_SPECS, CountParameter, NamedSpec, PolicySpec, ThresholdParameter, policy_spec


@dataclass(frozen=True)
class BaselineSpec(NamedSpec):
    """A baseline run by kind and typed parameters (the interface of :class:`decode.policy_specs.PolicySpec`)."""


#: HF's default initial number of assistant tokens (``GenerationConfig.num_assistant_tokens``).
HF_START_TOKENS = 20


@dataclass(frozen=True)
class HFSpec(BaselineSpec):
    """HF assisted generation (``target.generate(assistant_model=draft)``) with one of its schedules."""

    def assistant_settings(self) -> dict[str, Any]:
        """The draft's ``generation_config`` settings of this schedule."""
        raise NotImplementedError


@dataclass(frozen=True)
class HFConstantSpec(CountParameter, HFSpec):
    kind: ClassVar[str] = "hf-constant"
    color: ClassVar[str | None] = "tab:cyan"
    symbol: ClassVar[str | None] = "K"

    def assistant_settings(self) -> dict[str, Any]:
        return {"num_assistant_tokens_schedule": "constant", "num_assistant_tokens": self.k,
                "assistant_confidence_threshold": 0.0}


@dataclass(frozen=True)
class HFHeuristicSpec(HFSpec):
    kind: ClassVar[str] = "hf-heuristic"
    color: ClassVar[str | None] = "tab:olive"

    def assistant_settings(self) -> dict[str, Any]:
        return {"num_assistant_tokens_schedule": "heuristic", "num_assistant_tokens": HF_START_TOKENS,
                "assistant_confidence_threshold": 0.0}


@dataclass(frozen=True)
class HFConfidenceSpec(ThresholdParameter, HFSpec):
    kind: ClassVar[str] = "hf-confidence"
    color: ClassVar[str | None] = "tab:pink"
    symbol: ClassVar[str | None] = "τ"

    def assistant_settings(self) -> dict[str, Any]:
        return {"num_assistant_tokens_schedule": "constant", "num_assistant_tokens": HF_START_TOKENS,
                "assistant_confidence_threshold": self.tau}


@dataclass(frozen=True)
class SESpec(BaselineSpec):
    """Speculative Ensemble of draft + target in one of :class:`decode.EnsembleDecoder`'s modes."""

    mode: ClassVar[str]

    @property
    def gamma(self) -> int | None:
        """The proposer's proposal length (None: the mode's default)."""
        return None


@dataclass(frozen=True)
class SEPlainSpec(SESpec):
    kind: ClassVar[str] = "se-plain"
    mode: ClassVar[str] = "plain"


@dataclass(frozen=True)
class SESDSpec(SESpec):
    proposal: int
    kind: ClassVar[str] = "se-sd"
    mode: ClassVar[str] = "sd"
    symbol: ClassVar[str | None] = "γ"
    tuned: ClassVar[bool] = True

    @property
    def gamma(self) -> int:
        return self.proposal

    @property
    def value(self) -> float:
        return float(self.proposal)

    @classmethod
    def of(cls, value: float | None, artifact: str | None) -> BaselineSpec:
        return cls(int(value))


@dataclass(frozen=True)
class SEAlternateSpec(SESDSpec):
    kind: ClassVar[str] = "se-alternate"
    mode: ClassVar[str] = "alternate"


@dataclass(frozen=True)
class TargetAloneSpec(BaselineSpec):
    """The target alone (HF ``generate`` on a left-padded batch): the batch axis's reference."""

    kind: ClassVar[str] = "target"


#: What a run decodes with: one of our length policies or a baseline.
RunPolicy = PolicySpec | BaselineSpec


@dataclass(frozen=True)
class Family:
    """A kind of run in the results table: its spec class (which declares the kind's name, parameter symbol and
    properties) and the runner that decodes it."""

    spec: type[PolicySpec] | type[BaselineSpec]
    runner: Literal["decode", "hf", "se"]

    @property
    def name(self) -> str:
        return self.spec.kind


#: The baselines' families, in table order, with their runners (our policies' come from the registry).
BASELINE_FAMILIES = (
    *(Family(spec, "hf") for spec in (HFConstantSpec, HFHeuristicSpec, HFConfidenceSpec)),
    *(Family(spec, "se") for spec in (SEPlainSpec, SESDSpec, SEAlternateSpec)),
)


def families() -> dict[str, Family]:
    """Every run family of the results table, in table order: each registered policy kind
    (:data:`~decode.policy_specs.POLICY_SPECS`, decoded by our decoder), then the baselines."""
    return {family.name: family for family in
            (*(Family(spec, "decode") for spec in POLICY_SPECS.values()), *BASELINE_FAMILIES)}


def perfect_for() -> dict[str, str]:
    """Family → the perfect predictor its gain is measured against: the same stop rule fed the true acceptance
    probabilities (each spec's ``perfect``)."""
    return {name: family.spec.perfect for name, family in families().items() if family.spec.perfect}


def family_names(*, runner: str | None = None, tuned: bool | None = None, rows_alone: bool | None = None,
                 bound: bool | None = None) -> list[str]:
    """The families with these properties, in table order."""
    return [f.name for f in families().values() if (runner is None or f.runner == runner)
            and (tuned is None or f.spec.tuned == tuned) and (rows_alone is None or f.spec.rows_alone == rows_alone)
            and (bound is None or f.spec.bound == bound)]


def run_policy(kind: str, value: float | None = None, artifact: str | None = None) -> RunPolicy:
    """The spec of a run of ``kind`` from its flat form (a results-table row); unknown kinds name the valid ones."""
    if kind in POLICY_SPECS:
        return policy_spec(kind, value, artifact)
    baselines = {f.name: f.spec for f in BASELINE_FAMILIES} | {"target": TargetAloneSpec}
    if kind not in baselines:
        raise ValueError(f"unknown run family {kind!r}; valid: {', '.join([*POLICY_SPECS, *baselines])}")
    return baselines[kind].of(value, artifact)
