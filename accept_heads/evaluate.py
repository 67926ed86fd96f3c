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
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path

import hydra
import pandas as pd
import torch
from omegaconf import DictConfig

from accept_heads.evaluation import batch_axis, wallclock
from accept_heads.evaluation.baselines import describe_hf
from accept_heads.evaluation.evaluation_plan import EvaluationPlan, plan_evaluation
from accept_heads.evaluation.executor import Executor, WorkerPool
from accept_heads.evaluation.figures import draw_all
from accept_heads.evaluation.h_choice import recorded_runs
from accept_heads.evaluation.intervals import add_intervals
from accept_heads.evaluation.metadata import EvaluationMetadata
from accept_heads.evaluation.plan import unmatched
from accept_heads.evaluation.reliability import head_predictions
from accept_heads.evaluation.report import print_report
from accept_heads.evaluation.results import Results, retire_results, save_results
from accept_heads.evaluation.source_calibration import source_calibration
from accept_heads.evaluation.steps import Progress, evaluation_steps, run_steps
from accept_heads.evaluation.table import add_comparisons, mark_dev_choices, sort_rows
from accept_heads.measure.cost_models import (
    CostFit,
    Latency,
    Pricing,
    fit_costs,
    fitted_pricing,
    measure_latency,
    pricing,
)
from accept_heads.measure.costing import add_costs, aggregate, run_source_seconds, verification_units
from accept_heads.measure.families import family_names
from accept_heads.measure.inputs import Artifacts, PromptSet
from accept_heads.measure.machine_costs import machine_batch_costs
from accept_heads.measure.runs import RunSpec, frame
from accept_heads.measure.source_prices import deployable_sources, measure_source_prices, request_rounds
from ahconf.entry import CONF_DIR, run_entry
from ahconf.rule_config import build_rule
from ahconf.schema import ConfigError, EvaluateJob
from data_gen.prompts import check_prompt_choices
from decode.artifacts.version import code_version
from decode.costs import CostModel, SourcePrice
from decode.drafts import drafter_of
from decode.head import AcceptanceHead
from decode.threads import torch_threads
from runtime.models import Trio


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


def cost_tuples(generations: pd.DataFrame) -> pd.DataFrame:
    """Per run, the generations whose wall time is counted model calls only: our decoder (companion runs
    included), decoded alone (a batch shares its wall time), no bound (its hindsight calls the target uncounted)."""
    alone = generations[(generations["source"] == "decode") & (generations["batch"] == 1)]
    table = aggregate(alone)
    return table[~table["family"].isin(family_names(bound=True)) & (table["generated"] > 0)]


def results_table(generations: pd.DataFrame, cost: CostModel, latency: Latency, seed: int,
                  sources: Mapping[str, SourcePrice]) -> tuple[pd.DataFrame, CostFit]:
    """One row per run, costed with ``cost`` and with the model fitted on the wall time of the generations decoded
    alone less their acceptance sources' seconds at the ``sources`` prices measured here (which the fitted model
    charges); comparisons with their 95 % paired-bootstrap interval over prompts (draws seeded by ``seed``)."""
    table = aggregate(generations)
    tuples = cost_tuples(generations)
    fit = fit_costs(tuples["draft_calls"], tuples["companion_calls"], verification_units(tuples, latency.shape),
                    tuples["wall_s"] - run_source_seconds(tuples, sources))
    fitted = fitted_pricing(fit, latency, sources).model
    for name, model in (("cost", cost), ("fitted", fitted)):
        add_costs(table, name, model)
        add_comparisons(table, name)
        add_intervals(table, generations, name, model, seed)
    return sort_rows(table), fit


