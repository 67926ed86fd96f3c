"""A run's prompts of one split, encoded: the prompt set its config names, under its template and budget."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from ahconf.schema import ConfigError, PromptsConfig
from data_gen.prompts.load import load_prompts
from runtime.encoding import EncodedPrompt, encode_prompts


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
