"""Decoding run specs: in this process, or in worker processes that each hold their own copy of the models.

A worker is spawned (not forked: safe with CUDA and OpenMP), sets its torch threads, and rebuilds
the same :class:`Executor` from the config (models, artifacts, prompt sets); specs are handed out one
at a time and their records come back in spec order, so the results do not depend on the number of
workers (only the wall-clock columns do).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ahconf.schema import Config
from accept_heads.evaluation import baselines, ensemble
from accept_heads.evaluation.artifacts import Artifacts, discover
from accept_heads.evaluation.runs import Decoding, RunSpec
from accept_heads.evaluation.sets import PromptSet, load_sets
from data_gen.models import Trio, load_trio
from decode.costs import CostModel
from decode.sampling import Sampling


def place(trio: Trio) -> str:
    """Move the models to the GPU when there is one (unless a device map placed them); returns the device."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for model in (trio.target, trio.draft, trio.companion):
        if model is not None:
            model.eval()
            if getattr(model, "hf_device_map", None) is None:
                model.to(device)
    return device


def default_workers(device: str) -> int:
    """One worker per usable CPU core on CPU; one process on a GPU (the models share it)."""
    return 1 if device != "cpu" else max(1, len(os.sched_getaffinity(0)))


@dataclass
class Executor:
    """Everything a run needs: the models, the exported artifacts, the prompt sets."""

    config: Config
    trio: Trio
    device: str
    artifacts: Artifacts
    described: dict[str, Any]  # the artifacts' metadata, for the results
    sets: dict[str, PromptSet]
    decoding: Decoding

    @classmethod
    def build(cls, config: Config, notes: dict[str, str]) -> Executor:
        """Load the models, discover the heads / profiles and load the prompt sets of ``config``."""
        e = config.evaluate
        trio = load_trio(config.models, config.paths.zoo_dir)
        device = place(trio)
        sampling = Sampling(**asdict(config.sampling))
        artifacts, described = discover(config, trio, sampling, notes)
        sets = load_sets(config, trio.tokenizer, trio.target.config.max_position_embeddings)
        decoding = Decoding(trio, sampling, config.rules, artifacts, e.max_new_tokens, config.seed,
                            config.head.k_min, config.head.k_max, batch_size=e.batch_size,
                            timed_prompts=e.timed_prompts)
        return cls(config, trio, device, artifacts, described, {s.name: s for s in sets}, decoding)

    def run(self, spec: RunSpec) -> list[dict[str, Any]]:
        """Decode one run: a record per generation."""
        prompts = self.sets[spec.set]
        with_quality = prompts.role != "dev"
        d = self.decoding
        if spec.family.startswith("hf-"):
            return baselines.run_hf(spec, d.trio, prompts, d.sampling, d.max_new_tokens, d.seed, with_quality)
        if spec.family.startswith("se-"):
            return ensemble.run_se(spec, d.trio, prompts, d.sampling, self.config.rules, d.max_new_tokens, d.seed,
                                   with_quality)
        return d.run(spec, prompts, with_quality)


_WORKER: Executor | None = None


def _start_worker(config: Config, costs: CostModel | None) -> None:
    global _WORKER
    if config.evaluate.threads is not None:
        torch.set_num_threads(config.evaluate.threads)
    _WORKER = Executor.build(config, notes={})
    _WORKER.decoding.costs = costs


def _run_in_worker(spec: RunSpec) -> list[dict[str, Any]]:
    assert _WORKER is not None, "worker not initialised"
    return _WORKER.run(spec)


class WorkerPool:
    """``workers`` spawned processes running :meth:`Executor.run`; with one worker, runs in this process."""

    def __init__(self, executor: Executor, workers: int) -> None:
        self.executor = executor
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> WorkerPool:
        if self.workers > 1:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_start_worker,
                                             initargs=(self.executor.config, self.executor.decoding.costs))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def map(self, specs: list[RunSpec]) -> Iterator[list[dict[str, Any]]]:
        """Each spec's records, in the order of ``specs``."""
        if self._pool is None:
            return map(self.executor.run, specs)
        return self._pool.map(_run_in_worker, specs)
