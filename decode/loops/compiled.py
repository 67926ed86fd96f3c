"""Fast model calls (``compile=True``): a static KV cache and compiled forwards for the short feeds of a round.

A :class:`CompiledModel` wraps one model. Its KV caches are transformers' ``StaticCache`` (fixed-size tensors
written in place): rolling back is moving the cache's length back (``crop``), and the stale states past it are
overwritten by the next feed and masked until then (the causal mask compares positions). Feeds of at most
:data:`SHORT` tokens — a drafting step, a verification of ``K + 1`` tokens, a settled bonus — go through
``torch.compile`` (inductor: C++ kernels on CPU, its matmuls the faster of its own GEMM and oneDNN's for each
shape, timed once; Triton kernels on CUDA, replayed as CUDA graphs: one launch per forward instead of one per
kernel, recorded once per feed length); longer ones (a prompt) run eager on the same
cache, so a new prompt length never compiles anything. A one-token feed has its own graph; two to :data:`SHORT`
tokens share one graph whose length is symbolic; every other size is static, so each cache length has its own graphs.
The first short feed on a cache length first runs every feed length once on the cache (and on CUDA records each as a
graph), then crops the cache back: what a decode meets later depends on what it drafts and accepts, and it should
never compile or record while a decode is timed.

Cache lengths are rounded up to :data:`BUCKET` and the caches are pooled: a frozen graph keeps the addresses of the
cache it was compiled with (transformers marks them static) and writes there whatever cache it is given, so each
length's graphs are bound to one cache, a decode takes that cache when it is free, and a second cache of the same
length (two decodes of one model at once) runs eager. Frozen graphs are not taken from inductor's disk cache: each
process compiles its graphs once (:class:`CompileLog` counts them and their seconds).

:func:`compiled_models` makes them, or returns ``None`` with one line where a model cannot be compiled here
(no C++ compiler, a cache layer that is not a full-attention static layer); decoding then runs eager. A compilation
that fails all the same (say, no Python headers for inductor's C++) leaves that model eager, after one line.
"""

from __future__ import annotations

import shutil
import time
import warnings
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

import torch
import torch._dynamo.exc
import torch._inductor.config
import torch._inductor.exc
from torch import Tensor
from transformers import PreTrainedModel, StaticCache
from transformers.cache_utils import StaticLayer

from decode.cache_api import cache_kwargs, drop_last
from decode.loops.prompt_input import ROUND_SLACK

