"""A parameter chosen on the dev prompts (K, τ, h, γ, a rule's swept parameter)."""

from __future__ import annotations

from dataclasses import dataclass

from accept_heads.measure.families import run_policy
from accept_heads.measure.specs import RunPolicy


@dataclass(frozen=True)
class Choice:
    """A parameter value selected on the dev split.

    ``swept="param"``: ``value`` is the policy parameter (K, τ, h, γ) of the runs with this rule,
    ``rule_param``, family and artifact. ``swept="rule_param"``: ``value`` is the rule's swept parameter (the
    FSD threshold T) of the runs with this rule, family, artifact and policy parameter ``param``.
    """

    rule: str
    rule_param: float | None
    family: str
    artifact: str | None
    value: float
    dev_throughput: float
    chosen_on: str = "dev"
    swept: str = "param"
    param: float | None = None

    def run_params(self) -> tuple[float | None, float | None]:
        """``(param, rule_param)`` of the run this choice picks."""
        return (self.value, self.rule_param) if self.swept == "param" else (self.param, self.value)

    def policy(self) -> RunPolicy:
        """The typed policy of the run this choice picks."""
        return run_policy(self.family, self.run_params()[0], self.artifact)
