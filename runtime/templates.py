"""Prompt templates: how a ``Prompt`` becomes the text a model is given."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from runtime.prompt import Prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TEMPLATES: tuple[str, ...] = ("raw", "alpaca", "chat")

# Stanford Alpaca's training prompts (tatsu-lab/stanford_alpaca, train.py).
ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:"
)


def render(prompt: Prompt, tokenizer: PreTrainedTokenizerBase | None, template: str,
           instruction: str | None = None) -> str:
    """The model input for ``prompt``.

    ``instruction`` (a format string with a ``{message}`` field) first wraps the message, e.g. a
    code stub in "Complete the following Python function" and a code fence. ``raw``: the message as
    is (text, then context after a blank line); ``alpaca``: the Alpaca instruction template;
    ``chat``: the tokenizer's chat template with one user turn and the generation prompt. A
    chat-rendered string already holds the template's special tokens, so encode it with
    ``add_special_tokens=False``.
    """
    if instruction is not None:
        prompt = replace(prompt, text=instruction.replace("{message}", prompt.message), context="")
    if template == "raw":
        return prompt.message
    if template == "alpaca":
        if prompt.context:
            return ALPACA_WITH_INPUT.format(instruction=prompt.text, input=prompt.context)
        return ALPACA_NO_INPUT.format(instruction=prompt.text)
    if template == "chat":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", None) or "None"
            raise ValueError(
                f"tokenizer {name!r} has no chat template, which template 'chat' needs; "
                "use template 'raw' or 'alpaca', or a chat/instruct model's tokenizer"
            )
        messages = [{"role": "user", "content": prompt.message}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    raise ValueError(f"unknown template {template!r}; choose one of {', '.join(TEMPLATES)}")
