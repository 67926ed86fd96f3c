"""Turning what a user passes as prompts into token ids: one prompt's ``[1, n]`` ids with clear refusals, a
left-padded batch, a list of ids (an ``eos_token_id`` setting) and the pad id that follows from it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from decode.compile.config import DEFAULT, CompileConfig


def prompt_ids(
    prompt: Tensor | str | Sequence[int],
    tokenizer: PreTrainedTokenizerBase | None,
    device: torch.device,
    owner: str,
) -> Tensor:
    """One prompt as ``[1, n]`` ids; text needs a tokenizer; batch > 1 and empty prompts are refused."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(f"a text prompt needs a tokenizer: pass tokenizer=... to {owner}")
        prompt = tokenizer(prompt, return_tensors="pt").input_ids
    ids = torch.as_tensor(prompt, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"{owner} supports batch size 1 only; got input_ids of shape {tuple(ids.shape)}")
    if ids.shape[1] == 0:
        raise ValueError("empty prompt: input_ids must hold at least one token")
    return ids.to(device)


def check_context(length: int, max_new_tokens: int, context: int | None, owner: str) -> None:
    """Refuse, in one line, a prompt that leaves no room for ``max_new_tokens`` in the models' ``context``."""
    if context is not None and length + max_new_tokens > context:
        raise ValueError(f"{owner}: the prompt has {length} tokens and max_new_tokens={max_new_tokens}, more than the "
                         f"models' context of {context} tokens; shorten the prompt or lower max_new_tokens")


def is_batch(inputs: object, attention_mask: Tensor | None = None) -> bool:
    """Whether ``generate`` input holds several prompts: a list of prompts (texts, id lists or tensors; an empty list
    holds none), a ``[B, n]`` tensor with ``B > 1``, or any tensor with an ``attention_mask`` (a padded batch, HF
    style)."""
    if attention_mask is not None:
        return True
    if isinstance(inputs, Tensor):
        return inputs.dim() == 2 and inputs.shape[0] > 1
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
        return False
    return len(inputs) == 0 or not isinstance(inputs[0], int)


#: The positions a one-prompt decoder's token buffer keeps past ``max_new_tokens`` (the ``slack`` of
#: :func:`token_buffer`).
ROUND_SLACK = 2


def prompt_cache_length(prompt_tokens: int, max_new_tokens: int, config: CompileConfig = DEFAULT) -> int:
    """The cache length a compiled one-prompt decode of ``prompt_tokens`` uses: its token buffer's
    (:func:`token_buffer`, with :data:`ROUND_SLACK`), rounded by :meth:`CompileConfig.cache_length`."""
    return config.cache_length(prompt_tokens + max_new_tokens + ROUND_SLACK)


def token_buffer(
    prompt: Tensor | str | Sequence[int],
    tokenizer: PreTrainedTokenizerBase | None,
    device: torch.device,
    owner: str,
    max_new_tokens: int,
    slack: int = 0,
    context: int | None = None,
) -> tuple[Tensor, int]:
    """A ``[1, n + max_new_tokens + slack]`` id buffer holding the prompt (see :func:`prompt_ids`), and ``n``;
    a prompt with no room for ``max_new_tokens`` in ``context`` is refused (:func:`check_context`)."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    ids = prompt_ids(prompt, tokenizer, device, owner)
    n = ids.shape[1]
    check_context(n, max_new_tokens, context, owner)
    tokens = torch.zeros(1, n + max_new_tokens + slack, dtype=torch.long, device=device)
    tokens[:, :n] = ids
    return tokens, n


def id_list(value: int | Iterable[int] | None) -> list[int]:
    """Token ids as a list: None gives none, one id gives one (e.g. an ``eos_token_id`` setting)."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def pad_id(pad: int | None, eos: int | Iterable[int] | None) -> int:
    """The id that fills a batch's finished rows: ``pad``, else the first EOS id (as HF ``generate`` falls back), else
    0."""
    return pad if pad is not None else next(iter(id_list(eos)), 0)


def left_pad(prompts: Sequence[Sequence[int] | Tensor], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-padded ids and attention mask ``[B, longest]`` of prompts of different lengths (1-D ids each)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)
