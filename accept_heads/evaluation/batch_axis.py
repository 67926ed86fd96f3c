"""The evaluation's batch axis (``evaluate.batch_axis.sizes``): throughput per policy and batch size.

At each batch size ``B`` the first ``evaluate.batch_axis.prompts`` prompts of a set are decoded in
consecutive batches of ``B`` (one batch of the whole set when it has fewer) by the target alone
(HF ``generate``, :mod:`decode.loops.target_alone`) and by our batched decoder with each policy. Every
batched generate is one record: generated tokens, its wall seconds (measured throughput) and its
forwards priced at the batch costs measured on this device before decoding (modelled throughput,
:meth:`decode.batch_costs.BatchCosts.modelled_seconds`; prompts left out). The fixed ``K`` is chosen
per ``B`` on dev by modelled throughput; on test the target alone, that ``K``, the confidence τ and
head thresholds h of the main evaluation's dev choices, and the policies that need no threshold at
any ``B`` (the goodput head and SV, both at the measured batch costs; SV drafting its profile's
``k_max`` and drafting that ``K``) are decoded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from accept_heads.evaluation.choice import Choice
from accept_heads.evaluation.plan import matching_artifacts
from accept_heads.measure.families import families
from accept_heads.measure.inputs import Artifacts, PromptSet
from accept_heads.measure.machine_costs import CostsSource
from accept_heads.measure.runs import DecoderRunner, RunSpec
from accept_heads.measure.selection import best_value
from accept_heads.measure.specs import TargetAloneSpec
from ahconf.rule_config import rule_value
from ahconf.schema import EvaluateJob
from decode.batch_costs import BatchCosts
from decode.loops.target_alone import generate_target_alone
from decode.policy_specs import FixedSpec
from runtime.seeding import prompt_seed

if TYPE_CHECKING:
    from accept_heads.evaluation.evaluation_plan import EvaluationPlan


@dataclass(frozen=True)
class BatchRun:
    """One policy (``run``) decoding a set's batch-axis prompts in batches of ``batch``."""

    run: RunSpec
    batch: int

    @property
    def set(self) -> str:
        return self.run.set

    @property
    def rule(self) -> str:
        return self.run.rule

    @property
    def label(self) -> str:
        """The policy's label and the batch size, e.g. ``fixed(K=2) B=8``."""
        return f"{self.run.label} B={self.batch}"


def dev_fixed_runs(job: EvaluateJob, plan: EvaluationPlan) -> list[BatchRun]:
    """The plan's fixed-K grid on dev at every batch size for the batch axis's rules (the best K is chosen per
    ``B``)."""
    return [BatchRun(RunSpec(set="dev", rule=rule, policy=FixedSpec(k), rule_param=rule_value(rule, job.rules),
                             chosen_on="grid"), batch)
            for batch in job.evaluate.batch_axis.sizes for rule in plan.axis_rules for k in plan.fixed_grid]


def best_fixed_k(dev: pd.DataFrame) -> dict[tuple[str, int], float]:
    """Per ``(rule, B)``: the fixed K with the highest modelled throughput on dev (ties: the smaller K)."""
    runs = summarise(dev)
    return {(rule, int(batch)): best_value(group["param"].tolist(), group["modelled_tokens_per_s"].tolist())
            for (rule, batch), group in runs.groupby(["rule", "batch"])}


def test_runs(job: EvaluateJob, artifacts: Artifacts, set_name: str, rules: list[str], choices: list[Choice],
              best_k: dict[tuple[str, int], float]) -> list[BatchRun]:
    """What each batch size decodes on ``set_name``: the target alone, the dev-chosen K at that ``B``, and every other
    policy family of our decoder (no bounds) as the main evaluation chose it: a tuned kind at its dev choice (or that of
    the kind it takes its choice from, :attr:`~accept_heads.measure.families.Family.choice_of`), the others per
    matching head or profile, each with its variants at that K
    (:attr:`~accept_heads.measure.families.Family.at_fixed_k`: SV drafting the fixed K chosen at this ``B`` too)."""
    chosen = {(c.rule, c.family, c.artifact): c.value for c in choices if c.swept == "param"}
    runs = []
    for batch in job.evaluate.batch_axis.sizes:
        for rule in rules:
            base = RunSpec(set=set_name, rule=rule, policy=TargetAloneSpec(),
                           rule_param=rule_value(rule, job.rules))
            heads, profiles = matching_artifacts(artifacts, rule, base.rule_param, job.rules)
            k = int(best_k[(rule, batch)])
            specs = [base, replace(base, policy=FixedSpec(k), chosen_on="dev")]
            for kind in families().values():
                if kind.runner != "decode" or kind.bound or kind.name == FixedSpec.kind:
                    continue
                if kind.tuned:
                    names = {"head": heads, "profile": profiles, None: [None]}[kind.reads]
                    own = kind.choice_of or kind.name
                    specs += [replace(base, policy=kind.of(chosen[(rule, own, name)], name), chosen_on="dev")
                              for name in names if (rule, own, name) in chosen]
                    continue
                for spec in kind.candidates([], heads, profiles):
                    specs += [replace(base, policy=spec)]
                    specs += [replace(base, policy=variant, chosen_on="dev") for variant in kind.at_fixed_k(spec, k)]
            runs += [BatchRun(spec, batch) for spec in specs]
    return runs


