"""How a model's forward takes its KV cache, decided once per model class: the one place that knows.

transformers is renaming the forward's ``past_key_values`` argument to ``cache`` (5.x deprecates the old
name, to be removed in 5.40). :func:`cache_kwargs` names the cache with whichever keyword the model's
``forward`` declares, so the same code runs on transformers versions before and after the rename
without a deprecation warning. Cropping a cache is done with negative counts only (tokens to drop),
the one meaning ``DynamicCache.crop`` has had in every 5.x version.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

from torch import nn


@cache
def cache_keyword(model_class: type[nn.Module]) -> str:
    """``cache`` if ``model_class.forward`` takes it, else ``past_key_values``."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_kwargs(model: nn.Module, kv_cache: Any) -> dict[str, Any]:
    """The forward keyword arguments that hand ``kv_cache`` to ``model`` (with ``use_cache=True``)."""
    return {cache_keyword(type(model)): kv_cache, "use_cache": True}
