"""``python -m accept_heads.evaluate [+exp=NAME] [overrides]``: every length policy × rule × prompt set.

Decodes the dev, test and out-of-distribution (``prompts.ood``) prompt sets with ``Fixed(K)``,
``Heuristic``, ``Confidence(τ)``, every exported head (under ``paths.head_dir``) over the ``h`` grid,
the SV profile and the greedy oracle, for each rule of ``evaluate.rules`` (default ``rules.names``),
 plus the sweep of each rule's swept parameter (FSD's threshold T), Speculative Ensemble and HF assisted
generation. K, τ, h, SE's γ and then (at the rule's chosen K) a rule's swept parameter are chosen on dev and applied
to test / OOD; each head's ``h`` is recorded beside it with its dev runs (:mod:`accept_heads.evaluation.h_choice`:
what ``decode.load_head`` serves it at, and a later evaluation with the same key reuses). Every run is costed with two
cost models
(:mod:`accept_heads.measure.cost_models`): ``cost`` (``cost.source``: the configured pair, by default the paper's,
or this machine's measured cost profile) and ``t_d``, ``t_c``, ``t_t`` fitted on the measured calls with the target's
latency shape measured at the start. Writes the table, metadata and figures under
``evaluate.out_dir`` (see
:mod:`accept_heads.evaluation.results`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from accept_heads.evaluation import batch_axis, wallclock
from accept_heads.evaluation.baselines import describe_hf
from accept_heads.evaluation.batch_axis import BatchRun
from accept_heads.evaluation.evaluation_plan import plan_evaluation
from accept_heads.evaluation.executor import Executor, WorkerPool
from accept_heads.evaluation.figures import draw_all
from accept_heads.evaluation.h_choice import in_spec_order, record_choices, recorded_runs
from accept_heads.evaluation.intervals import add_intervals
from accept_heads.evaluation.metadata import EvaluationMetadata
from accept_heads.evaluation.plan import (
    Choice,
    after_selection,
    climb,
    dev_sweeps,
    edge_note,
    edge_rules,
    extended_k,
    fixed_grid,
    fixed_specs,
    rule_sweep,
    swept_rules,
    unmatched,
)
from accept_heads.evaluation.reliability import head_predictions
from accept_heads.evaluation.report import print_report
from accept_heads.evaluation.results import Results, save_results
from accept_heads.evaluation.source_calibration import source_calibration
from accept_heads.evaluation.table import (
    add_comparisons,
    mark_dev_choices,
    select,
    select_rule_param,
    sort_rows,
)
from accept_heads.measure.cost_models import CostFit, Latency, Pricing, fit_costs, measure_latency, pricing
from accept_heads.measure.costing import add_costs, aggregate, costed, verification_units
from accept_heads.measure.families import families, family_names
from accept_heads.measure.inputs import Artifacts, PromptSet
from accept_heads.measure.machine_costs import machine_batch_costs
from accept_heads.measure.runs import Record, RunSpec, frame
from ahconf.entry import CONF_DIR, run_entry
from ahconf.rule_config import build_rule
from ahconf.schema import ConfigError, EvaluateJob
from data_gen.prompts import check_prompt_choices
from decode.artifacts.version import code_version
from decode.costs import CostModel
from decode.drafts import drafter_of
from decode.head import AcceptanceHead
from decode.threads import torch_threads
from runtime.models import Trio


def execute(specs: Sequence[RunSpec | BatchRun], pool: WorkerPool, description: str,
            method: str = "run") -> list[Record]:
    """Decode every run with the executor's ``method`` (a progress bar over runs); its records, in spec order."""
    done: dict[int, Sequence[Record]] = {}
    with tqdm(total=len(specs), desc=description, unit="run", dynamic_ncols=True) as bar:
        for index, run_records in pool.completed(specs, method):
            spec = specs[index]
            bar.set_postfix_str(f"{spec.set} {spec.rule} {spec.label}", refresh=False)
            bar.update()
            done[index] = run_records
    return [record for index in range(len(specs)) for record in done[index]]


