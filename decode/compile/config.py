"""The settings of compiled forwards (``compile=True``), one frozen record: :class:`CompileConfig`.

Why each value is what it is: docs/design.md, "Compiled forwards: the rules".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def _cpu_options() -> dict[str, object]:
    # cpp_wrapper: the code that calls the kernels is C++ too (no Python between a step's few hundred kernels); the
    # frozen weights stay plain tensors (no oneDNN prepacking), so the graphs go to inductor's disk cache and a second
    # process loads them: compiled once per machine (:mod:`decode.compile.store`)
    return {"cpp_wrapper": True, "cpp.weight_prepack": False}


def _prepacked_cpu_options() -> dict[str, object]:
    # the weights prepacked by oneDNN, each matmul shape timed once between inductor's own C++ GEMM (micro-kernels for
    # the CPU's AMX, AVX-512 or AVX2) and oneDNN's; inductor's disk cache refuses these graphs, so every process
    # compiles them (minutes); quietly
    return {"cpp_wrapper": True, "cpp.weight_prepack": True, "max_autotune": True,
            "max_autotune_gemm_backends": "CPP,ATEN", "autotune_num_choices_displayed": 0,
            "max_autotune_report_choices_stats": False}


def _cuda_options() -> dict[str, object]:
    # a forward's kernels replay as one CUDA graph (cudagraph trees, as ``mode="reduce-overhead"``); a graph is
    # recorded per feed length by design, so the warning about many lengths is off
    return {"triton.cudagraphs": True, "triton.cudagraph_dynamic_shape_warn_limit": None}


@dataclass(frozen=True)
class CompileConfig:
    """How a :class:`~decode.compile.model.CompiledModel` compiles: recorded in
    :attr:`decode.stats.DecodeStats.compile` of every decode that ran compiled. The dicts are never mutated."""

    bucket: int = 256  # cache lengths are multiples of this
    short: int = 16  # the longest feed that runs compiled; longer ones (a prompt) run eager
    # shorter feeds are padded to this length (their extra positions dropped again): one graph serves every feed
    padded: int = 2
    # graphs per forward code object (every model class shares its forward's: two per model, a few models, their caches'
    # lengths), raised to this only around the calls that compile
    recompile_limit: int = 64
    dynamic: bool = False  # no automatic dynamic shapes: each cache length keeps graphs of its own
    # freezing: the weights are constants of the graph
    inductor: dict[str, object] = field(default_factory=lambda: {"freezing": True})
    cpu: dict[str, object] = field(default_factory=_cpu_options)
    cuda: dict[str, object] = field(default_factory=_cuda_options)
    # calls of a new feed length before it replays, by device type (1 elsewhere): on CUDA cudagraph trees warm a
    # length up, then record it
    prepare_calls: dict[str, int] = field(default_factory=lambda: {"cuda": 3})

    def inductor_options(self, device: torch.device) -> dict[str, object]:
        """Inductor's settings for a model on ``device``: :attr:`inductor` with :attr:`cpu` or :attr:`cuda`."""
        return {**self.inductor, **{"cpu": self.cpu, "cuda": self.cuda}.get(device.type, {})}

    def cache_length(self, tokens: int) -> int:
        """The length of the pooled cache that holds a buffer of ``tokens`` (a multiple of :attr:`bucket`); each
        length compiles graphs of its own."""
        return -(-max(tokens, 1) // self.bucket) * self.bucket


DEFAULT = CompileConfig()
# the CPU's two ways to run a graph's matmuls: plain frozen weights (the default: compiled once per machine) and
# oneDNN-prepacked ones (compiled in every process); ``python -m benchmarks.engines --gemm`` times both on a machine
GEMMS = {"frozen": DEFAULT, "prepacked": CompileConfig(cpu=_prepacked_cpu_options())}
SHORT = DEFAULT.short  # the default bound of a compiled feed (the lengths a cost profile times)
