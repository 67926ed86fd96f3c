"""Prompts → token ids under a template and a context budget (skip or left-truncate long ones)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from runtime.prompt import Prompt
from runtime.templates import render


@dataclass(frozen=True)
class EncodedPrompt:
    prompt_id: str
    token_ids: list[int]


def encode_prompts(
    prompts: list[Prompt],
    tokenizer: PreTrainedTokenizerBase,
    template: str,
    budget: int,
    truncation: str,
    instruction: str | None = None,
) -> tuple[list[EncodedPrompt], dict[str, int]]:
    """Encode ``prompts``; returns the kept ones and counts of those skipped, by reason.

    ``instruction`` wraps each message first (:func:`runtime.templates.render`). Prompts longer than ``budget`` tokens are skipped (``truncation="skip"``) or keep their last
    ``budget`` tokens (``"left"``: the end of a prompt is what the response continues). Prompts
    that encode to nothing are always skipped.
    """
    kept: list[EncodedPrompt] = []
    skipped: Counter[str] = Counter()
    for prompt in prompts:
        text = render(prompt, tokenizer, template, instruction)
        ids = tokenizer(text, add_special_tokens=template != "chat", verbose=False)["input_ids"]
        if not ids:
            skipped["empty"] += 1
            continue
        if len(ids) > budget:
            if truncation == "skip":
                skipped["too_long"] += 1
                continue
            ids = ids[-budget:]
        kept.append(EncodedPrompt(prompt.id, list(ids)))
    return kept, dict(skipped)
