"""What a run decodes with, by kind and typed parameters: our length policies and the baselines.

Our decoder's policies are :mod:`decode.policy_specs`; the baselines are here: HF assisted generation
(constant K, HF's heuristic schedule, a confidence threshold), Speculative Ensemble (the plain
ensemble, speculative and alternate proposals at a proposal length γ) and, on the batch axis, the
target alone. How the evaluation runs each kind is its family (:mod:`~accept_heads.measure.families`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from transformers import GenerationConfig

from decode.policy_specs import CountParameter, NamedSpec, PolicySpec, ThresholdParameter


@dataclass(frozen=True)
class BaselineSpec(NamedSpec):
    """A baseline run by kind and typed parameters (the flat form of :class:`decode.policy_specs.NamedSpec`)."""


#: HF's default initial number of assistant tokens (``GenerationConfig.num_assistant_tokens``).
HF_START_TOKENS = 20


@dataclass(frozen=True)
class AssistantSchedule:
    """How HF assisted generation sizes its drafts: the draft's ``generation_config`` settings of one schedule."""

    schedule: Literal["constant", "heuristic"]  # num_assistant_tokens_schedule
    tokens: int  # num_assistant_tokens: drafted per round (the heuristic's start)
    confidence_threshold: float = 0.0  # assistant_confidence_threshold: stop drafting below it (0: never)

    def apply(self, config: GenerationConfig) -> None:
        """Set the schedule on a draft's generation config."""
        config.num_assistant_tokens_schedule = self.schedule
        config.num_assistant_tokens = self.tokens
        config.assistant_confidence_threshold = self.confidence_threshold


@dataclass(frozen=True)
class HFSpec(BaselineSpec):
    """HF assisted generation (``target.generate(assistant_model=draft)``) with one of its schedules."""

    def schedule(self) -> AssistantSchedule:
        """The draft's schedule of this baseline."""
        raise NotImplementedError


@dataclass(frozen=True)
class HFConstantSpec(CountParameter, HFSpec):
    kind: ClassVar[str] = "hf-constant"

    def schedule(self) -> AssistantSchedule:
        return AssistantSchedule("constant", self.k)


@dataclass(frozen=True)
class HFHeuristicSpec(HFSpec):
    kind: ClassVar[str] = "hf-heuristic"

    def schedule(self) -> AssistantSchedule:
        return AssistantSchedule("heuristic", HF_START_TOKENS)


@dataclass(frozen=True)
class HFConfidenceSpec(ThresholdParameter, HFSpec):
    kind: ClassVar[str] = "hf-confidence"

    def schedule(self) -> AssistantSchedule:
        return AssistantSchedule("constant", HF_START_TOKENS, self.tau)


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

    @property
    def gamma(self) -> int:
        return self.proposal

    @property
    def value(self) -> float:
        return float(self.proposal)

    @classmethod
    def of(cls, kind: str, value: float | None, artifact: str | None) -> BaselineSpec:
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
