"""The evaluation as declared steps over its plan: each step says which runs it wants decoded given the evaluation so
far (``specs``) and what it makes of their records (``choose``); :func:`run_steps` decodes what a step wants until it
wants nothing new, then lets it finish (``done``) and goes on to the next.

In order (:func:`evaluation_steps`): the dev sweeps (a climb over each tuned grid, :func:`~.plan.climb`), growing the
fixed-K grid past an edge choice, recording each head's ``h`` beside it, the swept rules' dev sweeps (FSD's T at the
rule's chosen K), the test / OOD runs at the dev choices, and the batch axis's dev and test runs. The wall clock
follows in the evaluation's own process, once the worker pool is closed (the methods take turns on one machine).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from tqdm.auto import tqdm

from accept_heads.evaluation import batch_axis
from accept_heads.evaluation.batch_axis import BatchRecord, BatchRun
from accept_heads.evaluation.choice import Choice
from accept_heads.evaluation.evaluation_plan import EvaluationPlan
from accept_heads.evaluation.executor import Executor, WorkerPool
from accept_heads.evaluation.h_choice import in_spec_order, record_choices
from accept_heads.evaluation.plan import (
    after_selection,
    climb,
    dev_sweeps,
    edge_note,
    edge_rules,
    extended_k,
    fixed_specs,
    rule_sweep,
    swept_rules,
)
from accept_heads.evaluation.table import select, select_rule_param
from accept_heads.measure.costing import costed
from accept_heads.measure.inputs import Artifacts
from accept_heads.measure.runs import Record, RunSpec, frame
from ahconf.schema import EvaluateJob
from decode.costs import CostModel
from decode.json_types import JSONDict

Spec = RunSpec | BatchRun


@dataclass(frozen=True)
class Progress:
    """The evaluation so far: its plan (the dev choices made so far in it), every record, the runs decoded."""

    plan: EvaluationPlan
    records: tuple[Record, ...] = ()  # the main runs' records (dev, test, OOD), a record per generation
    batch_records: tuple[BatchRecord, ...] = ()  # the batch axis's, a record per batched generate
    decoded: frozenset[Spec] = frozenset()  # the runs decoded (or reused from a head's record)

    def dev_records(self) -> list[Record]:
        """The dev rows so far."""
        return [r for r in self.records if r.run.set == "dev"]


class Step(Protocol):
    """One step of the evaluation: the runs it wants and what it makes of them."""

    description: str  # its progress bar's
    method: str  # the executor's method that decodes its runs (Executor.run, Executor.run_batches)

    def specs(self, progress: Progress) -> Sequence[Spec]:
        """The runs it wants decoded now (those already decoded are skipped; nothing new: it is done)."""
        ...

    def choose(self, progress: Progress, records: Sequence[Record]) -> Progress:
        """The evaluation once ``records`` (of the runs it wanted) are in."""
        ...

    def done(self, progress: Progress) -> Progress:
        """The evaluation once the step wants nothing new."""
        ...


@dataclass(frozen=True)
class Decoding:
    """A step's defaults: it records what it decoded, and has nothing to finish."""

    description: str
    method: str = "run"

    def choose(self, progress: Progress, records: Sequence[Record]) -> Progress:
        return replace(progress, records=progress.records + tuple(records))

    def done(self, progress: Progress) -> Progress:
        return progress


def dev_choices(records: Sequence[Record], cost: CostModel) -> list[Choice]:
    """K, τ, h and γ chosen on the dev rows of ``records`` at ``cost``."""
    return select(costed(records, cost), "throughput_cost")


def chosen_again(progress: Progress, plan: EvaluationPlan, cost: CostModel) -> Progress:
    """``progress`` under ``plan`` with K, τ, h and γ chosen again on every dev row so far."""
    return replace(progress, plan=plan.chosen(dev_choices(progress.dev_records(), cost)))


