"""Per-position columns for collected responses: draft samples, divergences, SV indicators, labels.

Acceptance itself is never defined here: every label column is ``rule.label(...)`` of a rule from
:mod:`decode.rules`, the divergences come from :mod:`decode.divergence`, and the Speculative
Verification indicators from :mod:`decode.profile`.
"""

from __future__ import annotations

import torch
from torch import Generator, Tensor

from accept_heads.config import RulesConfig
from decode import rules as rule_defs
from decode.divergence import DIVERGENCES
from decode.profile import sv_indicators
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
) -> dict[str, Tensor]:
    """All per-position columns for candidates ``y[N]`` given logits ``[N, V]`` (any positions)."""
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
        columns["sv_x"], columns["sv_y"] = sv_indicators(q, sampling.probs(c_logits), y)
    for column, rule in label_columns.items():
        columns[column] = rule.label(p_logits, q_logits, y, sampling)
    return columns