def head_data_dir(head: AcceptanceHead, run_dir: str, default: str) -> str:
    """The collected data a head was trained on (its dev split feeds its reliability diagram; recorded relative to the
    run directory ``run_dir``), else ``default``."""
    data = head.metadata.training_data
    if data is None or not (Path(run_dir) / data.data_dir).is_dir():
        return default
    return str(Path(run_dir) / data.data_dir)


def calibration_frame(job: EvaluateJob, artifacts: Artifacts, trio: Trio, notes: dict[str, str]) -> pd.DataFrame:
    """Every head's dev predictions vs labels (empty when there is no head, no data or ``calibration_rows=0``)."""
    frames = []
    rows = job.evaluate.calibration_rows
    for name, head in artifacts.heads.items() if rows else ():
        try:
            frame = head_predictions(head, trio, head_data_dir(head, job.paths.run_dir, job.paths.data_dir), rows,
                                     job.head.mixing_r, job.seed)
        except (FileNotFoundError, ConfigError) as error:
            notes[f"calibration[{name}]"] = f"no reliability diagram for head[{name}]: {error}"
            continue
        frames.append(frame.assign(head=name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"pred": [], "label": [], "head": []})


def dev_choices(records: list[Record], cost: CostModel) -> list[Choice]:
    """K, τ, h and γ chosen on the dev rows of ``records`` at ``cost``."""
    return select(costed(records, cost), "throughput_cost")


def cost_tuples(generations: pd.DataFrame) -> pd.DataFrame:
    """Per run, the generations whose wall time is counted model calls only: our decoder (companion runs
    included), decoded alone (a batch shares its wall time), no bound (its hindsight calls the target uncounted)."""
    alone = generations[(generations["source"] == "decode") & (generations["batch"] == 1)]
    table = aggregate(alone)
    return table[~table["family"].isin(family_names(bound=True)) & (table["generated"] > 0)]


def results_table(generations: pd.DataFrame, cost: CostModel, latency: Latency,
                  seed: int) -> tuple[pd.DataFrame, CostFit]:
    """One row per run, costed with ``cost`` and with the model fitted on the wall time of the
    generations decoded alone; comparisons with their 95 % paired-bootstrap interval over prompts (draws
    seeded by ``seed``)."""
    table = aggregate(generations)
    tuples = cost_tuples(generations)
    fit = fit_costs(tuples["draft_calls"], tuples["companion_calls"], verification_units(tuples, latency.shape),
                    tuples["wall_s"])
    for name, model in (("cost", cost), ("fitted", fit.model(latency.shape, latency.alone_ratio))):
        add_costs(table, name, model)
        add_comparisons(table, name)
        add_intervals(table, generations, name, model, seed)
    return sort_rows(table), fit


def cost_models(priced: Pricing, fit: CostFit, latency: Latency) -> dict[str, Any]:
    """Metadata: the model behind each ``*_cost`` / ``*_fitted`` column, and what it assumes."""
    return {
        "cost": {**priced.record, "assumes": priced.assumes},
        "fitted": {**fit.model(latency.shape, latency.alone_ratio).to_dict(),
                   "assumes": "t_d, t_c, t_t fitted (cost_fit); latency_shape measured on this device at the start "
                   "(latency); the target alone at t_t x latency.alone_ratio (a one-token forward over a "
                   "verification forward, measured)"},
    }


