"""Batched speculative decoding: prompts of different lengths decoded together, and what a batch returns.

Every row is decoded as :meth:`SpeculativeDecoder.generate` would decode it alone (its own policy copy
(:meth:`Policy.fresh`), ``torch.Generator`` seeded with :func:`row_seed`, EOS stop, budget and
:class:`DecodeStats`), so a row's output does not depend on the other rows and a batch of one is ``generate``.
The rows share the forwards of :class:`~decode.loops.round_loop.RoundLoop` in shared caches
(:mod:`decode.loops.batch_cache`; rows that finished leave them); the prompt runs once, merged into each
model's first call. The decisions rows take together are the policy's :class:`~decode.policies.BatchPlan`
(DESIGN §7): SV's joint verification lengths, the goodput head's batch stop and target-only rounds at measured
batch costs; a row's length, never its tokens' distribution, may depend on the other rows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from decode.drafts import drafter_of
from decode.loops.batch_cache import BatchRunner, Layout
from decode.loops.emit import Emitter, OnTokens
from decode.loops.prompt_input import check_context, prompt_ids
from decode.loops.round_loop import RoundLoop, Row, Runners
from decode.policies.base import Policy
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
    """Result of :meth:`SpeculativeDecoder.generate` with several prompts.

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


class Decoder(Protocol):
    """What the batched loop reads of a :class:`~decode.loops.speculative_decoder.SpeculativeDecoder` (which imports this module)."""

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

    def unverified_files(self) -> list[str]: ...


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
    """:meth:`SpeculativeDecoder.generate` of several prompts (a list, or a ``[B, n]`` tensor)."""
    owner = "SpeculativeDecoder.generate"
    if attention_mask is not None:
        prompts = unpadded_rows(prompts, attention_mask)
    prompts = list(prompts.unbind(0)) if isinstance(prompts, Tensor) else list(prompts)
    if not prompts:
        raise ValueError("generate needs at least one prompt")
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
        Row(i, policy.fresh(), torch.Generator(device=decoder.device).manual_seed(generator_seed), budget, n)
        for i, (n, budget, generator_seed) in enumerate(zip(lengths, budgets, seeds))
    ]
    batch = len(rows)
    feed = drafter_of(decoder.draft).feed(decoder.draft, batch, tokens.shape[1])
    target = BatchRunner(decoder.target, decoder.vocab, batch, layout, observer=feed.observer)
    draft = BatchRunner(decoder.draft, decoder.vocab, batch, layout,
                        capture_hidden=policy.needs_hidden or feed.draft_hidden)
    companion = (
        BatchRunner(decoder.companion, decoder.vocab, batch, layout) if policy.companion is not None else None
    )
    # the analysis bounds read the target in hindsight through a cache of their own, uncounted
    hindsight = BatchRunner(decoder.target, decoder.vocab, batch, layout) if policy.needs_hindsight else None
    try:
        RoundLoop(decoder.rule, decoder.sampling, decoder.eos, policy.batch_plan(), tokens, rows,
                  Runners(target, feed.wrap(draft), companion, hindsight), Emitter(on_tokens, lengths)).run()
    finally:
        draft.close()
    wall = time.perf_counter() - start
    unverified = decoder.unverified_files()
    for row in rows:
        row.stats.wall_time_s = wall
        row.stats.unverified_files = list(unverified)
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