@dataclass(frozen=True, kw_only=True)
class DevSweep(Decoding):
    """Every rule's dev sweep, climbing each tuned grid (``evaluate.dev_search``), the choices made after each round."""

    sweep: Sequence[RunSpec]
    search: str
    cost: CostModel

    def specs(self, progress: Progress) -> Sequence[Spec]:
        return climb(self.sweep, list(progress.plan.choices), self.search)

    def choose(self, progress: Progress, records: Sequence[Record]) -> Progress:
        progress = super().choose(progress, records)
        return chosen_again(progress, progress.plan, self.cost)


@dataclass(frozen=True, kw_only=True)
class GrowFixedK(Decoding):
    """The fixed-K grid grown on dev by 1.5× and 2× its largest K for the rules whose best K sits on its edge, until
    the optimum is interior or the ceiling is reached (a note names the rules still on the edge)."""

    job: EvaluateJob
    cost: CostModel
    notes: dict[str, str]

    def specs(self, progress: Progress) -> Sequence[Spec]:
        grid = progress.plan.fixed_grid
        edge, more = edge_rules(list(progress.plan.choices), grid), extended_k(grid)
        return [spec for rule in edge for spec in fixed_specs(self.job.rules, "dev", rule, more)] if more else []

    def choose(self, progress: Progress, records: Sequence[Record]) -> Progress:
        progress = super().choose(progress, records)
        grown = progress.plan.with_fixed_grid(progress.plan.fixed_grid + extended_k(progress.plan.fixed_grid))
        return chosen_again(progress, grown, self.cost)

    def done(self, progress: Progress) -> Progress:
        if note := edge_note(list(progress.plan.choices), progress.plan.fixed_grid):
            self.notes["fixed_k_edge"] = note
        return progress


@dataclass(frozen=True, kw_only=True)
class RecordThresholds(Decoding):
    """Each head's ``h`` and its dev runs written beside it (:mod:`~accept_heads.evaluation.h_choice`)."""

    sweep: Sequence[RunSpec]
    executor: Executor
    cost: CostModel
    priced: JSONDict

    def specs(self, progress: Progress) -> Sequence[Spec]:
        return []

    def done(self, progress: Progress) -> Progress:
        e = self.executor
        decoded = [spec for spec in self.sweep if spec in progress.decoded]
        record_choices(decoded, progress.records, list(progress.plan.choices), e.artifacts, e.decoding, e.sets["dev"],
                       self.cost, self.priced)
        return progress


@dataclass(frozen=True, kw_only=True)
class RuleSweeps(Decoding):
    """Each swept rule's parameter (FSD's T) on dev at the rule's chosen K, then chosen there."""

    job: EvaluateJob
    cost: CostModel

    def specs(self, progress: Progress) -> Sequence[Spec]:
        choices = list(progress.plan.choices)
        return [spec for rule in swept_rules(list(progress.plan.rules))
                for spec in rule_sweep(self.job, "dev", rule, choices)]

    def choose(self, progress: Progress, records: Sequence[Record]) -> Progress:
        progress = super().choose(progress, records)
        costs = costed(progress.records, self.cost)
        choices = list(progress.plan.choices)
        choices += [c for rule in swept_rules(list(progress.plan.rules))
                    for c in select_rule_param(costs, "throughput_cost", rule, choices)]
        return replace(progress, plan=progress.plan.chosen(choices))


@dataclass(frozen=True, kw_only=True)
class HeldOut(Decoding):
    """Every test / OOD run at the plan's dev choices (:func:`~.plan.after_selection`)."""

    job: EvaluateJob
    executor: Executor

    def specs(self, progress: Progress) -> Sequence[Spec]:
        return after_selection(self.job, progress.plan, self.executor.artifacts, list(self.executor.sets.values()))


