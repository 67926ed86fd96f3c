"""How a model's forward takes its KV cache, decided once per model class: the one place that knows.

transformers is renaming the forward's ``past_key_values`` argument to ``cache`` (5.x deprecates the old
name, to be removed in 5.40). :func:`cache_kwargs` names the cache with whichever keyword the model's
``forward`` declares, so the same code runs on transformers versions before and after the rename
without a deprecation warning. :func:`drop_last` is the one call that crops a cache: with a negative
count (tokens to drop), which every supported version reads the same way; before 5.15 a positive
count was a length to keep, from 5.15 it is refused.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

from torch import nn


@cache
def cache_keyword(model_class: type[nn.Module]) -> str:
    """``cache`` if ``model_class.forward`` takes it, else ``past_key_values``.

    A forward that passes its keyword arguments on (``**kwargs``, e.g. :class:`decode.drafts.feature_model`'s) names
    neither: the first class up the MRO whose forward names one decides.
    """
    for cls in model_class.__mro__:
        forward = cls.__dict__.get("forward")
        if forward is None:
            continue
        parameters = inspect.signature(forward).parameters
        if "cache" in parameters:
            return "cache"
        if "past_key_values" in parameters:
            return "past_key_values"
    return "past_key_values"


def cache_kwargs(model: nn.Module, kv_cache: Any) -> dict[str, Any]:
    """The forward keyword arguments that hand ``kv_cache`` to ``model`` (with ``use_cache=True``)."""
    return {cache_keyword(type(model)): kv_cache, "use_cache": True}


def drop_last(kv_cache: Any, tokens: int) -> None:
    """Drop the last ``tokens`` positions of every layer of ``kv_cache`` (``crop(-tokens)``).

    ``tokens == 0`` drops nothing; sliding-window layers that record their past (``activate_past_recording``)
    are trimmed back to their window, as ``crop(0)`` documents.
    """
    if tokens < 0:
        raise ValueError(f"drop_last drops a non-negative number of tokens, got {tokens}")
    kv_cache.crop(-tokens)
