"""Per-position columns for collected responses: draft samples, divergences, SV indicators, labels.

Acceptance itself is never defined here: every label column is ``rule.label(...)`` of a rule from
:mod:`decode.rules`, the divergences come from :mod:`decode.divergence`, and the Speculative
Verification indicators are :func:`decode.profile.companion_indicators` — one set per configured
rule (columns :func:`companion_columns`), under the rule's own transform and of its own candidate,
exactly what that rule's SV policy or ``pre`` head computes at decode time.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import TypeVar

import torch
from torch import Generator, Tensor

from ahconf.rule_config import build_rule
from ahconf.schema import RulesConfig
from decode import rules as rule_defs
from decode.divergence import divergences
from decode.profile import CompanionIndicators, companion_indicators_from_probs
from decode.sampling import Sampling
from decode.threads import torch_threads

T = TypeVar("T")


def label_rules(config: RulesConfig) -> dict[str, rule_defs.Rule]:
    """Column name → rule, for every configured rule and each variant it labels (:meth:`Rule.labelled`;
    ensembles get one column per kind with the configured λ and μ, fuzzy none)."""
    rules = [rule for name in config.names for rule in build_rule(name, config).labelled()]
    return {rule.label_column: rule for rule in rules}


def candidate_column(rule: rule_defs.Rule) -> str:
    """Column holding the candidate the rule's draft proposes: ``argmax q`` (greedy) or ``y ~ q``."""
    return "draft_argmax" if isinstance(rule, rule_defs.Greedy) else "draft_token"


def indicator_rules(config: RulesConfig) -> list[rule_defs.Rule]:
    """One rule per configured name: the rules whose companion indicators collection stores.

    The indicators depend only on a rule's transform and candidate, not on fuzzy's threshold or an
    ensemble's kind, so each name stands for all of its parameter choices.
    """
    return [build_rule(name, config) for name in config.names]


def companion_columns(rule: rule_defs.Rule) -> dict[str, str]:
    """Field of :class:`decode.profile.CompanionIndicators` → column of ``rule``'s stored indicators.

    ``sv_x_<rule>``, ``sv_y_<rule>``, ``sv_log_ratio_<rule>`` (``<rule>`` = :attr:`Rule.name`).
    """
    return {f.name: f"sv_{f.name}_{rule.name}" for f in fields(CompanionIndicators)}


#: Columns that read the target alone: stored once, at depth 1.
TARGET_ONLY_COLUMNS = ("target_argmax", "response_logprob", "target_entropy")


def depth_column(name: str, depth: int) -> str:
    """The column of ``name`` at ``depth`` of a round: ``name`` itself at depth 1, else ``name@d<depth>``."""
    return name if depth == 1 else f"{name}@d{depth}"


def base_column(column: str) -> str:
    """``name`` of :func:`depth_column` ``(name, depth)``."""
    return column.split("@d", 1)[0]


def stored_depths(column_names: list[str], name: str) -> int:
    """How many depths of column ``name`` the data holds (1 for any draft but a feature draft)."""
    depth = 1
    while depth_column(name, depth + 1) in column_names:
        depth += 1
    return depth


def depth_columns(columns: dict[str, Tensor], depth: int, steps: Tensor) -> dict[str, Tensor]:
    """:func:`position_columns` of a deeper ``depth`` renamed by :func:`depth_column`, the target-only ones left out.

    ``steps [N]``: each position's index in its response. A round reaching ``depth`` at response token ``t``
    started at token ``t − depth + 1``; one that would start inside the prompt is never drafted, so its float
    columns are NaN (its candidates are kept: integers).
    """
    reached = steps >= depth - 1
    renamed = {}
    for name, values in columns.items():
        if name in TARGET_ONLY_COLUMNS:
            continue
        if values.is_floating_point():
            values = values.masked_fill(~reached, float("nan"))
        renamed[depth_column(name, depth)] = values
    return renamed


def rule_candidates(rule: rule_defs.Rule, q_argmax: Tensor, y: Tensor, sampling: Sampling) -> Tensor:
    """The candidates ``rule`` proposes (:meth:`Rule.propose`) where the draft sampled ``y ~ q`` under ``sampling``.

    ``q_argmax`` (``argmax q``) under a greedy transform, else the sample ``y`` itself (every
    non-greedy rule proposes from the run's own transform, so ``y`` is its proposal; no second draw).
    """
    return q_argmax if rule.transform(sampling).greedy else y


