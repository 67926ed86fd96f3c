"""Which runs an evaluation decodes: the dev sweeps (for selection), then test / OOD with the dev choices.

A choice (best fixed K, confidence τ, head threshold h) is keyed by rule, rule parameter, policy
family and artifact; it is only ever made from dev rows (:func:`accept_heads.evaluation.table.select`)
and applied here to the other sets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from accept_heads.config import Config

from accept_heads.evaluation import ensemble
from accept_heads.evaluation.artifacts import Artifacts
from accept_heads.evaluation.runs import RunSpec, build_rule, rule_param
from accept_heads.evaluation.sets import PromptSet

#: Families whose parameter is chosen on dev.
TUNED = ("fixed", "confidence", "head")
#: HF's default assistant confidence threshold.
HF_CONFIDENCE = 0.4


@dataclass(frozen=True)
class Choice:
    """A parameter value selected on the dev split."""

    rule: str
    rule_param: float | None
    family: str
    artifact: str | None
    value: float
    dev_throughput: float
    chosen_on: str = "dev"

    def key(self) -> tuple:
        return self.rule, self.rule_param, self.family, self.artifact


def eval_rules(config: Config) -> list[str]:
    """Rules to decode with: ``evaluate.rules``, else ``rules.names``."""
    return list(config.evaluate.rules or config.rules.names)


def matching_artifacts(artifacts: Artifacts, rule: str, param: float | None, config: Config) -> tuple[list, list]:
    """Names of the heads and profiles fitted for exactly this rule (and rule parameters)."""
    spec = build_rule(rule, param, config.rules).spec()
    heads = sorted(n for n, h in artifacts.heads.items() if h.metadata.get("rule") == spec)
    profiles = sorted(n for n, p in artifacts.profiles.items() if p.metadata.get("rule") == spec)
    return heads, profiles


def unmatched(config: Config, artifacts: Artifacts, rules: list[str]) -> list[str]:
    """Heads and profiles fitted for a rule (or rule parameters) that none of ``rules`` decodes with."""
    specs = [build_rule(rule, rule_param(rule, config.rules), config.rules).spec() for rule in rules]
    items = [*artifacts.heads.items(), *artifacts.profiles.items()]
    return sorted(f"{name} ({a.metadata.get('rule')})" for name, a in items if a.metadata.get("rule") not in specs)


def sweep(config: Config, artifacts: Artifacts, set_name: str, rule: str) -> list[RunSpec]:
    """Every policy of ``rule`` with its whole grid (K, τ, h) plus the parameter-free ones."""
    e = config.evaluate
    param = rule_param(rule, config.rules)
    base = RunSpec(set=set_name, rule=rule, family="fixed", rule_param=param)
    heads, profiles = matching_artifacts(artifacts, rule, param, config)
    specs = [replace(base, param=float(k), chosen_on="grid") for k in e.fixed_k]
    specs.append(replace(base, family="heuristic"))
    specs += [replace(base, family="confidence", param=float(t), chosen_on="grid") for t in e.confidence_taus]
    thresholds = e.thresholds or config.head.thresholds
    specs += [replace(base, family="head", artifact=name, param=float(h), chosen_on="grid")
              for name in heads for h in thresholds]
    specs += [replace(base, family="sv", artifact=name) for name in profiles]
    if rule == "greedy":
        specs.append(replace(base, family="oracle"))
    return specs


def mark_chosen(specs: Iterable[RunSpec], choices: list[Choice]) -> list[RunSpec]:
    """Label the grid points that the dev selection picked ``chosen_on='dev'``."""
    picked = {c.key(): c.value for c in choices}
    return [replace(s, chosen_on="dev") if s.family in TUNED and picked.get((s.rule, s.rule_param, s.family,
            s.artifact)) == s.param else s for s in specs]


def applied(config: Config, artifacts: Artifacts, set_name: str, rule: str, choices: list[Choice]) -> list[RunSpec]:
    """The policies of ``rule`` on a test / OOD set: each tuned family at its dev choice only
    (the whole grid with ``evaluate.sweep_test``)."""
    specs = mark_chosen(sweep(config, artifacts, set_name, rule), choices)
    if config.evaluate.sweep_test:
        return specs
    return [s for s in specs if s.family not in TUNED or s.chosen_on == "dev"]


def fsd_sweep(config: Config, set_name: str, choices: list[Choice]) -> list[RunSpec]:
    """Fuzzy rule at each ``evaluate.fuzzy_thresholds`` T with the fixed K chosen on dev for fuzzy."""
    k = next((c.value for c in choices if c.rule == "fuzzy" and c.family == "fixed"), None)
    if k is None:
        return []
    return [RunSpec(set=set_name, rule="fuzzy", family="fixed", param=k, rule_param=float(t), chosen_on="dev")
            for t in config.evaluate.fuzzy_thresholds]


def hf_specs(config: Config, set_name: str, rules: list[str], choices: list[Choice]) -> list[RunSpec]:
    """HF assisted generation for the speculative / greedy rules: constant K (``evaluate.hf_k``, else the
    fixed K chosen on dev), the heuristic schedule and confidence 0.4."""
    specs = []
    for rule in (r for r in rules if r in ("speculative", "greedy")):
        if config.evaluate.hf_k:
            specs += [RunSpec(set=set_name, rule=rule, family="hf-constant", param=float(k))
                      for k in config.evaluate.hf_k]
        else:
            specs += [RunSpec(set=set_name, rule=rule, family="hf-constant", param=c.value, chosen_on="dev")
                      for c in choices if c.rule == rule and c.family == "fixed"]
        specs.append(RunSpec(set=set_name, rule=rule, family="hf-heuristic"))
        specs.append(RunSpec(set=set_name, rule=rule, family="hf-confidence", param=HF_CONFIDENCE))
    return specs


def unique(specs: Iterable[RunSpec]) -> list[RunSpec]:
    """Drop repeated runs, keeping the first occurrence's order."""
    return list(dict.fromkeys(specs))


def se_specs(config: Config, set_name: str) -> list[RunSpec]:
    """Speculative Ensemble of draft + target: the plain ensemble, then SD and alternate proposals per γ."""
    base = RunSpec(set=set_name, rule="ensemble", family="se-plain", rule_param=rule_param("ensemble", config.rules))
    return [base] + [replace(base, family=family, param=float(g))
                     for family in ("se-sd", "se-alternate") for g in config.evaluate.se_gammas]


def after_selection(config: Config, artifacts: Artifacts, sets: list[PromptSet], rules: list[str],
                    choices: list[Choice]) -> list[RunSpec]:
    """Everything decoded once the dev choices are made: every test / OOD set, FSD, SE and HF runs."""
    specs = [spec for s in sets if s.role != "dev" for rule in rules
             for spec in applied(config, artifacts, s.name, rule, choices)]
    if "fuzzy" in rules:
        specs += fsd_sweep(config, "test", choices)
    if "ensemble" in rules and ensemble.available():
        specs += se_specs(config, "test")
    if config.evaluate.hf_baselines:
        specs += [spec for s in sets if s.role in config.evaluate.hf_sets for spec in hf_specs(config, s.name, rules, choices)]
    return unique(specs)