@dataclass(frozen=True)
class BatchRecord:
    """One batched generate of the batch axis: ``rows`` prompts of a set decoded together as ``run`` says, with
    its measured wall time and the modelled seconds of its forwards at the measured batch costs."""

    run: RunSpec
    role: str
    split: str
    batch: int
    rows: int
    tokens: int
    wall_s: float
    modelled_s: float
    target_calls: int
    draft_calls: int
    companion_calls: int

    def row(self) -> dict[str, Any]:
        """The run's key columns, the set's, then the batch and its counts (``batch_axis.parquet`` before summing)."""
        counts = {name: getattr(self, name) for name in ("batch", "rows", "tokens", "wall_s", "modelled_s",
                                                          "target_calls", "draft_calls", "companion_calls")}
        return {**self.run.to_dict(), "role": self.role, "split": self.split, **counts}


@torch.inference_mode()
def measure_batches(decoding: DecoderRunner, costs: BatchCosts, run: BatchRun, prompts: PromptSet,
                    count: int) -> list[BatchRecord]:
    """Decode the first ``count`` prompts of the set in batches of ``run.batch``: a record per batched generate."""
    spec = run.run
    items = prompts.prompts[:count]
    records = []
    for start in range(0, len(items), run.batch):
        chunk = items[start : start + run.batch]
        ids = [torch.tensor(p.token_ids, dtype=torch.long) for p in chunk]
        seeds = [prompt_seed(decoding.seed, p.prompt_id) for p in chunk]
        if isinstance(spec.policy, TargetAloneSpec):
            out = generate_target_alone(decoding.trio.target, ids, decoding.max_new_tokens,
                                        decoding.trio.target.generation_config.eos_token_id,
                                        do_sample=spec.rule != "greedy", seed=seeds[0])
            counts = {"tokens": out.tokens, "wall_s": out.wall_time_s,
                      "modelled_s": costs.target_alone_seconds(len(chunk), out.steps),
                      "target_calls": out.steps + 1, "draft_calls": 0, "companion_calls": 0}
        else:
            totals = decoding.decoder(spec, batch_costs=costs).generate(
                ids, max_new_tokens=decoding.max_new_tokens, seed=seeds).totals
            counts = {"tokens": totals.tokens, "wall_s": totals.wall_time_s,
                      "modelled_s": costs.modelled_seconds(totals.target_shapes, totals.draft_shapes,
                                                           totals.companion_shapes),
                      "target_calls": totals.target_calls, "draft_calls": totals.draft_calls,
                      "companion_calls": totals.companion_calls}
        records.append(BatchRecord(spec, prompts.role, prompts.split, run.batch, len(chunk), **counts))
    return records


KEYS = ["set", "role", "rule", "rule_param", "family", "artifact", "param", "policy", "chosen_on", "batch"]


def summarise(records: pd.DataFrame) -> pd.DataFrame:
    """One row per run and batch size: totals, measured and modelled tokens/s, and × the target alone and × the
    dev-chosen fixed K at the same set, rule and ``B`` (both modelled)."""
    sums = ["rows", "tokens", "wall_s", "modelled_s", "target_calls", "draft_calls", "companion_calls"]
    table = records.groupby(KEYS, dropna=False, sort=False)[sums].sum().reset_index()
    table["tokens_per_s"] = table["tokens"] / table["wall_s"]
    table["modelled_tokens_per_s"] = table["tokens"] / table["modelled_s"]
    table["x_target"] = _over(table, table["family"] == "target", "modelled_tokens_per_s")
    table["x_best_fixed_k"] = _over(table, (table["family"] == "fixed") & (table["chosen_on"] != "grid"),
                                    "modelled_tokens_per_s")
    table["x_target_measured"] = _over(table, table["family"] == "target", "tokens_per_s")
    return table


def _over(table: pd.DataFrame, reference: pd.Series, column: str) -> pd.Series:
    """``column`` of each row over ``column`` of the ``reference`` row of the same set, rule and batch size."""
    keys = ["set", "rule", "batch"]
    values = table[reference].set_index(keys)[column]
    return table[column] / values.reindex(pd.MultiIndex.from_frame(table[keys])).to_numpy()


@dataclass(frozen=True)
class BatchAxisDescription:
    """Metadata of the batch axis: sizes, prompts, rules, the measured costs (and where they were stored) and what
    the figures mean."""

    batch_sizes: list[int]  # evaluate.batch_axis.sizes
    prompts_per_set: int  # evaluate.batch_axis.prompts
    rules: list[str]  # the rules decoded at every batch size
    batch_costs: BatchCosts  # the prices the modelled throughput is at, measured on this machine
    batch_costs_source: CostsSource  # where they are stored, and whether this run measured them
    threads_per_process: int | None  # decoding.threads (None: torch's default)
    measured: str = ("generated tokens / wall seconds of the batched generates (each worker process with "
                     "decoding.threads torch threads; prompts included)")
    modelled: str = "generated tokens / seconds of the batch's forwards priced at batch_costs (prompts left out)"
    selection: str = ("fixed K per batch size by modelled throughput on dev; confidence tau and head h from the "
                      "main evaluation's dev selection; goodput head and SV at the measured batch costs")


def describe(job: EvaluateJob, costs: BatchCosts, rules: list[str], threads: int | None,
             source: CostsSource) -> BatchAxisDescription:
    """The batch axis's metadata (:class:`BatchAxisDescription`)."""
    axis = job.evaluate.batch_axis
    return BatchAxisDescription(list(axis.sizes), axis.prompts, rules, costs, source, threads)
