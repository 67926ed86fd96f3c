"""The one way from config to a verification rule: :func:`build_rule` (collection, training, evaluation)."""

from __future__ import annotations

from ahconf.schema import RulesConfig
from decode.rules import Ensemble, Fuzzy, Rule, from_spec


def rule_parameter(name: str, rules: RulesConfig, kind: str | None = None) -> float | None:
    """The configured parameter of rule ``name``: fuzzy T, ensemble λ (weighted) or μ (contrastive); else None.

    ``kind``: the ensemble kind (default ``rules.ensemble_kind``).
    """
    if name == "fuzzy":
        return rules.fuzzy_threshold
    if name == "ensemble":
        return rules.ensemble_weight if (kind or rules.ensemble_kind) == "weighted" else rules.ensemble_mu
    return None


def build_rule(name: str, rules: RulesConfig, *, parameter: float | None = None, kind: str | None = None) -> Rule:
    """Rule ``name`` as configured by ``rules`` (DESIGN §1).

    ``parameter`` overrides the configured one (a swept FSD threshold); ``kind`` the ensemble kind
    (collection labels both kinds). The fuzzy divergence and the ensemble kind come from ``rules``.
    """
    value = rule_parameter(name, rules, kind) if parameter is None else parameter
    if name == "fuzzy":
        return Fuzzy(rules.fuzzy_divergence, value)
    if name == "ensemble":
        if (kind or rules.ensemble_kind) == "weighted":
            return Ensemble("weighted", weight=value)
        return Ensemble("contrastive", mu=value)
    return from_spec(name)
