"""A batch's one-token steps after its prompts, eager or compiled: :class:`BatchSteps` (what batched generation
feeds: the collection, the feature draft's data).

Eager, the rows share a ``DynamicCache`` that grows a column a step. Compiled, they share a ``StaticCache`` of
:attr:`CompileConfig.bucket` columns more than it holds, moved into one a bucket longer when full: a step's attention
reads at most a bucket of columns beyond those in use, and each (rows, cache length) compiles one graph, kept in the
machine's :class:`~decode.compile.store.GraphStore` for later processes. The weights and the caches are inputs of
these graphs (no freezing), so any cache of a length serves: a batch's caches are its own. The prompt runs eager on
the static cache. The rules: docs/design.md, "Compiled forwards: the rules".
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch
import torch._dynamo
import torch._inductor.config
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel, StaticCache

from decode.cache_api import cache_kwargs
from decode.compile.config import CompileConfig
from decode.compile.owner import compile_refusal
from decode.compile.store import GraphStore, graph_key

# batches compile with the weights and caches as inputs (each batch has caches of its own), over caches grown by
# 128 columns at a time
BATCHES = CompileConfig(bucket=128, inductor={"freezing": False})
# the (rows, cache length) each model's batch steps compiled in this process (dynamo keeps the graphs as long)
_BUILT: WeakKeyDictionary[PreTrainedModel, set[tuple[int, int]]] = WeakKeyDictionary()


@dataclass
class BatchCompileLog:
    """What compiling cost :class:`BatchSteps`: graphs built (or loaded from the store) and their seconds."""

    graphs: int = 0
    seconds: float = 0.0


class BatchSteps:
    """The rows' forwards: :meth:`prefill` on the left-padded prompts, then :meth:`step` one token per row.

    ``compiled`` asks for compiled steps; where the model cannot compile here (no C++ compiler on a CPU, a layer other
    than full attention: :func:`~decode.compile.owner.compile_refusal`) they run eager after one warning line. The
    logits returned are the last position's ``[B, V]`` either way.
    """

    def __init__(self, model: PreTrainedModel, compiled: bool, config: CompileConfig = BATCHES,
                 store: GraphStore | None = None) -> None:
        refusal = compile_refusal(model, config) if compiled else None
        if refusal is not None:
            warnings.warn(refusal, stacklevel=2)
        self.model, self.compiled, self.config = model, compiled and refusal is None, config
        self.store = GraphStore() if store is None and self.compiled else store
        self.log = BatchCompileLog()
        self._options = config.inductor_options(model.device)
        self._forward = torch.compile(model, dynamic=False) if self.compiled else None
        self._cache: DynamicCache | StaticCache | None = None
        self._mask: Tensor | None = None  # [B, columns]: the prompts' mask, then ones

    def prefill(self, ids: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
        """The last position's logits ``[B, V]`` after ``ids [B, W]`` (left-padded, ``mask [B, W]``), eager."""
        width = ids.shape[1]
        if self.compiled:
            self._cache = StaticCache(config=self.model.config, max_cache_len=self.config.cache_length(width + 1))
            self._mask = self._padded_mask(mask, self._cache.get_max_length())
        else:
            self._cache, self._mask = DynamicCache(config=self.model.config), mask
        out = self.model(input_ids=ids, attention_mask=self._mask, position_ids=positions,
                         **cache_kwargs(self.model, self._cache), logits_to_keep=1)
        return out.logits[:, -1]

    def step(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """The logits ``[B, V]`` after one more token a row (``tokens [B]`` at ``positions [B, 1]``)."""
        if self._cache is None or self._mask is None:
            raise RuntimeError("BatchSteps.step before prefill")
        if not self.compiled:
            self._mask = torch.cat([self._mask, torch.ones_like(self._mask[:, :1])], dim=1)
            out = self.model(input_ids=tokens[:, None], attention_mask=self._mask, position_ids=positions,
                             **cache_kwargs(self.model, self._cache))
            return out.logits[:, -1]
        held = int(self._cache.get_seq_length())
        if held + 1 > self._cache.get_max_length():
            self._grow(held + 1)
        return self._compiled_step(tokens[:, None].contiguous(), positions.contiguous())

    def _compiled_step(self, tokens: Tensor, positions: Tensor) -> Tensor:
        rows, length = tokens.shape[0], self._cache.get_max_length()
        built = _BUILT.setdefault(self.model, set())
        kwargs = {"input_ids": tokens, "attention_mask": self._mask, "position_ids": positions,
                  **cache_kwargs(self.model, self._cache)}
        limit = max(torch._dynamo.config.recompile_limit, self.config.recompile_limit)
        with torch._inductor.config.patch(self._options), torch._dynamo.config.patch(recompile_limit=limit):
            if (rows, length) in built:
                return self._forward(**kwargs).logits[:, -1]
            key = graph_key(self.model, length, self._options, rows=rows)
            start = time.perf_counter()
            with self.store.building(key):
                out = self._forward(**kwargs)
            self.store.commit(key)
        built.add((rows, length))
        self.log.graphs += 1
        self.log.seconds += time.perf_counter() - start
        return out.logits[:, -1]

    def _grow(self, tokens: int) -> None:
        """Move the cache's states into a static cache a bucket longer (or more, to hold ``tokens``)."""
        old = self._cache
        new = StaticCache(config=self.model.config, max_cache_len=self.config.cache_length(tokens))
        for before, after in zip(old.layers, new.layers, strict=True):
            after.lazy_initialization(before.keys, before.values)
            after.keys[:, :, : before.max_cache_len].copy_(before.keys)
            after.values[:, :, : before.max_cache_len].copy_(before.values)
            after.cumulative_length.copy_(before.cumulative_length)
        self._cache = new
        self._mask = self._padded_mask(self._mask, new.get_max_length())

    @staticmethod
    def _padded_mask(mask: Tensor, columns: int) -> Tensor:
        """``mask [B, W]`` followed by ones up to ``columns`` (later columns are masked by position until written)."""
        return torch.cat([mask, torch.ones_like(mask[:, :1]).expand(-1, columns - mask.shape[1])], dim=1)
