"""Token streams and training windows built from module texts."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerFast


def token_stream(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str]) -> torch.Tensor:
    """All module texts as one 1-D id tensor: ``<|bos|> module <|eos|>`` back to back."""
    encoded = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
    ids: list[int] = []
    for module_ids in encoded:
        ids.append(tokenizer.bos_token_id)
        ids.extend(module_ids)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def random_windows(stream: torch.Tensor, batch: int, context: int, generator: torch.Generator) -> torch.Tensor:
    """``batch`` windows of ``context`` tokens at random offsets of ``stream``."""
    starts = torch.randint(0, len(stream) - context + 1, (batch,), generator=generator)
    return torch.stack([stream[s : s + context] for s in starts.tolist()])


def spaced_windows(stream: torch.Tensor, count: int, context: int) -> torch.Tensor:
    """Up to ``count`` non-overlapping windows of ``context`` tokens, evenly spread over ``stream``."""
    available = len(stream) // context
    if available == 0:
        raise ValueError(f"stream of {len(stream)} tokens is shorter than one window of {context}")
    picks = torch.linspace(0, available - 1, min(count, available)).round().long().unique()
    return torch.stack([stream[i * context : (i + 1) * context] for i in picks.tolist()])
