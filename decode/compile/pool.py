"""The static KV caches of one compiled model, pooled by length: :class:`CachePool`.

A frozen graph writes to the cache it was compiled with, whatever cache it is given, so each length's graphs are bound
to one cache; and it writes the hidden states to the slot it was traced with. Dynamo keeps a model's graphs for the
life of the process, so what they are bound to does too (:func:`binding`): a model whose compiled forwards were closed
and opened again gets the same slot and the same caches (docs/design.md, "Compiled forwards: the rules").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

import torch
from torch import Tensor
from transformers import PretrainedConfig, PreTrainedModel, StaticCache

from decode.compile.config import CompileConfig


class HiddenSlot:
    """The forward hook on the output layer keeping its input of the latest forward (``hidden``), and the open
    :class:`~decode.compile.model.CompiledModel` that installed it (``owner``, None once closed). A copied model
    (``copy.deepcopy``) gets an empty slot of its own, owned by nothing."""

    def __init__(self) -> None:
        self.hidden: Tensor | None = None
        self.owner: object | None = None

    def __call__(self, module: torch.nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
        self.hidden = args[0]

    def __deepcopy__(self, memo: dict) -> HiddenSlot:
        return HiddenSlot()


@dataclass
class Binding:
    """What one model's graphs were traced with: its hidden-state slot and, by cache length, the cache they write to."""

    slot: HiddenSlot = field(default_factory=HiddenSlot)
    bound: dict[int, StaticCache] = field(default_factory=dict)


# the process's graph bindings by model: as long-lived as dynamo's graphs of the model, whatever owner is open
_BINDINGS: WeakKeyDictionary[PreTrainedModel, Binding] = WeakKeyDictionary()


def binding(model: PreTrainedModel) -> Binding:
    """``model``'s :class:`Binding`, made at its first compiled forwards in this process."""
    return _BINDINGS.setdefault(model, Binding())


class CachePool:
    """Free static caches by length, and the cache each length's graphs are bound to."""

    def __init__(self, model_config: PretrainedConfig, config: CompileConfig, bound: dict[int, StaticCache]) -> None:
        self.model_config = model_config
        self.config = config
        self._bound = bound  # a Binding's: shared with the model's earlier pools, free again
        self._free: dict[int, list[StaticCache]] = {size: [cache] for size, cache in bound.items()}

    def acquire(self, length: int) -> StaticCache:
        """A cache for ``length`` tokens (rounded up by :meth:`CompileConfig.cache_length`), emptied; the bound one
        of its length when free. Give it back with :meth:`release`."""
        size = self.config.cache_length(length)
        free = self._free.setdefault(size, [])
        if free:
            bound = self._bound.get(size)
            cache = free.pop(next((i for i, c in enumerate(free) if c is bound), -1))
            for layer in cache.layers:
                if layer.is_initialized:
                    layer.cumulative_length.zero_()
            return cache
        return StaticCache(config=self.model_config, max_cache_len=size)

    def release(self, cache: StaticCache) -> None:
        """Return ``cache`` to the pool."""
        self._free.setdefault(cache.get_max_length(), []).append(cache)

    def holds_graphs(self, cache: StaticCache) -> bool:
        """Whether ``cache`` is the one its length's graphs are bound to (the first of its length to ask)."""
        return self._bound.setdefault(cache.get_max_length(), cache) is cache

    def clear(self) -> None:
        """Drop every free cache but the bound ones (the model's graphs keep writing to those)."""
        self._free.clear()