def describe(job: EvaluateJob, trio: Trio, device: str, rules: list[str], sets: list[PromptSet],
             choices: list[Choice], priced: Pricing, fit: CostFit, latency: Latency, described: dict[str, Any],
             workers: int, notes: dict[str, str]) -> EvaluationMetadata:
    """Metadata of the run: models, sampling, rules, prompt sets and seeds, selection, costs, settings (``described``:
    the artifacts', by kind)."""
    return EvaluationMetadata(
        command="accept_heads.evaluate", exp_name=job.exp_name, code_version=code_version(),
        models=trio.description, device=device, torch_threads=torch.get_num_threads(),
        sampling=asdict(job.sampling), rules=asdict(job.rules), eval_rules=rules,
        rule_specs={rule: build_rule(rule, job.rules).spec() for rule in rules},
        seed=job.seed, seeding="each prompt decodes with seed sha256(f'{seed}/{prompt_id}') under every policy",
        max_new_tokens=job.decoding.max_new_tokens, sets=[s.describe() for s in sets],
        selection_set="dev", selection=[asdict(c) for c in choices],
        selection_criterion="max modelled throughput of the cost model on the dev prompts; ties: smaller value; "
                            "a rule's swept parameter (FSD T) at its chosen K; each head's h recorded beside it "
                            "(<head>.h_choice.json)",
        cost=asdict(job.cost), cost_models=cost_models(priced, fit, latency), cost_profile=priced.profile,
        cost_fit=fit.to_dict(),
        cost_fit_tuples="per run of our decoder, companion runs included, bounds excluded, over its generations "
                        "decoded alone (batch 1): (draft calls, companion calls, sum over rounds of "
                        "latency_shape(verified length), wall s)",
        batching=f"families {', '.join(family_names(rows_alone=True))} decode decoding.batch_size="
                 f"{job.decoding.batch_size} prompts per batched generate after the first decoding.timed_prompts="
                 f"{job.decoding.timed_prompts} (alone); rows decide as alone, so only wall-clock columns depend on it",
        latency=latency.to_dict(), hf=describe_hf(), decoding=asdict(job.decoding), evaluate=asdict(job.evaluate),
        dev_grids={name: f.dev_grid(job) for name, f in families().items() if f.tuned},
        heads=described["heads"], profiles=described["profiles"], workers=workers, notes=notes)


def decode_batch_axis(job: EvaluateJob, artifacts: Artifacts, sets: list[PromptSet], rules: list[str],
                      choices: list[Choice], pool: WorkerPool) -> list[Record]:
    """The batch axis: the fixed-K grid on dev at every batch size, then the test set's runs; a record per
    batched generate (:mod:`accept_heads.evaluation.batch_axis`)."""
    records = execute(batch_axis.dev_fixed_runs(job, rules), pool, "batch axis: dev fixed K", "run_batches")
    best_k = batch_axis.best_fixed_k(frame(records))
    runs = [run for s in sets if s.role == "test"
            for run in batch_axis.test_runs(job, artifacts, s.name, rules, choices, best_k)]
    return records + execute(runs, pool, "batch axis: test", "run_batches")


