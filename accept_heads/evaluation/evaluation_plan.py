"""What one evaluation decodes by, as data: its rules, dev grids, workers, the baselines it runs and its choices.

:func:`plan_evaluation` resolves them from the validated config; :meth:`EvaluationPlan.loaded` adds what the loaded
models decide (the device's worker count, no HF baseline for a draft kind transformers' assistant loop cannot run),
:meth:`EvaluationPlan.with_fixed_grid` the fixed-K grid grown on dev and :meth:`EvaluationPlan.chosen` the choices made
on dev. Each returns a new plan; the config is only read (the steps read its settings, the plan what they resolved).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from accept_heads.evaluation.choice import Choice
from accept_heads.measure.families import check_grids, families
from ahconf.schema import EvaluateJob
from decode.drafts import Drafter
from decode.policy_specs import FixedSpec


@dataclass(frozen=True)
class EvaluationPlan:
    """The rules an evaluation decodes, its batch axis's, every tuned kind's dev grid, its workers, whether it runs
    HF's baselines, and the choices made on dev so far."""

    rules: tuple[str, ...]  # evaluate.rules, else rules.names
    axis_rules: tuple[str, ...]  # the batch axis's rules (empty: no batch axis)
    grids: Mapping[str, tuple[float, ...]]  # each tuned kind's dev grid (evaluate.grids.<kind> over its declared one)
    workers: int | None  # decoding processes (None: one per usable core on CPU, 1 on a GPU, once the device is known)
    hf_baselines: bool  # evaluate.hf.baselines, unless the draft's kind rules them out
    choices: tuple[Choice, ...] = ()  # the parameters chosen on dev (accept_heads.evaluation.table.select)

    def grid(self, kind: str) -> list[float]:
        """The dev grid of the tuned kind ``kind``."""
        return list(self.grids[kind])

    @property
    def fixed_grid(self) -> list[int]:
        """The fixed-K dev grid (grown past an edge choice)."""
        return [int(k) for k in self.grids[FixedSpec.kind]]

    def loaded(self, device: str, kind: Drafter, notes: dict[str, str]) -> EvaluationPlan:
        """The plan once the models are loaded on ``device``: its workers resolved, and no HF baseline when
        transformers' assistant loop cannot run the draft's ``kind`` (noted in ``notes``)."""
        plan = replace(self, workers=self.workers if self.workers is not None else default_workers(device))
        if plan.hf_baselines and not kind.assisted_generation:
            notes["hf_baselines"] = (f"no HF assisted-generation baseline: transformers' assistant loop cannot run a "
                                     f"{kind.name} draft")
            plan = replace(plan, hf_baselines=False)
        return plan

    def with_fixed_grid(self, grid: Sequence[int]) -> EvaluationPlan:
        """The plan with the fixed-K dev grid ``grid`` (grown past an edge choice; the batch axis's too)."""
        return replace(self, grids={**self.grids, FixedSpec.kind: tuple(float(k) for k in sorted(grid))})

    def chosen(self, choices: Sequence[Choice]) -> EvaluationPlan:
        """The plan with the dev choices ``choices``."""
        return replace(self, choices=tuple(choices))


def default_workers(device: str) -> int:
    """One worker per usable CPU core on CPU; one process on a GPU (the models share it)."""
    return 1 if device != "cpu" else max(1, len(os.sched_getaffinity(0)))


def axis_rules(job: EvaluateJob, rules: list[str]) -> list[str]:
    """The rules of the batch axis: ``evaluate.batch_axis.rules`` (of those decoded), else all of ``rules``."""
    wanted = job.evaluate.batch_axis.rules
    return [rule for rule in rules if wanted is None or rule in wanted]


def eval_rules(job: EvaluateJob) -> list[str]:
    """Rules to decode with: ``evaluate.rules``, else ``rules.names``."""
    return list(job.evaluate.rules or job.rules.names)


def dev_grids(job: EvaluateJob) -> dict[str, tuple[float, ...]]:
    """Every tuned kind's dev grid: ``evaluate.grids.<kind>``, else the one it declares."""
    return {name: tuple(f.dev_grid(job)) for name, f in families().items() if f.tuned}


def plan_evaluation(job: EvaluateJob) -> EvaluationPlan:
    """The plan of ``job`` (refusing a dev grid for a kind with no parameter chosen on dev)."""
    check_grids(job)
    rules = eval_rules(job)
    axis = axis_rules(job, rules) if job.evaluate.batch_axis.sizes else []
    return EvaluationPlan(tuple(rules), tuple(axis), dev_grids(job), job.evaluate.workers,
                          job.evaluate.hf.baselines)
