"""Batched decoding's shared pieces: seeded prompts of several lengths, a decoder over a model dict, the target's own
greedy output, a row's stats as a comparable tuple, and rows that sample the exact-distribution prompt in a batch."""

from __future__ import annotations

import torch

from decode import SpeculativeDecoder, policies, rules
from tests.helpers.exact_distribution import LENGTH, PROMPT


def wide_prompts(vocab: int) -> list[torch.Tensor]:
    """Seven 1-D prompts of lengths 1..9 (seeded)."""
    generator = torch.Generator().manual_seed(7)
    lengths = [3, 1, 9, 4, 6, 2, 5]
    return [torch.randint(0, vocab, (n,), generator=generator) for n in lengths]


def make_decoder(models: dict, rule: rules.Rule, policy: policies.Policy, **kwargs) -> SpeculativeDecoder:
    """A decoder over ``models`` (the companion only where ``policy`` reads it; no EOS unless given)."""
    companion = models["companion"] if policy.companion is not None else None
    kwargs.setdefault("eos_token_id", None)
    return SpeculativeDecoder(models["target"], models["draft"], rule=rule, policy=policy, companion=companion, **kwargs)


def target_greedy(models: dict, prompt: torch.Tensor, budget: int, eos: int | None) -> torch.Tensor:
    """The target's own greedy continuation (HF ``generate``), 1-D with the prompt."""
    if budget == 0:
        return prompt
    extra = {"eos_token_id": eos, "pad_token_id": 0} if eos is not None else {"min_new_tokens": budget}
    out = models["target"].generate(prompt[None], max_new_tokens=budget, do_sample=False, **extra)
    return out[0]


def comparable(stats) -> tuple:
    """A row's counted stats (wall times left out), to compare two decodes of it."""
    return (stats.generated, stats.target_calls, stats.draft_calls, stats.companion_calls, stats.drafted,
            stats.accepted, stats.rejected, stats.unverified, stats.target_emitted, stats.accepted_per_round,
            stats.verified_per_round)


#: The test prompt in four rows, beside rows of other lengths and budgets (they finish first / last).
BATCH_PROMPTS = [PROMPT[0], torch.tensor([3]), PROMPT[0], torch.tensor([2, 0, 1, 3, 2]), PROMPT[0], PROMPT[0]]
BATCH_BUDGETS = [LENGTH, 1, LENGTH, 5, LENGTH, LENGTH]
SAMPLE_ROWS = [i for i, p in enumerate(BATCH_PROMPTS) if torch.equal(p, PROMPT[0])]


def batched_empirical(decoder: SpeculativeDecoder, n: int) -> torch.Tensor:
    """Frequencies of the V**LENGTH continuations of PROMPT over ``n`` rows (each its own seed)."""
    vocab = decoder.vocab
    counts = torch.zeros(vocab**LENGTH, dtype=torch.float64)
    weights = torch.tensor([vocab ** (LENGTH - 1 - j) for j in range(LENGTH)])
    for seed in range(n // len(SAMPLE_ROWS)):
        out = decoder.generate(BATCH_PROMPTS, max_new_tokens=BATCH_BUDGETS, seed=seed, layout="holes")
        for i in SAMPLE_ROWS:
            counts[int((out.sequences[i][PROMPT.shape[1]:] * weights).sum())] += 1
    return counts / counts.sum()
