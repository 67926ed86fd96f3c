"""Per-position columns for collected responses: draft samples, divergences, SV indicators, labels.

Acceptance itself is never defined here: every label column is ``rule.label(...)`` of a rule from
:mod:`decode.rules`, the divergences come from :mod:`decode.divergence`, and the Speculative
Verification indicators are :func:`decode.profile.companion_indicators` — one set per configured
rule (columns :func:`companion_columns`), under the rule's own transform and of its own candidate,
exactly what that rule's SV policy or ``pre`` head computes at decode time.
"""

from __future__ import annotations

from dataclasses import fields

import torch
from torch import Generator, Tensor

from accept_heads.config import RulesConfig
from decode import rules as rule_defs
from decode.divergence import DIVERGENCES
from decode.profile import CompanionIndicators, companion_indicators
from decode.sampling import Sampling


def label_rules(config: RulesConfig) -> dict[str, rule_defs.Rule]:
    """Column name → rule, for every configured rule that has a label column.

    ``fuzzy`` has none: its label ``1[Div < T]`` is applied at training time to the stored
    divergence columns, so any threshold can be chosen later. Ensembles get one column per kind
    with the configured λ and μ.
    """
    columns: dict[str, rule_defs.Rule] = {}
    for name in config.names:
        if name in ("speculative", "greedy"):
            columns[f"label_{name}"] = rule_defs.from_spec(name)
        elif name == "ensemble":
            columns["label_ensemble_weighted"] = rule_defs.Ensemble(kind="weighted", weight=config.ensemble_weight)
            columns["label_ensemble_contrastive"] = rule_defs.Ensemble(kind="contrastive", mu=config.ensemble_mu)
    return columns


def label_column(rule: rule_defs.Rule) -> str:
    """Name of the dataset column holding ``rule``'s labels (fuzzy: the divergence column)."""
    if isinstance(rule, rule_defs.Fuzzy):
        return rule.divergence
    if isinstance(rule, rule_defs.Ensemble):
        return f"label_ensemble_{rule.kind}"
    return f"label_{rule.name}"


def candidate_column(rule: rule_defs.Rule) -> str:
    """Column holding the candidate the rule's draft proposes: ``argmax q`` (greedy) or ``y ~ q``."""
    return "draft_argmax" if isinstance(rule, rule_defs.Greedy) else "draft_token"


def indicator_rules(config: RulesConfig) -> list[rule_defs.Rule]:
    """One rule per configured name: the rules whose companion indicators collection stores.

    The indicators depend only on a rule's transform and candidate, not on fuzzy's threshold or an
    ensemble's kind, so each name stands for all of its parameter choices.
    """
    return [rule_defs.from_spec(name) for name in config.names]


def companion_columns(rule: rule_defs.Rule) -> dict[str, str]:
    """Field of :class:`decode.profile.CompanionIndicators` → column of ``rule``'s stored indicators.

    ``sv_x_<rule>``, ``sv_y_<rule>``, ``sv_log_ratio_<rule>`` (``<rule>`` = :attr:`Rule.name`).
    """
    return {f.name: f"sv_{f.name}_{rule.name}" for f in fields(CompanionIndicators)}


def rule_candidates(rule: rule_defs.Rule, q_logits: Tensor, y: Tensor, sampling: Sampling) -> Tensor:
    """The candidates ``rule`` proposes (:meth:`Rule.propose`) where the draft sampled ``y ~ q`` under ``sampling``.

    ``argmax q`` under a greedy transform, else the sample ``y`` itself (every non-greedy rule
    proposes from the run's own transform, so ``y`` is its proposal; no second draw).
    """
    return q_logits.argmax(-1) if rule.transform(sampling).greedy else y


def draft_candidates(q_logits: Tensor, lengths: list[int], sampling: Sampling, generators: list[Generator]) -> Tensor:
    """The draft's candidate ``y_t`` at every valid position, row by row with each row's generator.

    ``q_logits`` is ``[B, T, V]``; returns the flattened ``[Σ lengths]`` candidates. Each is a sample
    of the transformed ``q_t`` (``argmax q_t`` under the greedy transform), as the decoder proposes.
    """
    propose = rule_defs.Speculative().propose
    return torch.cat([propose(q_logits[row, :n], sampling, g) for row, (n, g) in enumerate(zip(lengths, generators))])


def position_columns(
    p_logits: Tensor,
    q_logits: Tensor,
    c_logits: Tensor | None,
    y: Tensor,
    *,
    sampling: Sampling,
    label_columns: dict[str, rule_defs.Rule],
    companion_rules: list[rule_defs.Rule],
) -> dict[str, Tensor]:
    """All per-position columns for candidates ``y[N]`` given logits ``[N, V]`` (any positions).

    With companion logits, the indicators of every rule in ``companion_rules`` (see
    :func:`companion_columns`).
    """
    q = sampling.probs(q_logits)
    p = sampling.probs(p_logits)
    features = sampling.feature_probs(q_logits)
    columns = {
        "draft_token": y,
        "draft_prob": q.gather(-1, y[:, None]).squeeze(-1),
        "target_prob": p.gather(-1, y[:, None]).squeeze(-1),
        "draft_argmax": q_logits.argmax(-1),
        "target_argmax": p_logits.argmax(-1),
        "draft_entropy": -torch.xlogy(features, features).sum(-1),
        "draft_top_prob": features.max(-1).values,
        **{name: fn(p, q) for name, fn in DIVERGENCES.items()},
    }
    if c_logits is not None:
        by_transform: dict[Sampling, CompanionIndicators] = {}  # same transform: same distributions and candidate
        for rule in companion_rules:
            transform = rule.transform(sampling)
            if transform not in by_transform:
                candidates = rule_candidates(rule, q_logits, y, sampling)
                by_transform[transform] = companion_indicators(transform, q_logits, c_logits, candidates)
            for name, column in companion_columns(rule).items():
                columns[column] = getattr(by_transform[transform], name)
    for column, rule in label_columns.items():
        columns[column] = rule.label(p_logits, q_logits, y, sampling)
    return columns
