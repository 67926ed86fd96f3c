"""The one way from config to a verification rule: :func:`build_rule` (collection, training, evaluation)."""

from __future__ import annotations

from ahconf.schema import RulesConfig
from decode.rules import Rule, from_spec


def build_rule(name: str, rules: RulesConfig, *, value: float | None = None) -> Rule:
    """Rule ``name`` with the parameters ``rules.params.<name>`` gives it over the ones it declares (DESIGN §1).

    ``value`` sets its primary parameter instead (:attr:`~decode.rules.Rule.primary`: a point of the evaluation's
    sweep of FSD's threshold T, or the λ / μ of a run's ``rule_param``).
    """
    rule = from_spec(name, **rules.params.get(name, {}))
    return rule if value is None else rule.with_value(value)


def rule_value(name: str, rules: RulesConfig) -> float | None:
    """The configured value of rule ``name``'s primary parameter (fuzzy T, ensemble λ or μ by kind; else None)."""
    return build_rule(name, rules).value
