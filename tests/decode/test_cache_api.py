"""The cache keyword is decided once per model class, from the forward it declares."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch import nn
from transformers import DynamicCache, LlamaForCausalLM

from decode.cache_api import cache_keyword, cache_kwargs, drop_last


class OldStyle(nn.Module):
    """A model whose forward predates the rename."""

    def forward(self, input_ids=None, past_key_values=None, use_cache=None):
        return past_key_values


def test_the_keyword_is_the_one_the_forward_declares():
    declared = inspect.signature(LlamaForCausalLM.forward).parameters
    assert cache_keyword(LlamaForCausalLM) == ("cache" if "cache" in declared else "past_key_values")
    assert cache_keyword(OldStyle) == "past_key_values"
    marker = object()
    assert OldStyle()(**cache_kwargs(OldStyle(), marker)) is marker


def test_a_cached_forward_warns_of_no_deprecation(make_lm):
    model = make_lm(64, seed=0)
    cache = DynamicCache(config=model.config)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        model(input_ids=torch.tensor([[1, 2, 3]]), **cache_kwargs(model, cache))
        model(input_ids=torch.tensor([[4]]), **cache_kwargs(model, cache))
    assert cache.get_seq_length() == 4
    if cache_keyword(type(model)) == "cache":  # negative control: the old keyword warns on this transformers
        with pytest.warns(FutureWarning, match="past_key_values"):
            model(input_ids=torch.tensor([[5]]), past_key_values=cache, use_cache=True)


def test_drop_last_drops_that_many_tokens_and_zero_keeps_a_full_cache(make_lm):
    model = make_lm(64, seed=0)
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]), **cache_kwargs(model, cache))
    drop_last(cache, 0)
    assert cache.get_seq_length() == 5  # crop(0) read as a length to keep (before 5.15) would have emptied it
    drop_last(cache, 2)
    assert cache.get_seq_length() == 3
    with pytest.raises(ValueError, match="non-negative"):
        drop_last(cache, -1)