def evaluate(job: EvaluateJob) -> Results:
    """Run the whole evaluation, save the results and figures, print the report; returns the results.

    What it decodes is fixed by its plan (:mod:`~accept_heads.evaluation.evaluation_plan`); ``job`` is only read.
    """
    start = time.perf_counter()
    plan = plan_evaluation(job)
    d, e = job.decoding, job.evaluate
    torch_threads(d.threads)
    notes: dict[str, str] = {}
    executor = Executor.build(job, notes)
    trio, device, artifacts, sets = executor.trio, executor.device, executor.artifacts, list(executor.sets.values())
    plan = plan.loaded(device, drafter_of(trio.draft), notes)
    rules, axis_rules = list(plan.rules), list(plan.axis_rules)
    unused = unmatched(job.rules, artifacts, rules)
    if unused:
        notes["unmatched"] = f"not decoded, fitted for a rule that is not evaluated: {', '.join(unused)}"
    latency = measure_latency(trio, executor.sets["dev"].prompts[0].token_ids, e.latency.lengths, d.repeats)
    priced = pricing(job.cost, trio, lambda: latency.companion_ratio, compiled=d.compile, repeats=d.repeats,
                     threads=d.threads)
    batch_costs, costs_source = None, None
    if axis_rules:
        companion = trio.companion if artifacts.profiles else None
        batch_costs, costs_source = machine_batch_costs(
            trio.target, trio.draft, models=trio.description, batches=e.batch_axis.sizes,
            max_length=e.latency.lengths, repeats=d.repeats, companion=companion,
            refresh=e.batch_axis.costs_refresh)
    executor = executor.priced(priced.model, batch_costs)

    with WorkerPool(executor, plan.workers) as pool:
        sweep = dev_sweeps(plan.job, artifacts, rules)
        records, choices, specs = [], [], []
        # K, τ, h and γ here, T below: dev rows only
        while wanted := [spec for spec in climb(sweep, choices, e.dev_search) if spec not in specs]:
            reused = recorded_runs(wanted, artifacts, executor.decoding, executor.sets["dev"], priced.record, notes)
            decoded = execute([spec for spec in wanted if spec not in reused], pool,
                              "dev sweeps" if not specs else "dev sweeps: the climb on")
            records += in_spec_order(wanted, reused, decoded)
            specs += wanted
            choices = dev_choices(records, priced.model)
        decoded_dev = set(specs)
        specs = [spec for spec in sweep if spec in decoded_dev]
        while (edge := edge_rules(choices, fixed_grid(plan.job))) and (more := extended_k(fixed_grid(plan.job))):
            records += execute([s for rule in edge for s in fixed_specs(job.rules, "dev", rule, more)], pool,
                               f"dev fixed K {more} ({', '.join(edge)} at the grid's edge)")
            plan = plan.with_fixed_grid(fixed_grid(plan.job) + more)
            choices = dev_choices(records, priced.model)
        if note := edge_note(choices, fixed_grid(plan.job)):
            notes["fixed_k_edge"] = note
        record_choices(specs, records, choices, artifacts, executor.decoding, executor.sets["dev"], priced.model,
                       priced.record)
        if swept := swept_rules(rules):
            records += execute([s for rule in swept for s in rule_sweep(plan.job, "dev", rule, choices)], pool,
                               f"dev sweep of {', '.join(swept)}'s parameter")
            costs = costed(records, priced.model)
            choices += [c for rule in swept for c in select_rule_param(costs, "throughput_cost", rule, choices)]
        applied = after_selection(plan.job, artifacts, sets, rules, choices)
        records += execute(applied, pool, "test / OOD")
        batch_records = decode_batch_axis(plan.job, artifacts, sets, axis_rules, choices, pool) if axis_rules else []

    generations = mark_dev_choices(frame(records), choices)
    timings, wall = wallclock.measure(executor, applied, generations) if e.wallclock.sets else ([], pd.DataFrame())
    table, fit = results_table(generations, priced.model, latency, job.seed)
    calibration = calibration_frame(job, artifacts, trio, notes)
    metadata = describe(plan.job, trio, device, rules, sets, choices, priced, fit, latency, executor.described,
                        plan.workers, notes)
    if axis_rules:
        metadata = replace(metadata, batch_axis=batch_axis.describe(plan.job, batch_costs, axis_rules, d.threads,
                                                                    costs_source))
    if timings:
        wall = wallclock.with_modelled(wall, table)
        metadata = replace(metadata, wallclock=wallclock.describe(executor))
    results = Results(Path(e.out_dir), table, generations, calibration, metadata,
                      batch_axis.summarise(frame(batch_records)) if batch_records else pd.DataFrame(),
                      wall, pd.DataFrame([asdict(t) for t in timings]), source_calibration(generations))
    figures = draw_all(results) if e.figures else {}
    results = replace(results, metadata=replace(metadata, seconds=time.perf_counter() - start))
    files = save_results(results)
    print_report(results.table, results.metadata, files, figures, results.batch_axis, results.wallclock,
                 results.source_calibration)
    return results


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_entry(cfg, "accept_heads.evaluate", lambda config: evaluate(config.evaluate_job()), check_prompt_choices)


if __name__ == "__main__":
    main()
