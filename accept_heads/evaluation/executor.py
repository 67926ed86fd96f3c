"""Decoding run specs: in this process, or in worker processes that each hold their own copy of the models.

Each family is decoded by its :class:`~accept_heads.measure.runs.Runner` (:func:`runners`). A
worker is spawned (not forked: safe with CUDA and OpenMP), sets its torch threads, and rebuilds the
same :class:`Executor` from the job (models, artifacts, prompt sets); specs are handed out one
at a time and their records come back in spec order, so the results do not depend on the number of
workers (only the wall-clock columns do). The pool hands the runs that decode their prompts one after another out
first (:func:`decodes_alone`), so no worker is left with one of them at the end while the other idles.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace

from accept_heads.evaluation.baselines import HFRunner, SERunner
from accept_heads.evaluation.batch_axis import BatchRecord, BatchRun, measure_batches
from accept_heads.measure.families import families, family
from accept_heads.measure.inputs import Artifacts, PromptSet, discover, load_sets
from accept_heads.measure.placement import alone_prompts
from accept_heads.measure.runs import DecoderRunner, GenerationRecord, Record, Runner, RunSpec
from ahconf.entry import quiet_library_output
from ahconf.schema import EvaluateJob
from decode.batch_costs import BatchCosts
from decode.costs import CostModel
from decode.sampling import Sampling
from decode.threads import torch_threads
from runtime.models import Trio, load_trio
from runtime.placement import place


def decodes_alone(spec: RunSpec | BatchRun) -> bool:
    """Whether ``spec`` decodes its prompts one after another (its family's rows do not decide as alone, or HF / SE
    decode it), so it takes several times a batched run's time."""
    if isinstance(spec, BatchRun):
        return False
    kind = family(spec.family)
    return kind.runner != "decode" or not kind.rows_alone


def runners(decoding: DecoderRunner, hf: HFRunner, se: SERunner) -> dict[str, Runner]:
    """The runner of each run family."""
    by_runner: dict[str, Runner] = {"decode": decoding, "hf": hf, "se": se}
    return {name: by_runner[family.runner] for name, family in families().items()}


@dataclass
class Executor:
    """Everything a run needs: the models, the exported artifacts, the prompt sets, each family's runner."""

    job: EvaluateJob
    trio: Trio
    device: str
    artifacts: Artifacts
    sets: dict[str, PromptSet]
    decoding: DecoderRunner
    hf: HFRunner
    runners: dict[str, Runner]
    batch_costs: BatchCosts | None = None  # the batch axis's prices, measured on this device before decoding

    @classmethod
    def build(cls, job: EvaluateJob, notes: dict[str, str]) -> Executor:
        """Load the models, discover the heads / profiles and load the prompt sets of ``job``."""
        d = job.decoding
        trio = load_trio(job.models, job.paths.zoo_dir, verify=d.verify)
        device = place(trio)
        sampling = Sampling(**asdict(job.sampling))
        artifacts = discover(job.paths.head_dir, trio, sampling, notes, d.verify)
        sets = load_sets(job.prompts, d, job.seed, trio.tokenizer, trio.target.config.max_position_embeddings)
        timed = alone_prompts(d, job.evaluate.wallclock, max(len(s.prompts) for s in sets))
        decoding = DecoderRunner(trio, sampling, job.rules, artifacts, d.max_new_tokens, job.seed,
                            job.head.k_min, job.head.k_max, batch_size=d.batch_size, timed_prompts=timed,
                            compile=d.compile)
        hf = HFRunner(trio, sampling, d.max_new_tokens, job.seed)
        table = runners(decoding, hf, SERunner(trio, sampling, job.rules, d.max_new_tokens, job.seed))
        return cls(job, trio, device, artifacts, {s.name: s for s in sets}, decoding, hf, table)

    def priced(self, costs: CostModel, batch_costs: BatchCosts | None) -> Executor:
        """This executor deciding at ``costs`` (the goodput head stops by the model the selection uses) and pricing
        the batch axis at ``batch_costs``: a new one, sharing the models."""
        decoding = replace(self.decoding, costs=costs)
        table = {name: decoding if runner is self.decoding else runner for name, runner in self.runners.items()}
        return replace(self, decoding=decoding, runners=table, batch_costs=batch_costs)

    def run(self, spec: RunSpec) -> list[GenerationRecord]:
        """Decode one run with its family's runner: a record per generation."""
        runner = self.runners.get(spec.family)
        if runner is None:
            raise ValueError(f"unknown run family {spec.family!r}; valid: {', '.join(self.runners)}")
        prompts = self.sets[spec.set]
        return runner.run(spec, prompts, with_quality=prompts.role != "dev")

    def run_batches(self, run: BatchRun) -> list[BatchRecord]:
        """Decode one batch-axis run at the measured batch costs: a record per batched generate."""
        if self.batch_costs is None:
            raise ValueError("a batch-axis run needs Executor.batch_costs (measured before decoding)")
        return measure_batches(self.decoding, self.batch_costs, run, self.sets[run.run.set],
                               self.job.evaluate.batch_axis.prompts)


_WORKER: Executor | None = None


def _start_worker(job: EvaluateJob, costs: CostModel, batch_costs: BatchCosts | None) -> None:
    """A spawned process starts afresh: quiet the libraries as the entry point did, then build its executor."""
    global _WORKER
    quiet_library_output()
    torch_threads(job.decoding.threads)
    _WORKER = Executor.build(job, notes={}).priced(costs, batch_costs)


def _call_in_worker(method: str, spec: RunSpec | BatchRun) -> Sequence[Record]:
    assert _WORKER is not None, "worker not initialised"
    return getattr(_WORKER, method)(spec)


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
                                             initargs=(self.executor.job, self.executor.decoding.costs,
                                                       self.executor.batch_costs))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def completed(self, specs: Sequence[RunSpec | BatchRun],
                  method: str = "run") -> Iterator[tuple[int, Sequence[Record]]]:
        """``(index, records)`` of each spec of ``specs`` from the executor's ``method`` (``run``, ``run_batches``) as
        it finishes; the runs that decode alone are handed out first."""
        if self._pool is None:
            yield from enumerate(map(getattr(self.executor, method), specs))
            return
        order = sorted(range(len(specs)), key=lambda i: not decodes_alone(specs[i]))
        futures = {self._pool.submit(_call_in_worker, method, specs[i]): i for i in order}
        for future in as_completed(futures):
            yield futures[future], future.result()
