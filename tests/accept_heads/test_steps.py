"""The evaluation's step loop (accept_heads.evaluation.steps.run_steps) with a pool that decodes nothing real."""

from __future__ import annotations

from dataclasses import dataclass, replace

from accept_heads.evaluation.evaluation_plan import plan_evaluation
from accept_heads.evaluation.steps import Decoding, Progress, run_steps
from accept_heads.measure.runs import RunSpec
from decode.policy_specs import FixedSpec
from tests.helpers.config import compose_config


@dataclass
class FakeRecord:
    run: RunSpec


class CountingPool:
    """Hands every spec back as one record, counting what it was asked to decode (and by which method)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[RunSpec]]] = []

    def completed(self, specs, method="run"):
        self.asked.append((method, list(specs)))
        yield from reversed(list(enumerate([FakeRecord(spec)] for spec in specs)))  # out of order, as workers finish


def fixed(k: int) -> RunSpec:
    return RunSpec(set="dev", rule="speculative", policy=FixedSpec(k))


@dataclass(frozen=True, kw_only=True)
class UpTo(Decoding):
    """Wants K = 1..n, one more each time it is handed records, until it has K = top; counts its ``done``."""

    top: int
    finished: list

    def specs(self, progress):
        decoded = sorted(r.run.param for r in progress.records)
        return [fixed(k) for k in range(1, min(len(decoded) + 2, self.top) + 1)]

    def done(self, progress):
        self.finished.append(len(progress.records))
        return progress


def test_each_step_is_asked_until_it_wants_nothing_new_and_decodes_only_what_is_new():
    plan = plan_evaluation(compose_config().evaluate_job())
    pool, finished = CountingPool(), []
    steps = [UpTo("first", top=3, finished=finished), UpTo("again", top=4, finished=finished)]
    reused = fixed(4)  # a run a record already holds: handed in, never decoded
    progress = run_steps(steps, Progress(plan), pool,
                         lambda specs: {reused: [FakeRecord(reused)]} if reused in specs else {})
    assert [[int(s.param) for s in specs] for _, specs in pool.asked] == [[1, 2], [3]]  # 4 came from the record
    assert sorted(int(r.run.param) for r in progress.records) == [1, 2, 3, 4]  # each once, in spec order per round
    assert finished == [3, 4] and progress.decoded == {fixed(k) for k in range(1, 5)}
    assert progress.plan is plan  # the defaults choose nothing


def test_a_step_wanting_only_decoded_runs_decodes_nothing():
    """Negative control: everything it wants is decoded already, so the pool is never asked."""
    plan = plan_evaluation(compose_config().evaluate_job())
    pool, finished = CountingPool(), []
    start = replace(Progress(plan), records=(FakeRecord(fixed(1)), FakeRecord(fixed(2))),
                    decoded=frozenset({fixed(1), fixed(2)}))
    run_steps([UpTo("once", top=2, finished=finished)], start, pool, lambda specs: {})
    assert pool.asked == [] and finished == [2]
