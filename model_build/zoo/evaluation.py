"""Held-out loss of the zoo's models, and the prompt sets its realism is measured on."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from data_gen.prompts import load_prompts
from data_gen.prompts.shipped import held_out_modules
from runtime.encoding import encode_prompts

from .recipe import ZooRecipe
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
    tokenizer: PreTrainedTokenizerFast, texts: Sequence[str], count: int, length: int, seed: int
) -> torch.Tensor:
    """``count`` prompts of ``length`` tokens, each starting at a random line of a random module text."""
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    while len(prompts) < count:
        text = rng.choice(texts)
        line_starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n" and i + 1 < len(text)]
        start = rng.choice(line_starts)
        ids = tokenizer(text[start : start + 16 * length], add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= length:
            prompts.append(ids[:length])
    return torch.tensor(prompts, dtype=torch.long)


#: The evaluation's prompt styles (``conf/prompts/builtin.yaml``): its dev prompts and its OOD set.
EVALUATION_SETS: tuple[tuple[str, str, str], ...] = (
    ("function (dev)", "dev", "function"),
    ("module (test, OOD)", "test", "module"),
)


def builtin_prompt_ids(tokenizer: PreTrainedTokenizerFast, split: str, style: str, count: int, budget: int,
                       seed: int) -> list[list[int]]:
    """The first ``count`` builtin prompts of ``split`` / ``style`` that fit ``budget`` tokens, as the evaluation
    picks them (seeded shuffle, raw template, longer ones skipped)."""
    prompts = load_prompts("builtin", split, style=style, seed=seed)
    encoded, _ = encode_prompts(prompts, tokenizer, "raw", budget, "skip")
    return [p.token_ids for p in encoded[:count]]


def realism_prompt_sets(tokenizer: PreTrainedTokenizerFast, recipe: ZooRecipe) -> dict[str, list[list[int]]]:
    """Prompt sets of the realism figures: line starts of the shipped dev modules, then the evaluation's styles."""
    dev_texts = [text for _, text in held_out_modules()]
    sets = {"line start (dev)": line_start_prompts(tokenizer, dev_texts, recipe.realism_prompts,
                                                   recipe.line_prompt_tokens, recipe.eval_seed).tolist()}
    for name, split, style in EVALUATION_SETS:
        sets[name] = builtin_prompt_ids(tokenizer, split, style, recipe.realism_prompts, recipe.prompt_budget,
                                        recipe.prompt_seed)
    return sets