@dataclass(frozen=True, kw_only=True)
class BatchAxisDev(Decoding):
    """The batch axis's fixed-K grid on dev at every batch size."""

    job: EvaluateJob
    method: str = "run_batches"

    def specs(self, progress: Progress) -> Sequence[Spec]:
        return batch_axis.dev_fixed_runs(self.job, progress.plan) if progress.plan.axis_rules else []

    def choose(self, progress: Progress, records: Sequence[Record]) -> Progress:
        return replace(progress, batch_records=progress.batch_records + tuple(records))


@dataclass(frozen=True, kw_only=True)
class BatchAxisTest(BatchAxisDev):
    """The batch axis's test runs: the target alone, each batch size's best fixed K and the dev choices."""

    artifacts: Artifacts
    sets: tuple[str, ...]  # the test sets

    def specs(self, progress: Progress) -> Sequence[Spec]:
        if not progress.plan.axis_rules:
            return []
        dev = [r for r in progress.batch_records if r.run.set == "dev"]
        best_k = batch_axis.best_fixed_k(frame(dev))
        rules, choices = list(progress.plan.axis_rules), list(progress.plan.choices)
        return [run for name in self.sets
                for run in batch_axis.test_runs(self.job, self.artifacts, name, rules, choices, best_k)]


def evaluation_steps(job: EvaluateJob, plan: EvaluationPlan, executor: Executor, cost: CostModel, priced: JSONDict,
                     notes: dict[str, str]) -> list[Step]:
    """The evaluation's steps, in order, over ``plan`` (decoding with ``executor``'s runners, choosing at ``cost``;
    ``priced``: the prices the heads' records keep)."""
    artifacts, sweep = executor.artifacts, dev_sweeps(job, plan, executor.artifacts)
    tests = tuple(s.name for s in executor.sets.values() if s.role == "test")
    return [
        DevSweep("dev sweeps", sweep=sweep, search=job.evaluate.dev_search, cost=cost),
        GrowFixedK("dev fixed K past the grid's edge", job=job, cost=cost, notes=notes),
        RecordThresholds("each head's h", sweep=sweep, executor=executor, cost=cost, priced=priced),
        RuleSweeps("dev sweeps of the rules' parameters", job=job, cost=cost),
        HeldOut("test / OOD", job=job, executor=executor),
        BatchAxisDev("batch axis: dev fixed K", job=job),
        BatchAxisTest("batch axis: test", job=job, artifacts=artifacts, sets=tests),
    ]


def execute(specs: Sequence[Spec], pool: WorkerPool, description: str, method: str = "run") -> list[Record]:
    """Decode every run with the executor's ``method`` (a progress bar over runs); its records, in spec order."""
    done: dict[int, Sequence[Record]] = {}
    with tqdm(total=len(specs), desc=description, unit="run", dynamic_ncols=True) as bar:
        for index, run_records in pool.completed(specs, method):
            spec = specs[index]
            bar.set_postfix_str(f"{spec.set} {spec.rule} {spec.label}", refresh=False)
            bar.update()
            done[index] = run_records
    return [record for index in range(len(specs)) for record in done[index]]


Reuse = Callable[[Sequence[Spec]], Mapping[RunSpec, list]]


def run_steps(steps: Sequence[Step], progress: Progress, pool: WorkerPool, reuse: Reuse) -> Progress:
    """Each step in turn: decode the runs it wants that are not decoded yet (``reuse``: the records a head's record
    already holds for some of them), hand it their records, until it wants nothing new; then let it finish."""
    for step in steps:
        while wanted := [spec for spec in step.specs(progress) if spec not in progress.decoded]:
            reused = reuse(wanted)
            todo = [spec for spec in wanted if spec not in reused]
            decoded = execute(todo, pool, step.description, step.method) if todo else []
            records = in_spec_order(wanted, reused, decoded) if reused else decoded
            progress = step.choose(replace(progress, decoded=progress.decoded | set(wanted)), records)
        progress = step.done(progress)
    return progress
