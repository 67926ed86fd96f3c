"""One model's compiled forwards: :class:`CompiledModel` (a static KV cache, compiled short feeds, eager long ones).

A :class:`CompiledModel` wraps one model. Its KV caches are transformers' ``StaticCache`` (fixed-size tensors written
in place, pooled by :class:`~decode.compile.pool.CachePool`): rolling back is moving the cache's length back
(``crop``), and the stale states past it are overwritten by the next feed and masked until then. Feeds of at most
:attr:`CompileConfig.short` tokens go through ``torch.compile``; longer ones (a prompt) run eager on the same cache,
so a new prompt length never compiles anything; a one-token feed is padded to two, so one graph serves every feed.
The first short feed on a cache length runs every feed length once (and on CUDA records each as a graph), then crops
the cache back, so no decode compiles while it is timed. The graphs compile into the machine's
:class:`~decode.compile.store.GraphStore`, where a later process finds them.

It installs one forward hook on the model's output layer (the hidden states a policy or a feature draft reads) and
removes it in :meth:`CompiledModel.close`. The rules and the commits that found them: docs/design.md, "Compiled
forwards: the rules".
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import torch
import torch._dynamo.exc
import torch._inductor.config
import torch._inductor.exc
from torch import Tensor
from transformers import PreTrainedModel, StaticCache

from decode.cache_api import cache_kwargs, drop_last
from decode.compile.config import DEFAULT, CompileConfig
from decode.compile.pool import CachePool, binding
from decode.compile.store import GraphKey, GraphStore, graph_key

Signature = tuple[tuple[str, str], ...]
# what a compilation that cannot work here raises (no C++ toolchain or Python headers, an unsupported op)
COMPILE_ERRORS = (torch._dynamo.exc.TorchDynamoException, torch._inductor.exc.InductorError,
                  torch._inductor.exc.CppCompileError)


@dataclass
class CompileLog:
    """What compiling cost a :class:`CompiledModel`: graphs built (first calls of a new shape or with other arguments)
    and their seconds; ``eager_feeds``: short feeds that ran eager because another cache of their length holds the
    graphs."""

    graphs: int = 0
    seconds: float = 0.0
    eager_feeds: int = 0
    shapes: set[tuple[int, int]] = field(default_factory=set)  # (feed length class, cache length) compiled


class CompiledModel:
    """One model's fast forwards: pooled static caches and a compiled forward (see the module docstring).

    ``hidden`` is the output layer's input of the latest forward (a hook installed once, before compiling, so
    capturing never recompiles). ``eager_reason``: the one line a failed compilation gave (every later call runs
    eager), else None. :meth:`close` (or leaving a ``with`` block) removes the hook and drops the caches;
    :class:`~decode.compile.owner.CompiledModels` owns and closes them.
    """

    def __init__(self, model: PreTrainedModel, config: CompileConfig = DEFAULT, store: GraphStore | None = None) -> None:
        self.model = model
        self.config = config
        self.store = GraphStore() if store is None else store
        self.log = CompileLog()
        self.eager_reason: str | None = None
        self.users = 0  # owners sharing it (CompiledModels.open); the last one to leave closes it
        bound = binding(model)  # the slot and caches earlier graphs of the model were traced with
        self._slot = bound.slot
        self._slot.owner = self
        self._pool = CachePool(model.config, config, bound.bound)
        # graphs built, by (feed length class, cache length, the call's other arguments): a call with other arguments
        # (the target's hidden states for a feature draft's tape) is a graph of its own
        self._built: set[tuple[int, int, Signature]] = set()
        self._prepared: set[tuple[int, Signature]] = set()  # every feed length has run (:meth:`_prepare`)
        self._hook: torch.utils.hooks.RemovableHandle | None = (
            model.get_output_embeddings().register_forward_hook(self._slot))
        self._compiled = torch.compile(model, dynamic=config.dynamic)
        self._options = config.inductor_options(model.device)
        self._graphs = bool(self._options.get("triton.cudagraphs"))  # outputs live in the graphs' memory pool

    @property
    def failed(self) -> bool:
        """Whether a compilation failed here (every later call runs eager)."""
        return self.eager_reason is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (the hook is gone; calls are refused)."""
        return self._hook is None

    @property
    def hidden(self) -> Tensor | None:
        """The output layer's input ``[B, n, H]`` in the latest forward."""
        return self._slot.hidden

    def close(self) -> None:
        """Remove the hook from the model and drop the pooled caches but the bound ones (idempotent)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._slot.owner = None
        self._pool.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def acquire(self, length: int) -> StaticCache:
        """A cache for ``length`` tokens from the pool (:meth:`CachePool.acquire`); give it back with :meth:`release`."""
        return self._pool.acquire(length)

    def release(self, cache: StaticCache) -> None:
        """Return ``cache`` to the pool."""
        self._pool.release(cache)

    def __call__(self, input_ids: Tensor, cache: StaticCache, keep: int, **extra: object):
        """The model's output for ``input_ids [B, n]`` after the cache's tokens: logits of at least the last
        ``keep`` positions (every position's where compiled: one graph whatever ``keep``)."""
        if self.closed:
            raise RuntimeError(f"{type(self.model).__name__}: its compiled forwards were closed; open them again "
                               "(decode.compile.CompiledModels.open)")
        n = input_ids.shape[1]
        kwargs = {**cache_kwargs(self.model, cache), **extra}
        if n > self.config.short or not cache.layers[0].is_initialized or self.failed:
            # a prompt (its first feed also allocates the cache's tensors): eager
            return self._eager(input_ids, keep, kwargs)
        if not self._pool.holds_graphs(cache):
            self.log.eager_feeds += 1  # another cache of this length holds the graphs
            return self._eager(input_ids, keep, kwargs)
        key = signature(extra)
        size = cache.get_max_length()
        if (size, key) not in self._prepared:
            self._prepared.add((size, key))
            self._prepare(input_ids, cache, kwargs, extra, key)
        if n < self.config.padded:
            if int(cache.get_seq_length()) + self.config.padded > size:
                return self._eager(input_ids, keep, kwargs)  # no room for the padding: the cache's last column
            return self._padded(input_ids, cache, kwargs, extra, key)
        return self._run(input_ids, cache, keep, kwargs, extra, key)

    def _padded(self, input_ids: Tensor, cache: StaticCache, kwargs: dict[str, object], extra: dict[str, object],
                key: Signature):
        """A feed shorter than ``padded``, its last token (and features) repeated up to that length; the extra
        positions dropped again from the cache, the logits and :attr:`hidden`."""
        n = input_ids.shape[1]
        grown = padded(input_ids, self.config.padded)
        stand_in = {name: padded(value, self.config.padded) if is_fed(value, n) else value
                    for name, value in extra.items()}
        out = self._run(grown, cache, self.config.padded, {**kwargs, **stand_in}, stand_in, key)
        drop_last(cache, self.config.padded - n)
        if self._slot.hidden is not None:
            self._slot.hidden = self._slot.hidden[:, :n]
        for name in ("logits", "hidden_states"):
            value = getattr(out, name, None)
            if isinstance(value, Tensor):
                setattr(out, name, value[:, :n])
            elif isinstance(value, tuple):
                setattr(out, name, tuple(layer[:, :n] for layer in value))
        return out

    def _prepare(self, input_ids: Tensor, cache: StaticCache, kwargs: dict[str, object], extra: dict[str, object],
                 key: Signature) -> None:
        """Run every feed length the cache has room for, ``prepare_calls`` times, on stand-in tokens (``input_ids``'
        first, with its features), each dropped from the cache again: its graphs compiled (and recorded) now."""
        room = cache.get_max_length() - int(cache.get_seq_length())
        try:
            for length in range(min(self.config.padded, room), min(self.config.short, room) + 1):
                ids = input_ids[:, :1].expand(-1, length)
                stand_in = {name: value[:, :1].expand(-1, length, *value.shape[2:])
                            if is_fed(value, input_ids.shape[1]) else value for name, value in extra.items()}
                for _ in range(self.config.prepare_calls.get(self.model.device.type, 1)):
                    self._run(ids, cache, 1, {**kwargs, **stand_in}, stand_in, key)
                    drop_last(cache, length)
                if self.failed:
                    return  # the failed compilation gave up the store's lock on the key (GraphStore.building)
        except BaseException:
            self.store.release(self._key(cache))  # an abandoned build: another process may take it up
            raise
        self.store.commit(self._key(cache))

    def _key(self, cache: StaticCache) -> GraphKey:
        """The store's key of this model's graphs on ``cache``'s length."""
        return graph_key(self.model, cache.get_max_length(), self._options)

    def _run(self, input_ids: Tensor, cache: StaticCache, keep: int, kwargs: dict[str, object],
             extra: dict[str, object], key: Signature):
        """The compiled forward on ``cache`` (compiling a new shape; ``key``: ``signature(extra)``), or eager once a
        compilation has failed."""
        if self.failed:
            return self._eager(input_ids, keep, kwargs)
        n = input_ids.shape[1]
        # fresh dense tensors (the ids, a feature draft's features): no guard on where the feed sits in its buffer
        # (offset, row stride); their length is the graph's symbol from two tokens on
        input_ids = fed(input_ids, n, self.config.short)
        kwargs = {**kwargs, **{name: fed(value, n, self.config.short) for name, value in extra.items()
                               if is_fed(value, n)}}
        shape = (min(n, 2), cache.get_max_length())
        # read by any call that compiles; the recompile limit only while this call runs, never process-wide
        limit = max(torch._dynamo.config.recompile_limit, self.config.recompile_limit)
        with torch._inductor.config.patch(self._options), torch._dynamo.config.patch(recompile_limit=limit):
            if (*shape, key) in self._built:
                return self._owned(self._compiled(input_ids=input_ids, **kwargs))
            start = time.perf_counter()
            try:
                with self.store.building(self._key(cache)), warnings.catch_warnings():
                    # the prepacked GEMMs' autotuner reads a deprecated storage API
                    warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
                    out = self._compiled(input_ids=input_ids, **kwargs)
            except COMPILE_ERRORS as error:  # raised before the graph ran: the cache is as it was
                self.eager_reason = (f"{type(self.model).__name__}: torch.compile failed here "
                                     f"({type(error).__name__}: {cause(error)}); it decodes eager")
                warnings.warn(self.eager_reason, stacklevel=5)
                return self._eager(input_ids, keep, kwargs)
        self._built.add((*shape, key))
        self.log.shapes.add(shape)
        self.log.graphs += 1
        self.log.seconds += time.perf_counter() - start
        return self._owned(out)

    def _owned(self, out):
        """``out`` (and :attr:`hidden`) copied out of the CUDA graphs' memory pool, which the next compiled call
        reuses; unchanged without CUDA graphs."""
        if self._graphs:
            out.logits = out.logits.clone()
            if self._slot.hidden is not None:
                self._slot.hidden = self._slot.hidden.clone()
        return out

    def _eager(self, input_ids: Tensor, keep: int, kwargs: dict[str, object]):
        return self.model(input_ids=input_ids, logits_to_keep=keep, **kwargs)


def cause(error: BaseException) -> str:
    """One line of ``error``'s message: the compiler's diagnostic (the first line with ``error:``, as ``fatal error:
    Python.h: No such file or directory`` under a C++ compile error's generic first line), else its first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or ["no message"]
    return next((line for line in lines if "error:" in line.lower()), lines[0])[:160]


def signature(extra: dict[str, object]) -> Signature:
    """What tells a call's graph apart besides its shape: its other arguments' names, and the values of those that
    are no tensors."""
    return tuple(sorted((name, "tensor" if isinstance(value, Tensor) else repr(value))
                        for name, value in extra.items()))


def is_fed(value: object, n: int) -> bool:
    """Whether a forward argument holds one entry per fed token (``[B, n, ...]``, such as a feature draft's
    features)."""
    return isinstance(value, Tensor) and value.dim() > 1 and value.shape[1] == n


def padded(tensor: Tensor, length: int) -> Tensor:
    """``tensor [B, n, ...]`` with its last entry repeated up to ``length`` entries."""
    extra = tensor[:, -1:].expand(-1, length - tensor.shape[1], *tensor.shape[2:])
    return torch.cat([tensor, extra], dim=1)


def fed(tensor: Tensor, n: int, short: int) -> Tensor:
    """A contiguous copy of ``tensor [B, n, ...]``, its length marked symbolic (2 to ``short``) when ``n >= 2``."""
    tensor = tensor.clone(memory_format=torch.contiguous_format)
    if n > 1:
        torch._dynamo.mark_dynamic(tensor, 1, min=2, max=short)
    return tensor
