"""Batched speculative decoding: prompts of different lengths in one draft / verify loop.

Every row is decoded as :meth:`SpeculativeDecoder.generate` would decode it alone: its own copy
of the length policy (:meth:`Policy.fresh`), its own number of drafted and verified candidates,
its own ``torch.Generator`` seeded with :func:`row_seed` and drawn in the batch-1 order, its own
EOS stop and ``max_new_tokens`` budget and its own :class:`DecodeStats`. So a row's output does
not depend on the other rows, and a batch of one is ``generate``. What is shared is the forwards:
one draft forward per drafting step for the rows still drafting (the others get masked columns),
one target forward per round verifying the candidates of all rows, and (ensemble rules) one
draft forward settling the tentative bonus tokens of the rows that have one; rows that finished
leave the caches (:mod:`decode.loops.batch_cache`). The prompt runs once, merged into each model's first
call.

The decisions rows take together are the policy's :class:`~decode.policies.BatchPlan` (DESIGN §7):
SV's joint verification lengths, the goodput head's batch stop and target-only rounds at measured
batch costs; a row's length, never its tokens' distribution, may depend on the other rows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Generator, Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from decode.loops.batch_cache import BatchRunner, Layout
from decode.loops.emit import Emitter, OnTokens
from decode.loops.inputs import check_context, prompt_ids
from decode.loops.rounds import bonus_pending, draft_candidate, record_round, settle_bonus, verify_round
from decode.policies import Decision, DraftRound, Policy
from decode.rules import Rule
from decode.sampling import Sampling
from decode.stats import DecodeStats

_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: consecutive rows land far apart


def row_seed(seed: int, row: int) -> int:
    """Seed of row ``row``'s generator: ``(seed + row · 0x9E3779B97F4A7C15) mod 2**63``.

    Row 0 gets ``seed`` itself (a batch of one draws what ``generate(seed=seed)`` draws); for the
    small seeds used in practice no two ``(seed, row)`` pairs share a seed.
    """
    return (seed + row * _GOLDEN) % 2**63


@dataclass(frozen=True)
class BatchTotals:
    """Counts of the batch as a whole (DESIGN §5 with batched forwards as the calls).

    ``target_calls``: batched target forwards (= verification rounds of the batch);
    ``draft_calls`` / ``companion_calls``: batched forwards of those models; ``tokens``: generated
    tokens of all rows; ``*_shapes``: each forward's ``(rows, tokens per row)``, the first one
    holding the prompts (what a measured ``BatchCosts`` table prices, ``BatchCosts.modelled_seconds``).
    """

    target_calls: int
    draft_calls: int
    companion_calls: int
    tokens: int
    wall_time_s: float
    target_shapes: tuple[tuple[int, int], ...] = ()
    draft_shapes: tuple[tuple[int, int], ...] = ()
    companion_shapes: tuple[tuple[int, int], ...] = ()

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens of all rows per second of wall time."""
        return self.tokens / self.wall_time_s if self.wall_time_s else 0.0


@dataclass
class BatchDecodeOutput:
    """Result of :meth:`SpeculativeDecoder.generate_batch`.

    ``sequences[i]``: row ``i``'s prompt and generated tokens, 1-D, no padding (its prompt is the
    first ``prompt_lengths[i]``); ``stats[i]``: its counts as a batch-1 decode would report them
    (its calls are the batched forwards that fed it a token; its ``wall_time_s`` is the batch's);
    ``texts[i]``: its decoded continuation when the decoder has a tokenizer.
    """

    sequences: list[Tensor]
    prompt_lengths: list[int]
    stats: list[DecodeStats]
    totals: BatchTotals
    texts: list[str] | None = None


def check_supported(policy: Policy) -> None:
    """Raise ``ValueError`` for a policy the batched loop does not implement: one that reads the target in
    hindsight (``Policy.needs_hindsight``: the analysis bounds). Every rule and every other policy is batched."""
    if policy.needs_hindsight:
        raise ValueError(f"batched decoding does not support policy {policy!r}: it reads the target in hindsight "
                         "(an analysis bound, batch 1 only); every other policy and every rule decode batched")


