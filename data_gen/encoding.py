"""Prompts → token ids under a template and a context budget (skip or left-truncate long ones)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from ahconf.schema import ConfigError, PromptsConfig
from data_gen.prompts import Prompt, load_prompts, render


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

    ``instruction`` wraps each message first (:func:`data_gen.prompts.render`). Prompts longer than ``budget`` tokens are skipped (``truncation="skip"``) or keep their last
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


def split_prompts(
    config: PromptsConfig, split: str, *, seed: int, tokenizer: PreTrainedTokenizerBase, context: int,
    max_new_tokens: int,
) -> tuple[list[EncodedPrompt], dict[str, int]]:
    """The run's prompts of ``split``, encoded with room for ``max_new_tokens`` in a ``context``-token window.

    What the collection generates from and what :mod:`data_gen.regenerate` sends to a server: the same
    prompts, template, budget and truncation, so both produce responses to the same token ids.
    """
    prompts = load_prompts(
        config.source,
        split,
        size=config.sizes.get(split),
        style=config.style,
        seed=seed,
        revision=config.revision,
        text_field=config.text_field,
        sizes=None if config.source == "builtin" else dict(config.sizes),
    )
    budget = min(config.max_prompt_tokens, context - max_new_tokens)
    if budget < 1:
        raise ConfigError(
            f"collect.max_new_tokens={max_new_tokens} leaves no room for a prompt in the models' context of {context} "
            "tokens; lower it"
        )
    return encode_prompts(prompts, tokenizer, config.template, budget, config.truncation, config.instruction)
