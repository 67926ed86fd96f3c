"""What one evaluation does, fixed before it decodes: a frozen record computed from its validated config.

:func:`plan_evaluation` reads the config; :meth:`EvaluationPlan.loaded` adds what the loaded models decide (the
device's worker count, no HF baseline for a draft kind transformers' assistant loop cannot run) and :meth:`EvaluationPlan.with_fixed_grid` the fixed-K
grid grown on dev. Each returns a new plan whose ``job`` is a new config where it differs: the caller's config is
never written.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from accept_heads.evaluation.batch_axis import axis_rules
from accept_heads.evaluation.executor import default_workers
from accept_heads.evaluation.plan import eval_rules
from accept_heads.measure.families import check_grids
from ahconf.schema import EvaluateJob
from decode.drafts import Drafter
from decode.policy_specs import FixedSpec


@dataclass(frozen=True)
class EvaluationPlan:
    """The config an evaluation decodes by (``job``), the rules it decodes, its batch axis's and its workers."""

    job: EvaluateJob
    rules: tuple[str, ...]  # evaluate.rules, else rules.names
    axis_rules: tuple[str, ...]  # the batch axis's rules (empty: no batch axis)
    workers: int | None  # decoding processes (None: one per usable core on CPU, 1 on a GPU, once the device is known)

    def loaded(self, device: str, kind: Drafter, notes: dict[str, str]) -> EvaluationPlan:
        """The plan once the models are loaded on ``device``: its workers resolved, and no HF baseline when
        transformers' assistant loop cannot run the draft's ``kind`` (noted in ``notes``)."""
        plan = replace(self, workers=self.workers if self.workers is not None else default_workers(device))
        e = plan.job.evaluate
        if e.hf.baselines and not kind.assisted_generation:
            notes["hf_baselines"] = (f"no HF assisted-generation baseline: transformers' assistant loop cannot run a "
                                     f"{kind.name} draft")
            plan = replace(plan, job=replace(plan.job, evaluate=replace(e, hf=replace(e.hf, baselines=False))))
        return plan

    def with_fixed_grid(self, grid: list[int]) -> EvaluationPlan:
        """The plan with the fixed-K dev grid ``grid`` (grown past an edge choice; the batch axis's too)."""
        e = self.job.evaluate
        grids = {**e.grids, FixedSpec.kind: [float(k) for k in sorted(grid)]}
        return replace(self, job=replace(self.job, evaluate=replace(e, grids=grids)))


def plan_evaluation(job: EvaluateJob) -> EvaluationPlan:
    """The plan of ``job`` (refusing a dev grid for a kind with no parameter chosen on dev)."""
    check_grids(job)
    rules = eval_rules(job)
    axis = axis_rules(job, rules) if job.evaluate.batch_axis.sizes else []
    return EvaluationPlan(job, tuple(rules), tuple(axis), job.evaluate.workers)
