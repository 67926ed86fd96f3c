"""Which runs an evaluation decodes: the dev sweeps (for selection), then test / OOD with the dev choices.

A choice (best fixed K, confidence τ, head threshold h, SE proposal length γ, and, at a rule's chosen K,
the rule's swept parameter such as the FSD threshold T) is only ever made from dev rows
(:func:`accept_heads.evaluation.table.select`) and applied here to the other sets. Every other
point of a swept grid that is decoded on test (``evaluate.sweep_test``; a rule's grid on test,
which the quality-vs-T figure needs) is marked ``grid``. The policy kinds and their grids are the
registered families' (:mod:`~accept_heads.measure.families`), the swept rules the rules that declare one
(:attr:`decode.rules.Rule.swept`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from accept_heads.evaluation.choice import Choice
from accept_heads.measure.families import families, family
from accept_heads.measure.inputs import Artifacts, PromptSet
from accept_heads.measure.runs import RunSpec
from accept_heads.measure.specs import (
    HFConfidenceSpec,
    HFConstantSpec,
    HFHeuristicSpec,
    SEAlternateSpec,
    SEPlainSpec,
    SESDSpec,
)
from ahconf.rule_config import build_rule, rule_value
from ahconf.schema import EvaluateConfig, EvaluateJob, RulesConfig
from decode.policy_specs import FixedSpec, HeuristicSpec
from decode.rules import RULES

if TYPE_CHECKING:
    from accept_heads.evaluation.evaluation_plan import EvaluationPlan

#: HF's default assistant confidence threshold.
HF_CONFIDENCE = 0.4


def matching_artifacts(artifacts: Artifacts, rule: str, param: float | None,
                       rules: RulesConfig) -> tuple[list, list]:
    """Names of the heads and profiles fitted for exactly this rule (and rule parameters)."""
    spec = build_rule(rule, rules, value=param).spec()
    heads = sorted(n for n, h in artifacts.heads.items() if h.metadata.rule == spec)
    profiles = sorted(n for n, p in artifacts.profiles.items() if p.metadata.rule == spec)
    return heads, profiles


def unmatched(rules_config: RulesConfig, artifacts: Artifacts, rules: list[str]) -> list[str]:
    """Heads and profiles fitted for a rule (or rule parameters) that none of ``rules`` decodes with."""
    specs = [build_rule(rule, rules_config).spec() for rule in rules]
    items = [*artifacts.heads.items(), *artifacts.profiles.items()]
    recorded = [(name, a.metadata.rule) for name, a in items]
    return sorted(f"{name} ({rule})" for name, rule in recorded if rule not in specs)


def sweep(job: EvaluateJob, plan: EvaluationPlan, artifacts: Artifacts, set_name: str, rule: str) -> list[RunSpec]:
    """Every policy family of our decoder for ``rule`` (in table order) with its whole dev grid in ``plan``, per
    matching head or profile where it reads one; the bounds only with ``evaluate.bounds``."""
    param = rule_value(rule, job.rules)
    base = RunSpec(set=set_name, rule=rule, policy=HeuristicSpec(), rule_param=param)
    heads, profiles = matching_artifacts(artifacts, rule, param, job.rules)
    return [replace(base, policy=spec, chosen_on="grid" if kind.tuned else base.chosen_on)
            for kind in families().values()
            if kind.runner == "decode" and not kind.batch_only and (job.evaluate.bounds or not kind.bound)
            for spec in kind.candidates(plan.grid(kind.name) if kind.tuned else [], heads, profiles)]


def mark_chosen(specs: Iterable[RunSpec], choices: list[Choice]) -> list[RunSpec]:
    """Label the grid points that the dev selection picked ``chosen_on='dev'``."""
    picked = {(c.rule, c.policy(), c.run_params()[1]) for c in choices}
    return [replace(s, chosen_on="dev") if family(s.family).tuned and (s.rule, s.policy, s.rule_param) in picked
            else s for s in specs]


def applied(e: EvaluateConfig, specs: list[RunSpec], choices: list[Choice]) -> list[RunSpec]:
    """A dev sweep's runs on a test / OOD set: each tuned one at its dev choice only (the whole grid,
    marked ``grid``, with ``evaluate.sweep_test``)."""
    specs = mark_chosen(specs, choices)
    if e.sweep_test:
        return specs
    return [s for s in specs if s.chosen_on != "grid"]


def swept_rules(rules: list[str]) -> list[str]:
    """The rules of ``rules`` with a parameter the evaluation sweeps (:attr:`decode.rules.Rule.swept`: fuzzy's T)."""
    return [rule for rule in rules if RULES[rule].swept is not None]


def rule_k(choices: list[Choice], rule: str) -> float | None:
    """The fixed K chosen on dev for ``rule`` (at its configured parameters); None without its runs."""
    return next((c.value for c in choices if c.rule == rule and c.family == "fixed" and c.swept == "param"), None)


#: The fixed-K grid grows no further than this.
K_CEILING = 64


def edge_rules(choices: list[Choice], grid: list[int]) -> list[str]:
    """Rules whose fixed K chosen on dev is the largest K of ``grid`` (the optimum may lie beyond)."""
    return sorted({c.rule for c in choices if c.family == "fixed" and c.swept == "param" and c.value == max(grid)})


def edge_note(choices: list[Choice], grid: list[int]) -> str | None:
    """The results' note naming the rules whose best fixed K is still ``grid``'s largest (None: no rule is)."""
    edge = edge_rules(choices, grid)
    if not edge:
        return None
    return f"best fixed K at the grid's edge K={max(grid)} for {', '.join(edge)}: the optimum may lie beyond"


def extended_k(grid: list[int]) -> list[int]:
    """The next fixed-K values past ``grid``'s largest: 1.5× and 2× it (capped at :data:`K_CEILING`)."""
    top = max(grid)
    return sorted({k for k in (round(top * 1.5), 2 * top) if top < k <= K_CEILING})


def fixed_specs(rules: RulesConfig, set_name: str, rule: str, ks: list[int]) -> list[RunSpec]:
    """Fixed-K runs of ``rule`` at each K of ``ks`` (grid points)."""
    return [RunSpec(set=set_name, rule=rule, policy=FixedSpec(int(k)), rule_param=rule_value(rule, rules),
                    chosen_on="grid") for k in ks]


def rule_sweep(job: EvaluateJob, set_name: str, rule: str, choices: list[Choice]) -> list[RunSpec]:
    """``rule`` at each value of its swept parameter in ``evaluate.rule_grids.<rule>`` (FSD's T) with the fixed K
    chosen on dev for it (``grid``).

    The configured value is left out: the rule's own policy sweep decodes it at that K.
    """
    k = rule_k(choices, rule)
    if k is None:
        return []
    configured = rule_value(rule, job.rules)
    return [RunSpec(set=set_name, rule=rule, policy=FixedSpec(int(k)), rule_param=float(t), chosen_on="grid")
            for t in job.evaluate.rule_grids.get(rule, []) if t != configured]


def hf_specs(e: EvaluateConfig, set_name: str, rules: list[str], choices: list[Choice]) -> list[RunSpec]:
    """HF assisted generation for the speculative / greedy rules: constant K (``evaluate.hf.k``, else the
    fixed K chosen on dev), the heuristic schedule and confidence 0.4."""
    specs = []
    for rule in (r for r in rules if r in ("speculative", "greedy")):
        if e.hf.k:
            specs += [RunSpec(set=set_name, rule=rule, policy=HFConstantSpec(int(k))) for k in e.hf.k]
        else:
            specs += [RunSpec(set=set_name, rule=rule, policy=HFConstantSpec(int(c.value)), chosen_on="dev")
                      for c in choices if c.rule == rule and c.family == "fixed"]
        specs.append(RunSpec(set=set_name, rule=rule, policy=HFHeuristicSpec()))
        specs.append(RunSpec(set=set_name, rule=rule, policy=HFConfidenceSpec(HF_CONFIDENCE)))
    return specs


def at_fixed_k(job: EvaluateJob, artifacts: Artifacts, set_name: str, rules: list[str],
               choices: list[Choice]) -> list[RunSpec]:
    """Each family's variants at the fixed K chosen on dev for its rule (:attr:`Family.at_fixed_k`), per matching
    artifact: SV drafting that K beside SV drafting its profile's ``k_max``, the SV paper's comparison (verify a
    goodput-optimal prefix of the drafts the fixed-K baseline makes)."""
    specs = []
    for choice in (c for c in choices if c.family == "fixed" and c.swept == "param" and c.rule in rules):
        heads, profiles = matching_artifacts(artifacts, choice.rule, choice.rule_param, job.rules)
        specs += [RunSpec(set=set_name, rule=choice.rule, policy=variant, rule_param=choice.rule_param,
                          chosen_on="dev")
                  for kind in families().values() if kind.runner == "decode" and not kind.tuned and not kind.batch_only
                  for spec in kind.candidates([], heads, profiles)
                  for variant in kind.at_fixed_k(spec, int(choice.value))]
    return specs


def unique(specs: Iterable[RunSpec]) -> list[RunSpec]:
    """Drop repeated runs, keeping the first occurrence's order."""
    return list(dict.fromkeys(specs))


def se_sweep(job: EvaluateJob, plan: EvaluationPlan, set_name: str) -> list[RunSpec]:
    """Speculative Ensemble of draft + target: SD and alternate proposals at each γ of their grid
    (``evaluate.se_gammas``)."""
    rule_param = rule_value("ensemble", job.rules)
    return [RunSpec(set=set_name, rule="ensemble", policy=spec(int(g)), rule_param=rule_param, chosen_on="grid")
            for spec in (SESDSpec, SEAlternateSpec) for g in plan.grid(spec.kind)]


DevKey = tuple[str, float | None, str, str | None]  # a tuned run's rule, rule parameter, family and artifact


def _dev_key(rule: str, rule_param: float | None, family_name: str, artifact: str | None) -> DevKey:
    return rule, None if rule_param is None else float(rule_param), family_name, artifact


def climb(sweep: Sequence[RunSpec], choices: list[Choice], search: str = "climb") -> list[RunSpec]:
    """The dev runs of ``sweep`` a search over each tuned grid wants, given the ``choices`` made on what it decoded
    so far (the caller decodes those not yet decoded, chooses again and asks again until nothing is new).

    ``search="climb"``: every untuned run, and per grid (a rule, rule parameter, family and artifact) the neighbours
    of its best value so far, starting from the grid's middle value and its neighbours: a climb that stops where the
    best value's neighbours are decoded, exact for a modelled throughput that is unimodal along the grid
    (docs/evaluation.md, "Dev grids"). ``search="grid"``: the whole of ``sweep``.
    """
    if search == "grid":
        return list(sweep)
    best = {_dev_key(c.rule, c.rule_param, c.family, c.artifact): c.value for c in choices if c.swept == "param"}
    grids: dict[DevKey, list[RunSpec]] = {}
    wanted = []
    for spec in sweep:
        if family(spec.family).tuned:
            grids.setdefault(_dev_key(spec.rule, spec.rule_param, spec.family, spec.artifact), []).append(spec)
        else:
            wanted.append(spec)
    for key, runs in grids.items():
        runs = sorted(runs, key=lambda spec: float(spec.param))
        values = [float(spec.param) for spec in runs]
        at = values.index(best[key]) if best.get(key) in values else len(values) // 2
        wanted += [runs[i] for i in (at - 1, at, at + 1) if 0 <= i < len(runs)]
    chosen = set(wanted)
    return [spec for spec in sweep if spec in chosen]


def dev_sweeps(job: EvaluateJob, plan: EvaluationPlan, artifacts: Artifacts) -> list[RunSpec]:
    """The dev runs a choice is made over: every rule's policy sweep and the SE γ sweep, over the plan's grids."""
    specs = [spec for rule in plan.rules for spec in sweep(job, plan, artifacts, "dev", rule)]
    if "ensemble" in plan.rules:
        specs += se_sweep(job, plan, "dev")
    return unique(specs)


def after_selection(job: EvaluateJob, plan: EvaluationPlan, artifacts: Artifacts,
                    sets: list[PromptSet]) -> list[RunSpec]:
    """Everything decoded once the plan's dev choices are made, on every test / OOD set: the policies (SV also at
    the dev-chosen fixed K), the swept rules (their whole grid on test), SE (with the plain ensemble) and HF
    runs."""
    rules, choices = list(plan.rules), list(plan.choices)
    specs = []
    for s in (s for s in sets if s.role != "dev"):
        specs += [spec for rule in rules
                  for spec in applied(job.evaluate, sweep(job, plan, artifacts, s.name, rule), choices)]
        specs += at_fixed_k(job, artifacts, s.name, rules, choices)
        for rule in swept_rules(rules):
            grid = mark_chosen(rule_sweep(job, s.name, rule, choices), choices)
            specs += grid if s.role == "test" else applied(job.evaluate, grid, choices)
        if "ensemble" in rules:
            specs.append(RunSpec(set=s.name, rule="ensemble", policy=SEPlainSpec(),
                                 rule_param=rule_value("ensemble", job.rules)))
            specs += applied(job.evaluate, se_sweep(job, plan, s.name), choices)
    if plan.hf_baselines:
        specs += [spec for s in sets if s.role in job.evaluate.hf.sets
                  for spec in hf_specs(job.evaluate, s.name, rules, choices)]
    return unique(specs)
