"""Wall seconds on the device a model runs on: a synced stopwatch and the one forward-latency timer (DESIGN §5).

:class:`Stopwatch` times a block between two device syncs, so queued CUDA work counts for the block that
queued it. :func:`median_seconds` is the statistic of every measured latency: the median over ``repeats``
calls after one untimed warm-up call, the calls of several runs taking turns (drift on a shared machine hits
them alike). A cost table predicts what decoding pays, a typical forward: the median is moved neither by a
call another process interrupted nor by a lucky one, where the minimum keeps the luckiest.
:func:`forward_seconds` times a model's forward of new tokens on a cached context with it: the SV profile's
latency table, the evaluation's cost fit and the batch costs all measure with it; :func:`eager_forward` is the
:data:`ForwardFactory` the tables of several models measure with by default, taking turns. :func:`machine_class` names
where a time was measured.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from decode.cache_api import cache_kwargs, drop_last
from decode.drafts import drafter_of

Key = TypeVar("Key", bound=Hashable)


def device_name() -> str:
    """The accelerator's name, else the CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_class(device: torch.device) -> str:
    """What a time measured on ``device`` depends on of the machine, in words: a GPU's name, or the CPU's name, the
    SIMD path torch computes with and its thread count (``AMD EPYC, AVX512, 2 threads``)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return (f"{device_name()}, {torch.backends.cpu.get_cpu_capability()}, "
            f"{threads} thread{'' if threads == 1 else 's'}")


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA); a CPU has none."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Wall seconds of a ``with`` block, the device's queued work included: ``with Stopwatch(device) as w: ...``,
    then ``w.seconds``."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds = torch.device(device), 0.0

    def __enter__(self) -> Stopwatch:
        synchronize(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self._start


def medians_taking_turns(runs: Mapping[Key, Callable[[], object]], repeats: int,
                         device: torch.device) -> dict[Key, float]:
    """Median seconds of each of ``runs`` over ``repeats`` rounds, after one untimed warm-up round; within a round
    the runs take turns."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times: dict[Key, list[float]] = {key: [] for key in runs}
    for round_ in range(repeats + 1):
        for key, run in runs.items():
            with Stopwatch(device) as watch:
                run()
            if round_:  # round 0 warms up: first-call allocations, lazy initialisation
                times[key].append(watch.seconds)
    return {key: statistics.median(values) for key, values in times.items()}


def median_seconds(run: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median seconds of ``run()`` over ``repeats`` calls after one untimed warm-up call."""
    return medians_taking_turns({"run": run}, repeats, device)["run"]


def random_ids(model: PreTrainedModel, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """Random token ids of ``model``'s vocabulary on its device: what a timed forward feeds."""
    vocab = model.config.get_text_config().vocab_size
    return torch.randint(vocab, shape, generator=generator).to(model.device)


class CachedForward:
    """``model`` with a KV cache holding ``context`` (``[B, C]`` ids); a call feeds ``tokens`` (``[B, w]``) and cuts
    the cache back to the context (sliding-window layers record their past, so that they can be cut back)."""

    def __init__(self, model: PreTrainedModel, context: Tensor) -> None:
        self.model, self.kind = model, drafter_of(model)
        self.cache = DynamicCache(config=model.config)
        self.cache.activate_past_recording()
        model(**self.kind.forward_inputs(model, context.to(model.device)), **cache_kwargs(model, self.cache),
              logits_to_keep=1)

    def __call__(self, tokens: Tensor) -> None:
        self.model(**self.kind.forward_inputs(self.model, tokens), **cache_kwargs(self.model, self.cache))
        drop_last(self.cache, tokens.shape[1])


#: How timed forwards are made: ``(model, context [B, C] ids)`` → a context manager holding a call that feeds
#: ``tokens [B, w]`` after the cached context and cuts the cache back (:func:`eager_forward`,
#: :func:`decode.loops.step_costs.compiled_forward`).
ForwardFactory = Callable[[PreTrainedModel, Tensor], AbstractContextManager[Callable[[Tensor], None]]]


def eager_forward(model: PreTrainedModel, context: Tensor) -> AbstractContextManager[Callable[[Tensor], None]]:
    """The :data:`ForwardFactory` of eager forwards: a :class:`CachedForward` (nothing to give back)."""
    return nullcontext(CachedForward(model, context))


@torch.inference_mode()
def forward_seconds(model: PreTrainedModel, context: Tensor, widths: Sequence[int], repeats: int,
                    seed: int = 0) -> list[float]:
    """Median seconds (:func:`median_seconds`) of a forward feeding each of ``widths`` random tokens to every row of
    ``context`` (``[B, C]`` ids) on its KV cache (:class:`CachedForward`)."""
    forward = CachedForward(model, context)
    generator = torch.Generator().manual_seed(seed)
    seconds = []
    for width in widths:
        tokens = random_ids(model, (context.shape[0], width), generator)
        seconds.append(median_seconds(partial(forward, tokens), repeats, model.device))
    return seconds