@dataclass(eq=False)
class _Row:
    """One row's decoding state; ``cur`` is its committed length, ``k`` this round's draft cap."""

    index: int
    policy: Policy
    generator: Generator
    budget: int
    cur: int
    stats: DecodeStats = field(default_factory=DecodeStats)
    done: bool = False
    k: int = 0
    state: DraftRound | None = None
    #: Target logits of a tentative bonus token at ``cur − 1`` still to be checked (ensemble rules).
    pending: Tensor | None = None
    #: The draft's output for the last committed position when already computed (after a settled bonus).
    next_q: Tensor | None = None
    next_hidden: Tensor | None = None


class Decoder(Protocol):
    """What the batched loop reads of a :class:`~decode.loops.decoder.SpeculativeDecoder` (which imports this module)."""

    target: PreTrainedModel
    draft: PreTrainedModel
    companion: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase | None
    rule: Rule
    policy: Policy
    sampling: Sampling
    eos: frozenset[int]
    vocab: int
    context: int | None  # the models' shortest context (max_position_embeddings)
    device: torch.device


class _BatchLoop:
    """The draft / verify loop over all rows of a batch (see the module docstring)."""

    def __init__(
        self, decoder: Decoder, tokens: Tensor, rows: list[_Row],
        target: BatchRunner, draft: BatchRunner, companion: BatchRunner | None, emit: Emitter,
    ) -> None:
        self.rule, self.sampling, self.eos = decoder.rule, decoder.sampling, decoder.eos
        self.emit = emit
        self.rule_sampling = decoder.rule.transform(decoder.sampling)
        self.companion_use = decoder.policy.companion
        self.capture = decoder.policy.needs_hidden
        self.tokens, self.rows = tokens, rows
        self.target, self.draft, self.companion = target, draft, companion
        #: The decisions the rows take together (:meth:`Policy.batch_plan`; by default each row's own).
        self.plan = decoder.policy.batch_plan()
        for row in rows:
            row.done = row.budget <= 0

    def run(self) -> None:
        """Decode every row until its EOS or budget (or until the emitter's caller ends it)."""
        rows = [row for row in self.rows if not row.done]
        self._trim_caches(rows)
        while rows:
            self._settle([row for row in rows if row.pending is not None])
            for row in rows:
                if self.emit(row.index, self.tokens[row.index], row.cur):
                    row.done = True
            rows = [row for row in rows if not row.done]
            if rows:
                self._round(rows)
            self._trim_caches([row for row in rows if not row.done])

    def _trim_caches(self, live: list[_Row]) -> None:
        """Roll every cache back to each live row's ``cur − 1`` and drop the finished rows."""
        lengths = {row.index: row.cur - 1 for row in live}
        for runner in (self.target, self.draft, self.companion):
            if runner is not None:
                runner.rollback(lengths, [index for index in runner.rows if index in lengths])

    def _settle(self, rows: list[_Row]) -> None:
        """Check each row's tentative bonus at ``cur − 1`` against the draft (one batched draft forward).

        As the batch-1 loop: an accepted bonus leaves the draft's next ``q`` for the next round; a
        replaced one is rolled back in the draft's cache. A row ends here at EOS or at its budget.
        """
        if not rows:
            return
        logits = self.draft.feed(self.tokens, {row.index: row.cur for row in rows}, keep=2)
        cache_index = {index: b for b, index in enumerate(self.draft.rows)}
        replaced: dict[int, int] = {}
        for row in rows:
            q = logits[row.index]
            accepted, token = settle_bonus(self.rule, row.pending, q[0], self.tokens[row.index], row.cur - 1,
                                           self.sampling, row.generator)
            if accepted:
                row.next_q = q[1]
                row.next_hidden = self.draft.hidden[cache_index[row.index], -1] if self.capture else None
            else:
                replaced[row.index] = row.cur - 1
            row.pending = None
            row.done = token in self.eos or row.stats.generated >= row.budget
        if replaced:
            self.draft.rollback(replaced)

    def _draft_next(self, rows: list[_Row], offset: int) -> None:
        """Feed each row up to ``cur + offset``; append ``q`` (and the hidden state) of its last token."""
        logits = self.draft.feed(self.tokens, {row.index: row.cur + offset for row in rows}, keep=1)
        cache_index = {index: b for b, index in enumerate(self.draft.rows)}
        for row in rows:
            row.state.q_logits.append(logits[row.index][-1])
            hidden = self.draft.hidden[cache_index[row.index], -1] if self.capture else None
            row.state.hidden.append(hidden)

    def _batch_stop(self, drafting: list[_Row], i: int, batch: int, after: Literal["propose", "feed"]) -> list[_Row]:
        """The rows still drafting after the plan's joint stop at ``after`` (proposing or feeding ``y_i``)."""
        if drafting and self.plan.stops_drafting([row.policy for row in drafting], i, batch, after):
            return []
        return drafting

    def _draft(self, rows: list[_Row]) -> None:
        """Draft up to ``row.k`` candidates per row, each row stopping as its policy says."""
        for row in rows:
            if row.next_q is not None:
                row.state.q_logits.append(row.next_q)
                if row.k > 0:
                    row.state.hidden.append(row.next_hidden)
        drafting = [row for row in rows if row.k > 0]
        if not drafting:
            return
        unseen = [row for row in drafting if row.next_q is None]
        if unseen:
            self._draft_next(unseen, 0)
        i = 1
        while drafting:
            if self.companion_use == "step":
                c = self.companion.feed(self.tokens, {row.index: row.cur + i - 1 for row in drafting}, keep=1)
                for row in drafting:
                    row.state.companion_logits.append(c[row.index][-1])
            going = []
            for row in drafting:
                decision = draft_candidate(self.rule, row.policy, row.state, self.tokens[row.index], row.cur + i - 1,
                                           self.sampling, row.generator, self.eos)
                if decision is not Decision.CONTINUE:
                    continue
                if i < row.k:
                    going.append(row)
            going = self._batch_stop(going, i, len(rows), "propose")
            if not going:
                break
            self._draft_next(going, i)
            drafting = [row for row in going if not (row.policy.dynamic and row.policy.after_feed(row.state)
                                                     is Decision.STOP)]
            drafting = self._batch_stop(drafting, i, len(rows), "feed")
            i += 1
        if self.companion_use == "round":
            scored = [row for row in rows if row.state.i]
            if scored:
                ends = {row.index: row.cur + row.state.i - 1 for row in scored}
                c = self.companion.feed(self.tokens, ends, keep=max(row.state.i for row in scored))
                for row in scored:
                    row.state.companion_logits.extend(c[row.index][-row.state.i :].unbind(0))

    def _round(self, rows: list[_Row]) -> None:
        """One draft / verify round of the live rows."""
        for row in rows:
            row.policy.start_round()
            row.k = min(row.policy.k_cap(), row.budget - row.stats.generated - 1)
            row.state = DraftRound(self.rule_sampling)
        if not self.plan.opens_round([row.policy for row in rows]):
            for row in rows:  # a target-only step
                row.k = 0
        self._draft(rows)
        for row in rows:
            row.next_q = row.next_hidden = None
        lengths = self.plan.verification_lengths([row.policy for row in rows], [row.state for row in rows])
        verify = {row.index: length for row, length in zip(rows, lengths)}
        p = self.target.feed(
            self.tokens, {row.index: row.cur + verify[row.index] for row in rows}, keep=max(verify.values()) + 1
        )
        draft_steps = max(row.state.i for row in rows)
        emitted = sum(self._verify(row, p[row.index][-(verify[row.index] + 1):], verify[row.index]) + 1
                      for row in rows)
        self.plan.end_round(len(rows), emitted, draft_steps, sum(verify.values()))

    def _verify(self, row: _Row, p_logits: Tensor, verify: int) -> int:
        """Verify ``row``'s first ``verify`` candidates and commit what it emits (as the batch-1 loop); returns
        the number of candidates the rule accepted."""
        state, tokens, cur = row.state, self.tokens, row.cur
        outcome = verify_round(self.rule, p_logits, state, tokens[row.index, cur : cur + verify], self.sampling,
                               row.generator, self.eos)
        if outcome.from_target:
            tokens[row.index, cur + outcome.accepted_by_rule] = outcome.token
        record_round(row.stats, state.i, outcome)
        row.policy.end_round(state.i, verify, outcome.accepted_by_rule)
        if bonus_pending(self.rule, state, outcome):
            row.pending = p_logits[verify]  # settled against the draft first thing next round
        row.cur += outcome.kept
        row.done = row.pending is None and (outcome.finished or row.stats.generated >= row.budget)
        row.state = None
        return outcome.accepted_by_rule


