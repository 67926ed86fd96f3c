"""Held-out loss of the zoo's models, dev prompts and the target's responses to them."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from data_gen.corpus import StdlibModule
from decode.rules import sample

from .training import next_token_loss


@torch.no_grad()
def held_out_loss(model: LlamaForCausalLM, windows: torch.Tensor, batch: int = 16) -> float:
    """Mean next-token cross-entropy (nats/token) over ``windows``."""
    total, count = 0.0, 0
    for chunk in windows.to(model.device).split(batch):
        positions = chunk.numel() - chunk.shape[0]
        total += next_token_loss(model(input_ids=chunk).logits, chunk).item() * positions
        count += positions
    return total / count


def line_start_prompts(
    tokenizer: PreTrainedTokenizerFast, modules: Sequence[StdlibModule], count: int, length: int, seed: int
) -> torch.Tensor:
    """``count`` prompts of ``length`` tokens, each starting at a random line of a random module."""
    rng = random.Random(seed)
    texts = [m.read() for m in modules]
    prompts: list[list[int]] = []
    while len(prompts) < count:
        text = rng.choice(texts)
        line_starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n" and i + 1 < len(text)]
        start = rng.choice(line_starts)
        ids = tokenizer(text[start : start + 16 * length], add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= length:
            prompts.append(ids[:length])
    return torch.tensor(prompts, dtype=torch.long)


@torch.no_grad()
def target_responses(
    model: LlamaForCausalLM, prompts: torch.Tensor, new_tokens: int, seed: int, eos_token_id: int, greedy: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``new_tokens`` after each prompt, sampled at temperature 1 or greedy (KV cache, no top-k/top-p).

    Returns the full sequences and a mask of the response positions that count: those up to
    and including the first EOS.
    """
    prompts = prompts.to(model.device)
    generator = torch.Generator(device=model.device).manual_seed(seed)
    out = model(input_ids=prompts, use_cache=True)
    sampled = []
    for _ in tqdm(range(new_tokens), desc=f"zoo: {'greedy' if greedy else 'sampled'} responses", unit="tok", leave=False):
        logits = out.logits[:, -1].float()
        token = (logits.argmax(dim=-1) if greedy else sample(F.softmax(logits, dim=-1), generator))[:, None]
        sampled.append(token)
        out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
    response = torch.cat(sampled, dim=1)
    is_eos = (response == eos_token_id).long()
    mask = (is_eos.cumsum(dim=1) - is_eos) == 0
    return torch.cat([prompts, response], dim=1), mask