def draft_candidates(q_logits: Tensor, lengths: list[int], sampling: Sampling, generators: list[Generator]) -> Tensor:
    """The draft's candidate ``y_t`` at every valid position, row by row with each row's generator.

    ``q_logits`` is ``[B, T, V]``; returns the flattened ``[Σ lengths]`` candidates. Each is a sample
    of the transformed ``q_t`` (``argmax q_t`` under the greedy transform), as the decoder proposes.
    Rows are spread over CPU threads (:func:`_map`; ``torch.multinomial`` draws its exponential
    noise serially on CPU); each row still makes the same single draw from its own generator.
    """
    propose = rule_defs.Speculative().propose

    def candidates(row: int) -> Tensor:
        return propose(q_logits[row, : lengths[row]], sampling, generators[row])

    return torch.cat(_map(candidates, range(len(lengths)), q_logits.device))


#: Elements of one ``[positions, V]`` tensor in a chunk of :func:`batch_columns`. On CPU, 2 MiB of
#: float32 keeps a chunk's intermediates in cache (docs/log/figures-behind-the-defaults.md); on an
#: accelerator the bound only caps their memory.
CPU_CHUNK_ELEMENTS = 2**19
DEVICE_CHUNK_ELEMENTS = 2**25


def chunk_positions(device: torch.device, vocab: int) -> int:
    """Positions per chunk of :func:`batch_columns` for logits of ``vocab`` entries on ``device`` (≥ 16 on CPU)."""
    if device.type == "cpu":
        return max(16, CPU_CHUNK_ELEMENTS // vocab)
    return max(1, DEVICE_CHUNK_ELEMENTS // vocab)


def _map(fn: Callable[[int], T], items: range, device: torch.device) -> list[T]:
    """``[fn(i) for i in items]``; on CPU spread over ``torch.get_num_threads()`` threads, each op single-threaded.

    For row-wise work in many small operations (cache-sized chunks, one row's draws): split by item,
    the cores run without the thread barrier that intra-op parallelism puts after every operation,
    which stalls whenever a core is busy elsewhere (docs/log/figures-from-code-comments.md).
    Every operation being row-wise, the values are those of the plain loop.
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1 or len(items) < 2:
        return [fn(i) for i in items]
    # one thread, read by the workers' operations; the caller waits in pool.map meanwhile
    with torch_threads(1), ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fn, items))


class _Distributions:
    """Each model's distributions under each transform at one set of positions, each computed once.

    ``logits`` maps a role (``p``, ``q``, ``c``) to its raw logits ``[N, V]``. Every column that
    needs a model's distribution under a transform, or its argmax, reads it here, so a chunk pays
    one softmax per model and transform however many columns and rules use it. Also the
    :class:`decode.rules.SharedScores` that every rule's label reads.
    """

    def __init__(self, logits: dict[str, Tensor]) -> None:
        self.logits = logits
        self._memo: dict[tuple[str, Sampling | None], Tensor] = {}

    def of(self, role: str, transform: Sampling) -> Tensor:
        """``transform.probs`` of ``role``'s logits."""
        if (role, transform) not in self._memo:
            self._memo[role, transform] = transform.probs(self.logits[role])
        return self._memo[role, transform]

    def features(self, role: str, transform: Sampling) -> Tensor:
        """``transform.feature_probs`` of ``role``'s logits.

        By :meth:`~decode.sampling.Sampling.feature_probs`' definition these are the transform's
        probabilities, except under greedy the untempered softmax, i.e. ``Sampling()``'s probabilities.
        """
        return self.of(role, Sampling() if transform.greedy else transform)

    def argmax_of(self, role: str) -> Tensor:
        """``argmax`` of ``role``'s raw logits."""
        if (role, None) not in self._memo:
            self._memo[role, None] = self.logits[role].argmax(-1)
        return self._memo[role, None]

    def probs(self, transform: Sampling) -> tuple[Tensor, Tensor]:
        """:meth:`decode.rules.SharedScores.probs`."""
        return self.of("p", transform), self.of("q", transform)

    def argmax(self) -> tuple[Tensor, Tensor]:
        """:meth:`decode.rules.SharedScores.argmax`."""
        return self.argmax_of("p"), self.argmax_of("q")


def position_columns(
    p_logits: Tensor,
    q_logits: Tensor,
    c_logits: Tensor | None,
    y: Tensor,
    response: Tensor,
    *,
    sampling: Sampling,
    label_columns: dict[str, rule_defs.Rule],
    companion_rules: list[rule_defs.Rule],
) -> dict[str, Tensor]:
    """All per-position columns for candidates ``y[N]`` given logits ``[N, V]`` (any positions).

    ``response[N]`` are the tokens the response has there: ``response_logprob`` (their log
    probability under the target's feature distribution) and ``target_entropy`` (that
    distribution's entropy) let the manifest test that the responses are samples of the run's
    transform (:func:`data_gen.manifest.sampling_check`). With companion logits, the indicators of
    every rule in ``companion_rules`` (see :func:`companion_columns`). Each model's distribution
    under each transform is computed once (:class:`_Distributions`) and shared by the features,
    the divergences, the indicators and every rule's :meth:`~decode.rules.Rule.label`.
    """
    dists = _Distributions({"p": p_logits, "q": q_logits} | ({} if c_logits is None else {"c": c_logits}))
    p, q = dists.probs(sampling)
    features = dists.features("q", sampling)
    target_features = dists.features("p", sampling)
    columns = {
        "draft_token": y,
        "draft_prob": q.gather(-1, y[:, None]).squeeze(-1),
        "target_prob": p.gather(-1, y[:, None]).squeeze(-1),
        "draft_argmax": dists.argmax_of("q"),
        "target_argmax": dists.argmax_of("p"),
        "draft_entropy": -torch.xlogy(features, features).sum(-1),  # as the ``pre`` head computes it (decode.head)
        "draft_top_prob": features.max(-1).values,
        "response_logprob": target_features.gather(-1, response[:, None]).squeeze(-1).log(),
        "target_entropy": -torch.xlogy(target_features, target_features).sum(-1),
        **divergences(p, q),
    }
    if c_logits is not None:
        by_transform: dict[Sampling, CompanionIndicators] = {}  # same transform: same distributions and candidate
        for rule in companion_rules:
            transform = rule.transform(sampling)
            if transform not in by_transform:
                candidates = rule_candidates(rule, dists.argmax_of("q"), y, sampling)
                by_transform[transform] = companion_indicators_from_probs(
                    dists.features("q", transform), dists.features("c", transform), candidates
                )
            for name, column in companion_columns(rule).items():
                columns[column] = getattr(by_transform[transform], name)
    for column, rule in label_columns.items():
        columns[column] = rule.label(p_logits, q_logits, y, sampling, shared=dists)
    return columns


def batch_columns(
    p_logits: Tensor,
    q_logits: Tensor,
    c_logits: Tensor | None,
    y: Tensor,
    response: Tensor,
    valid: Tensor,
    *,
    sampling: Sampling,
    label_columns: dict[str, rule_defs.Rule],
    companion_rules: list[rule_defs.Rule],
) -> dict[str, Tensor]:
    """:func:`position_columns` of a batch: logits ``[B, T, V]`` at the positions ``valid[B, T]`` marks.

    ``y`` and ``response`` hold the candidates and the response's tokens of the valid positions in
    row-major order. Runs chunk by chunk of
    :func:`chunk_positions` positions (gathered from the logits, no copy of the whole batch; on CPU
    the chunks spread over threads, :func:`_map`): the values do not depend on the chunking, every
    operation being row-wise.
    """
    rows, steps = valid.nonzero(as_tuple=True)
    size = chunk_positions(p_logits.device, p_logits.shape[-1])

    def chunk(start: int) -> dict[str, Tensor]:
        at = rows[start : start + size], steps[start : start + size]
        return position_columns(
            p_logits[at], q_logits[at], None if c_logits is None else c_logits[at], y[start : start + size],
            response[start : start + size], sampling=sampling, label_columns=label_columns,
            companion_rules=companion_rules,
        )

    chunks = _map(chunk, range(0, len(rows), size), p_logits.device)
    return {name: torch.cat([values[name] for values in chunks]) for name in chunks[0]}
