"""The head's stop threshold ``h``: chosen once, after training, on the evaluation's dev prompts (DESIGN §5).

The head decodes the dev set every other choice is made on (``evaluate.prompts.dev`` prompts of the configured
source, ``evaluate.max_new_tokens`` each: :func:`accept_heads.evaluation.inputs.load_split`) at each ``h`` of
``head.thresholds``, as the evaluation's own runs (:class:`accept_heads.evaluation.runs.DecoderRunner`: the configured
models and dtypes, each prompt's seed, the evaluation's batching and torch threads), and the ``h`` with the highest
modelled throughput at the evaluation's ``cost`` model (:func:`accept_heads.evaluation.cost_models.pricing`) wins
(:func:`accept_heads.selection.best_value`, ties to the smaller). Training records it in the head; the evaluation,
:class:`decode.policies.Head` and the ``generate`` door decode at it, so the evaluation's dev rows of the head are
these runs again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from accept_heads.evaluation.cost_models import one_call_seconds, pricing
from accept_heads.evaluation.executor import alone_prompts, place
from accept_heads.evaluation.inputs import Artifacts, PromptSet, load_split
from accept_heads.evaluation.runs import DecoderRunner, RunSpec
from accept_heads.evaluation.table import costed
from accept_heads.selection import best_value
from ahconf.rule_config import rule_value
from ahconf.schema import RulesConfig, TrainJob
from data_gen.models import load_trio
from decode.costs import CostModel
from decode.head import AcceptanceHead
from decode.json_types import JSONDict
from decode.metadata import SweepRow
from decode.policies.sources import HeadEstimate
from decode.policies.stops import Threshold
from decode.policy_specs import SourceStopSpec
from decode.rules import Rule
from decode.sampling import Sampling

#: The name the head goes by in its calibration runs.
NAME = "head"


@dataclass(frozen=True)
class Calibration:
    """The choice of ``h``: one row per threshold of the grid, the chosen one, the dev prompts decoded and the costs."""

    rows: list[SweepRow]
    threshold: float
    prompts: JSONDict  # PromptSet.describe(): source, split, count and prompt ids
    max_new_tokens: int
    cost: JSONDict  # Pricing.record: the prices the sweep was modelled at and where they come from


def sweep_thresholds(runner: DecoderRunner, rule: Rule, rules: RulesConfig, dev: PromptSet,
                     thresholds: list[float], cost: CostModel) -> list[SweepRow]:
    """Decode ``dev`` with head :data:`NAME` of ``runner`` at each threshold; one :class:`SweepRow` per threshold."""
    rows = []
    for threshold in thresholds:
        policy = SourceStopSpec(HeadEstimate.name, Threshold.name, threshold, NAME)
        spec = RunSpec(set=dev.name, rule=rule.name, policy=policy, rule_param=rule_value(rule.name, rules))
        run = costed(runner.run(spec, dev, with_quality=False), cost).iloc[0]
        throughput = float(run["throughput_cost"])
        rows.append(SweepRow(threshold=threshold, generated=int(run["generated"]), draft_calls=int(run["draft_calls"]),
                             target_calls=int(run["target_calls"]), discarded=int(run["discarded"]),
                             modelled_time=run["generated"] / throughput if throughput > 0 else 0.0,
                             throughput=throughput))
    return rows


def best_threshold(rows: list[SweepRow]) -> float:
    """The threshold with the highest modelled throughput (the lowest threshold on ties)."""
    return best_value([row.threshold for row in rows], [row.throughput for row in rows])


def choose_threshold(job: TrainJob, head: AcceptanceHead, rule: Rule, sampling: Sampling) -> Calibration:
    """``h`` for a trained ``head`` (predicting acceptance probabilities: prior shift folded) of ``rule`` under
    ``sampling``, on the evaluation's dev prompts with the models as the evaluation loads them."""
    e = job.evaluate
    trio = load_trio(job.models, job.paths.zoo_dir, with_companion=head.config.companion_features)
    place(trio)
    context = trio.target.config.max_position_embeddings
    dev = load_split(job.prompts, e, job.seed, trio.tokenizer, context, "dev", e.prompts["dev"])

    def companion_ratio() -> float | None:
        if not head.config.companion_features or trio.companion is None:
            return None
        prompt = dev.prompts[0].token_ids
        return (one_call_seconds(trio.companion, prompt, e.latency.repeats)
                / one_call_seconds(trio.draft, prompt, e.latency.repeats))

    runner = DecoderRunner(trio, sampling, job.rules, Artifacts(heads={NAME: head.to(trio.draft.device)}),
                           e.max_new_tokens, job.seed, job.head.k_min, job.head.k_max, batch_size=e.batch_size,
                           timed_prompts=alone_prompts(e, len(dev.prompts)))
    threads = torch.get_num_threads()
    if e.threads is not None:
        torch.set_num_threads(e.threads)
    try:
        priced = pricing(job.cost, trio, companion_ratio, compiled=e.compile, repeats=e.latency.repeats,
                         threads=e.threads)
        rows = sweep_thresholds(runner, rule, job.rules, dev, [float(h) for h in job.head.thresholds], priced.model)
    finally:
        torch.set_num_threads(threads)
    return Calibration(rows, best_threshold(rows), dev.describe(), e.max_new_tokens, priced.record)