BUCKET = 256  # cache lengths are multiples of this
SHORT = 16  # the longest feed that runs compiled
# freezing: the weights are constants of the graph (prepacked for the matmuls)
INDUCTOR = {"freezing": True}
# on CPU, cpp_wrapper: the code that calls the kernels is C++ too (no Python between a step's few hundred kernels);
# each matmul shape is timed once between inductor's own C++ GEMM (micro-kernels for the CPU's AMX, AVX-512 or AVX2)
# and oneDNN's, and the faster kept, so no CPU gets slower than oneDNN; quietly
CPU_OPTIONS = {"cpp_wrapper": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
               "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
# on CUDA, a forward's kernels replay as one CUDA graph (cudagraph trees, as ``mode="reduce-overhead"``); a graph is
# recorded per feed length by design, so the warning about many lengths is off
CUDA_OPTIONS = {"triton.cudagraphs": True, "triton.cudagraph_dynamic_shape_warn_limit": None}
# calls of a new feed length before it replays: on CUDA cudagraph trees warm a length up, then record it
PREPARE_CALLS = {"cuda": 3}
Signature = tuple[tuple[str, str], ...]
RECOMPILE_LIMIT = 64  # graphs per forward code object (two per model, a few models, their caches' buckets)
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


class HiddenSlot:
    """A forward hook on the output layer keeping its input of the latest forward (``hidden``). A copied model
    (``copy.deepcopy``) gets an empty slot of its own."""

    def __init__(self) -> None:
        self.hidden: Tensor | None = None

    def __call__(self, module: torch.nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
        self.hidden = args[0]

    def __deepcopy__(self, memo: dict) -> HiddenSlot:
        return HiddenSlot()


class CompiledModel:
    """One model's fast forwards: pooled static caches and a compiled forward (see the module docstring).

    ``hidden`` is the output layer's input of the latest forward (a hook installed once, before compiling, so
    capturing never recompiles).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.log = CompileLog()
        self.failed = False  # a compilation failed: every later call runs eager
        self._slot = HiddenSlot()
        self._free: dict[int, list[StaticCache]] = {}
        # the cache each length's graphs were compiled with: frozen graphs keep writing to it whatever cache they
        # are given, so a second cache of that length (two decodes at once) runs eager
        self._bound: dict[int, StaticCache] = {}
        # graphs built, by (feed length class, cache length, the call's other arguments): a call with other arguments
        # (the target's hidden states for a feature draft's tape) is a graph of its own
        self._built: set[tuple[int, int, Signature]] = set()
        self._prepared: set[tuple[int, Signature]] = set()  # every feed length has run (:meth:`_prepare`)
        model.get_output_embeddings().register_forward_hook(self._slot)
        # every model class shares its forward's code object, so its graphs for all models count towards one limit
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        # dynamic=False: no automatic dynamic shapes, so each cache length keeps graphs of its own (a graph made
        # dynamic in the cache's length would write every length's tokens to the one cache it was frozen with);
        # only the lengths marked dynamic (a feed of two tokens or more, :func:`fed`) are symbolic
        self._compiled = torch.compile(model, dynamic=False)
        self._options = inductor_options(model.device)
        self._graphs = bool(self._options.get("triton.cudagraphs"))  # outputs live in the graphs' memory pool

    @property
    def hidden(self) -> Tensor | None:
        """The output layer's input ``[B, n, H]`` in the latest forward."""
        return self._slot.hidden

    def acquire(self, length: int) -> StaticCache:
        """A cache for ``length`` tokens (rounded up to :data:`BUCKET`), emptied; give it back with :meth:`release`."""
        size = cache_length(length)
        free = self._free.setdefault(size, [])
        if free:
            bound = self._bound.get(size)
            cache = free.pop(next((i for i, c in enumerate(free) if c is bound), -1))
            for layer in cache.layers:
                if layer.is_initialized:
                    layer.cumulative_length.zero_()
            return cache
        return StaticCache(config=self.model.config, max_cache_len=size)

    def release(self, cache: StaticCache) -> None:
        """Return ``cache`` to the pool."""
        self._free.setdefault(cache.get_max_length(), []).append(cache)

    def __call__(self, input_ids: Tensor, cache: StaticCache, keep: int, **extra: object):
        """The model's output for ``input_ids [B, n]`` after the cache's tokens: logits of at least the last
        ``keep`` positions (every position's where compiled: one graph whatever ``keep``)."""
        n = input_ids.shape[1]
        kwargs = {**cache_kwargs(self.model, cache), **extra}
        if n > SHORT or not cache.layers[0].is_initialized or self.failed:
            # a prompt (its first feed also allocates the cache's tensors): eager
            return self._eager(input_ids, keep, kwargs)
        size = cache.get_max_length()
        if self._bound.setdefault(size, cache) is not cache:
            self.log.eager_feeds += 1  # another cache of this length holds the graphs
            return self._eager(input_ids, keep, kwargs)
        key = signature(extra)
        if (size, key) not in self._prepared:
            self._prepared.add((size, key))
            self._prepare(input_ids, cache, kwargs, extra, key)
        return self._run(input_ids, cache, keep, kwargs, extra, key)

    def _prepare(self, input_ids: Tensor, cache: StaticCache, kwargs: dict[str, object], extra: dict[str, object],
                 key: Signature) -> None:
        """Run every feed length the cache has room for, :data:`PREPARE_CALLS` times, on stand-in tokens (``input_ids``'
        first, with its features), each dropped from the cache again: its graphs compiled (and recorded) now."""
        room = cache.get_max_length() - int(cache.get_seq_length())
        for length in range(1, min(SHORT, room) + 1):
            ids = input_ids[:, :1].expand(-1, length)
            stand_in = {name: value[:, :1].expand(-1, length, *value.shape[2:]) if is_fed(value, input_ids.shape[1])
                        else value for name, value in extra.items()}
            for _ in range(PREPARE_CALLS.get(self.model.device.type, 1)):
                self._run(ids, cache, 1, {**kwargs, **stand_in}, stand_in, key)
                drop_last(cache, length)
            if self.failed:
                return

    def _run(self, input_ids: Tensor, cache: StaticCache, keep: int, kwargs: dict[str, object],
             extra: dict[str, object], key: Signature):
        """The compiled forward on ``cache`` (compiling a new shape; ``key``: ``signature(extra)``), or eager once a
        compilation has failed."""
        if self.failed:
            return self._eager(input_ids, keep, kwargs)
        n = input_ids.shape[1]
        # fresh dense tensors (the ids, a feature draft's features): no guard on where the feed sits in its buffer
        # (offset, row stride); their length is the graph's symbol from two tokens on
        input_ids = fed(input_ids, n)
        kwargs = {**kwargs, **{name: fed(value, n) for name, value in extra.items() if is_fed(value, n)}}
        shape = (min(n, 2), cache.get_max_length())
        with torch._inductor.config.patch(self._options):  # read by any call that compiles
            if (*shape, key) in self._built:
                return self._owned(self._compiled(input_ids=input_ids, **kwargs))
            start = time.perf_counter()
            try:
                with warnings.catch_warnings():  # the GEMM autotuner reads a deprecated storage API
                    warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
                    out = self._compiled(input_ids=input_ids, **kwargs)
            except COMPILE_ERRORS as error:  # raised before the graph ran: the cache is as it was
                self.failed = True
                first = (str(error).strip().splitlines() or ["no message"])[0][:160]
                warnings.warn(f"{type(self.model).__name__}: torch.compile failed here ({type(error).__name__}: "
                              f"{first}); it decodes eager", stacklevel=5)
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


def cache_length(tokens: int) -> int:
    """The length of the pooled cache that holds a buffer of ``tokens`` (a multiple of :data:`BUCKET`); each
    length compiles graphs of its own."""
    return -(-max(tokens, 1) // BUCKET) * BUCKET


def prompt_cache_length(prompt_tokens: int, max_new_tokens: int) -> int:
    """The cache length a compiled one-prompt decode of ``prompt_tokens`` uses: its token buffer's
    (:func:`decode.loops.prompt_input.token_buffer`, with :data:`ROUND_SLACK`), rounded by :func:`cache_length`."""
    return cache_length(prompt_tokens + max_new_tokens + ROUND_SLACK)


def inductor_options(device: torch.device) -> dict[str, object]:
    """Inductor's settings for a model on ``device``: :data:`INDUCTOR` with :data:`CPU_OPTIONS` or
    :data:`CUDA_OPTIONS`."""
    return {**INDUCTOR, **{"cpu": CPU_OPTIONS, "cuda": CUDA_OPTIONS}.get(device.type, {})}


def signature(extra: dict[str, object]) -> Signature:
    """What tells a call's graph apart besides its shape: its other arguments' names, and the values of those that
    are no tensors."""
    return tuple(sorted((name, "tensor" if isinstance(value, Tensor) else repr(value))
                        for name, value in extra.items()))


def is_fed(value: object, n: int) -> bool:
    """Whether a forward argument holds one entry per fed token (``[B, n, ...]``, such as a feature draft's
    features)."""
    return isinstance(value, Tensor) and value.dim() > 1 and value.shape[1] == n


def fed(tensor: Tensor, n: int) -> Tensor:
    """A contiguous copy of ``tensor [B, n, ...]``, its length marked symbolic when ``n >= 2``."""
    tensor = tensor.clone(memory_format=torch.contiguous_format)
    if n > 1:
        torch._dynamo.mark_dynamic(tensor, 1, min=2, max=SHORT)
    return tensor


def compile_refusal(model: PreTrainedModel) -> str | None:
    """Why ``model`` cannot run compiled here (one line), or None."""
    name = type(model).__name__
    if model.device.type == "cpu" and shutil.which("c++") is None and shutil.which("g++") is None:
        return f"{name}: no C++ compiler (c++ or g++) on PATH for torch.compile; decoding runs eager"
    probe = StaticCache(config=model.config, max_cache_len=BUCKET)
    if any(type(layer) is not StaticLayer for layer in probe.layers):
        layers = sorted({type(layer).__name__ for layer in probe.layers})
        return f"{name}: compiled decoding takes full-attention layers only, got {', '.join(layers)}; decoding runs eager"
    return None


_COMPILED: WeakKeyDictionary[PreTrainedModel, CompiledModel] = WeakKeyDictionary()


def compile_log(model: PreTrainedModel) -> CompileLog | None:
    """What compiling ``model`` has cost this process so far (None: it has no compiled forwards here)."""
    compiled = _COMPILED.get(model)
    return None if compiled is None else compiled.log


def compiled_models(models: list[PreTrainedModel]) -> list[CompiledModel] | None:
    """The :class:`CompiledModel` of each model (one per model and process: its graphs, caches and hook are shared
    by every decoder of the model), or None (and one warning line) if any of them cannot be compiled here."""
    for model in models:
        refusal = compile_refusal(model) if model not in _COMPILED else None
        if refusal is not None:
            warnings.warn(refusal, stacklevel=3)
            return None
    for model in models:
        if model not in _COMPILED:
            _COMPILED[model] = CompiledModel(model)
    return [_COMPILED[model] for model in models]