def describe(job: EvaluateJob, plan: EvaluationPlan, trio: Trio, device: str, sets: list[PromptSet], priced: Pricing,
             fit: CostFit, latency: Latency, sources: Mapping[str, SourcePrice], artifacts: Artifacts,
             notes: dict[str, str]) -> EvaluationMetadata:
    """Metadata of the run: models, sampling, rules, prompt sets and seeds, the plan's selection and grids, the cost
    models (``cost``: ``priced``; ``fitted``: ``fit``), settings, and the evaluated ``artifacts``."""
    rules = list(plan.rules)
    return EvaluationMetadata(
        command="accept_heads.evaluate", exp_name=job.exp_name, code_version=code_version(),
        models=trio.description, device=device, torch_threads=torch.get_num_threads(),
        sampling=job.sampling, rules=job.rules, eval_rules=rules,
        rule_specs={rule: build_rule(rule, job.rules).spec() for rule in rules},
        seed=job.seed, seeding="each prompt decodes with seed sha256(f'{seed}/{prompt_id}') under every policy",
        max_new_tokens=job.decoding.max_new_tokens, sets=[s.describe() for s in sets],
        selection_set="dev", selection=list(plan.choices),
        selection_criterion="max modelled throughput of the cost model on the dev prompts; ties: smaller value; "
                            "a rule's swept parameter (FSD T) at its chosen K; each head's h recorded beside it "
                            f"(<head>.h_choice.json); each grid searched by "
                            f"evaluate.dev_search={job.evaluate.dev_search}",
        cost=job.cost, cost_models={"cost": priced, "fitted": fitted_pricing(fit, latency, sources)}, cost_fit=fit,
        cost_fit_tuples="per run of our decoder, companion runs included, bounds excluded, over its generations "
                        "decoded alone (batch 1): (draft calls, companion calls, sum over rounds of "
                        "latency_shape(verified length), wall s)",
        batching=f"families {', '.join(family_names(rows_alone=True))} decode decoding.batch_size="
                 f"{job.decoding.batch_size} prompts per batched generate after the first decoding.timed_prompts="
                 f"{job.decoding.timed_prompts} (alone); rows decide as alone, so only wall-clock columns depend on it",
        latency=latency, hf=describe_hf(), decoding=job.decoding,
        evaluate=replace(job.evaluate, hf=replace(job.evaluate.hf, baselines=plan.hf_baselines)),
        dev_grids={name: list(grid) for name, grid in plan.grids.items()},
        heads=artifacts.head_records(), profiles=artifacts.profile_records(), workers=plan.workers, notes=notes)


def evaluate(job: EvaluateJob) -> Results:
    """Run the whole evaluation, save the results and figures, print the report; returns the results.

    Its steps (:mod:`~accept_heads.evaluation.steps`) decode over its plan
    (:mod:`~accept_heads.evaluation.evaluation_plan`), then the wall clock, the table, the metadata and the report;
    ``job`` is only read.
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
    with torch_threads(d.threads):
        sources = measure_source_prices(deployable_sources(artifacts.heads), trio.draft.config.vocab_size,
                                        executor.decoding.sampling, rounds=request_rounds(d.max_new_tokens))
    priced = pricing(job.cost, trio, lambda: latency.companion_ratio, compiled=d.compile, repeats=d.repeats,
                     threads=d.threads, sources=sources)
    batch_costs, costs_source = None, None
    if axis_rules:
        companion = trio.companion if artifacts.profiles else None
        batch_costs, costs_source = machine_batch_costs(
            trio.target, trio.draft, models=trio.description.to_dict(), batches=e.batch_axis.sizes,
            max_length=e.latency.lengths, repeats=d.repeats, companion=companion,
            refresh=e.batch_axis.costs_refresh)
    executor = executor.priced(priced.model, batch_costs)

    steps = evaluation_steps(job, plan, executor, priced.model, priced.record, notes)
    dev = executor.sets["dev"]

    def reuse(specs: list) -> dict:  # the dev rows a head's recorded threshold choice holds under the same key
        runs = [spec for spec in specs if isinstance(spec, RunSpec)]  # a batch-axis run is never recorded
        return recorded_runs(runs, artifacts, executor.decoding, dev, priced.record, notes)

    with WorkerPool(executor, plan.workers) as pool:
        done = run_steps(steps, Progress(plan), pool, reuse)
    plan, choices = done.plan, list(done.plan.choices)
    held_out = list(dict.fromkeys(r.run for r in done.records if r.run.set != dev.name))  # in decoding order
    records, batch_records = list(done.records), list(done.batch_records)

    generations = mark_dev_choices(frame(records), choices)
    timings, wall = wallclock.measure(executor, held_out, generations) if e.wallclock.sets else ([], pd.DataFrame())
    table, fit = results_table(generations, priced.model, latency, job.seed, sources)
    calibration = calibration_frame(job, artifacts, trio, notes)
    metadata = describe(job, plan, trio, device, sets, priced, fit, latency, sources, artifacts, notes)
    if axis_rules:
        metadata = replace(metadata, batch_axis=batch_axis.describe(job, batch_costs, axis_rules, d.threads,
                                                                    costs_source))
    if timings:
        wall = wallclock.with_modelled(wall, table)
        metadata = replace(metadata, wallclock=wallclock.describe(executor))
    results = Results(Path(e.out_dir), table, generations, calibration, metadata,
                      batch_axis.summarise(frame(batch_records)) if batch_records else pd.DataFrame(),
                      wall, pd.DataFrame([asdict(t) for t in timings]), source_calibration(generations))
    retire_results(e.out_dir)  # an earlier run's results stop looking complete before new figures land beside
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