def unpadded_rows(ids: Tensor | Sequence, attention_mask: Tensor) -> list[Tensor]:
    """The rows of a padded ``[B, n]`` batch without their padding (left or right: each row's mask must be
    one run of ones, as a tokenizer's padding makes it)."""
    if not isinstance(ids, Tensor) or tuple(attention_mask.shape) != tuple(ids.shape):
        raise ValueError("attention_mask goes with a [B, n] tensor of ids of the same shape (a tokenizer's "
                         "input_ids and attention_mask)")
    rows = []
    for i, (row, mask) in enumerate(zip(ids, attention_mask.bool())):
        kept = mask.nonzero().flatten()
        if kept.numel() == 0 or kept[-1] - kept[0] + 1 != kept.numel():
            raise ValueError(f"attention_mask row {i} must be one non-empty run of ones (left or right padding)")
        rows.append(row[kept[0] : kept[-1] + 1])
    return rows


def generate_batch(
    decoder: Decoder,
    prompts: Sequence[Tensor | str | Sequence[int]] | Tensor,
    max_new_tokens: int | Sequence[int],
    seed: int | Sequence[int],
    layout: Layout,
    attention_mask: Tensor | None = None,
    on_tokens: OnTokens | None = None,
) -> BatchDecodeOutput:
    """Implementation of :meth:`SpeculativeDecoder.generate_batch`."""
    check_supported(decoder.policy)
    owner = "SpeculativeDecoder.generate_batch"
    if isinstance(prompts, str) or (isinstance(prompts, Tensor) and prompts.dim() != 2):
        raise ValueError("generate_batch takes a list of prompts or a [B, n] tensor; for one prompt pass [prompt]")
    if attention_mask is not None:
        prompts = unpadded_rows(prompts, attention_mask)
    prompts = list(prompts.unbind(0)) if isinstance(prompts, Tensor) else list(prompts)
    if not prompts:
        raise ValueError("generate_batch needs at least one prompt")
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(budgets) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(budgets)} max_new_tokens")
    if min(budgets) < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {min(budgets)}")
    seeds = [row_seed(seed, i) for i in range(len(prompts))] if isinstance(seed, int) else list(seed)
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    ids = [prompt_ids(prompt, decoder.tokenizer, decoder.device, owner)[0] for prompt in prompts]
    lengths = [len(row) for row in ids]
    for length, budget in zip(lengths, budgets):
        check_context(length, budget, decoder.context, owner)
    tokens = torch.zeros(len(ids), max(n + b for n, b in zip(lengths, budgets)), dtype=torch.long,
                         device=decoder.device)
    for i, row in enumerate(ids):
        tokens[i, : len(row)] = row
    start = time.perf_counter()
    policy = decoder.policy
    rows = [
        _Row(i, policy.fresh(), torch.Generator(device=decoder.device).manual_seed(generator_seed), budget, n)
        for i, (n, budget, generator_seed) in enumerate(zip(lengths, budgets, seeds))
    ]
    batch = len(rows)
    target = BatchRunner(decoder.target, decoder.vocab, batch, layout)
    draft = BatchRunner(decoder.draft, decoder.vocab, batch, layout, capture_hidden=policy.needs_hidden)
    companion = (
        BatchRunner(decoder.companion, decoder.vocab, batch, layout) if policy.companion is not None else None
    )
    try:
        _BatchLoop(decoder, tokens, rows, target, draft, companion, Emitter(on_tokens, lengths)).run()
    finally:
        draft.close()
    wall = time.perf_counter() - start
    for row in rows:
        row.stats.wall_time_s = wall
        row.stats.target_calls = target.row_calls[row.index]
        row.stats.draft_calls = draft.row_calls[row.index]
        row.stats.companion_calls = companion.row_calls[row.index] if companion is not None else 0
    totals = BatchTotals(
        target_calls=target.calls, draft_calls=draft.calls,
        companion_calls=companion.calls if companion is not None else 0,
        tokens=sum(row.stats.generated for row in rows), wall_time_s=wall,
        target_shapes=tuple(target.shapes), draft_shapes=tuple(draft.shapes),
        companion_shapes=tuple(companion.shapes) if companion is not None else (),
    )
    sequences = [tokens[row.index, : row.cur].clone() for row in rows]
    texts = (
        [decoder.tokenizer.decode(seq[n:]) for seq, n in zip(sequences, lengths)]
        if decoder.tokenizer is not None else None
    )
    return BatchDecodeOutput(sequences=sequences, prompt_lengths=lengths, stats=[r.stats for r in rows],
                             totals=totals, texts=texts)
