"""Trying the levers on each head: decode dev with every variant and both stops, compare with the head as exported."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from accept_heads.levers.fitting import fit, retrain
from accept_heads.levers.lever_policies import (
    FEATURES,
    FORECASTS,
    LEVERS,
    Forecaster,
    LeverPolicy,
    PerfectPreDraft,
    Recalibration,
)
from accept_heads.measure.bootstrap import PromptCosts, generation_seconds, paired_draws, ratio_interval
from accept_heads.measure.cost_models import Pricing, pricing
from accept_heads.measure.families import HEAD_THRESHOLD, family
from accept_heads.measure.inputs import PromptSet, discover, load_split
from accept_heads.measure.runs import Generation
from accept_heads.measure.selection import best_value
from accept_heads.measure.source_prices import deployable_sources, measure_source_prices, request_rounds
from ahconf.schema import EvaluateJob
from data_gen.shards import write_json_atomic
from decode import SpeculativeDecoder
from decode.artifacts.version import code_version
from decode.costs import CostModel
from decode.head import AcceptanceHead
from decode.policies.base import Policy
from decode.policies.stops import Goodput, StopRule, Threshold
from decode.sampling import Sampling
from decode.threads import torch_threads
from runtime.models import Trio, load_trio
from runtime.seeding import prompt_seed


@dataclass(frozen=True)
class Variant:
    """A head with one lever (``lever=None``: the head as exported): a ``recalibration`` of its estimate, a
    retrained ``model`` in its place, or a ``forecaster`` of the next candidate's acceptance."""

    head: str
    lever: str | None
    recalibration: Recalibration | None = None
    model: AcceptanceHead | None = None
    forecaster: Forecaster | None = None
    perfect: bool = False  # the pre-draft stops on the truth: a reference, never kept

    @property
    def name(self) -> str:
        return self.lever or "as exported"


@dataclass
class LeverBench:
    """What every decode here needs: the models, the ``cost`` model, the run's sampling and settings."""

    job: EvaluateJob
    trio: Trio
    sampling: Sampling
    priced: Pricing

    @property
    def cost(self) -> CostModel:
        """The prices every decode here is modelled at."""
        return self.priced.model

    def policy(self, head: AcceptanceHead, stop: str, threshold: float, recalibration: Recalibration | None,
               log: list | None = None, forecaster: Forecaster | None = None, perfect: bool = False) -> Policy:
        k_min, k_max = head.metadata.k_range(self.job.head.k_min, self.job.head.k_max)
        rule: StopRule = (Goodput(self.cost, k_min, k_max, companion=bool(head.config.companion_features))
                          if stop == "goodput" else Threshold(threshold, k_min, k_max))
        if perfect:
            return PerfectPreDraft(head, rule)
        return LeverPolicy(head, rule, recalibration, log, forecaster)

    def decode(self, head: AcceptanceHead, policy: Policy, prompts: PromptSet) -> PromptCosts:
        """Every prompt of ``prompts`` with ``policy`` (per-prompt seeds as the evaluation's): modelled seconds."""
        decoder = SpeculativeDecoder(self.trio.target, self.trio.draft, rule=head.metadata.build_rule(),
                                     policy=policy, companion=self.trio.companion if policy.companion else None,
                                     sampling=self.sampling)
        generations = []
        for prompt in prompts.prompts:
            seed = prompt_seed(self.job.seed, prompt.prompt_id)
            out = decoder.generate(prompt.token_ids, max_new_tokens=self.job.decoding.max_new_tokens, seed=seed)
            generations.append(asdict(Generation.of(prompt.prompt_id, seed, out.stats, out.sequences,
                                                    len(prompt.token_ids))))
        frame = pd.DataFrame(generations)
        return PromptCosts(tuple(frame["prompt_id"]), frame["generated"].to_numpy(float),
                           np.asarray(generation_seconds(frame, self.cost), dtype=float))


def throughput(run: PromptCosts) -> float:
    return float(run.generated.sum() / run.seconds.sum())


def measure(lab: LeverBench, head: AcceptanceHead, variant: Variant, dev: PromptSet,
            thresholds: list[float]) -> dict[str, tuple[float | None, PromptCosts]]:
    """The variant's dev runs: the threshold stop at its best ``h`` on dev, and the goodput stop."""
    head, lever = variant.model or head, (variant.recalibration, None, variant.forecaster, variant.perfect)
    runs = {h: lab.decode(head, lab.policy(head, "threshold", h, *lever), dev) for h in thresholds}
    best = best_value(list(runs), [throughput(r) for r in runs.values()])
    goodput = lab.decode(head, lab.policy(head, "goodput", 1.0, *lever), dev)
    return {"threshold": (best, runs[best]), "goodput": (None, goodput)}


def lever_rows(job: EvaluateJob) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Fit every lever on each head's train-split rounds and measure it on dev; the table and the fits."""
    notes: dict[str, str] = {}
    trio = load_trio(job.models, job.paths.zoo_dir, verify=job.decoding.verify)
    sampling = Sampling(**asdict(job.sampling))
    artifacts = discover(job.paths.head_dir, trio, sampling, notes, job.decoding.verify)
    context = trio.target.config.max_position_embeddings
    d = job.decoding
    dev = load_split(job.prompts, d, job.seed, trio.tokenizer, context, "dev", d.prompts["dev"])
    train = load_split(job.prompts, d, job.seed, trio.tokenizer, context, "train", d.prompts["dev"])  # as many
    with torch_threads(d.threads):
        sources = measure_source_prices(deployable_sources(artifacts.heads), trio.draft.config.vocab_size, sampling,
                                        rounds=request_rounds(d.max_new_tokens))
    lab = LeverBench(job, trio, sampling, pricing(job.cost, trio, lambda: None, compiled=d.compile,
                                                  repeats=d.repeats, threads=d.threads, sources=sources))
    thresholds = family(HEAD_THRESHOLD).dev_grid(job)  # the heads' h grid in the evaluation
    rows, fits = [], {}
    heads = {n: h for n, h in artifacts.heads.items() if not h.config.companion_features}
    tried = job.evaluate.levers
    with tqdm(total=len(heads) * (1 + len(tried)), desc="levers", unit="variant", dynamic_ncols=True) as bar:
        for name, head in heads.items():
            log: list = []
            chosen = head.threshold  # by the evaluation (None: not evaluated yet)
            lab.decode(head, lab.policy(head, "threshold", 0.5 if chosen is None else chosen, None, log), train)
            linear = {lever: fit(lever, log) for lever in LEVERS if lever in tried}
            fits[name] = {"rounds_candidates": len(log),
                          "with_next_candidate": sum(v.next_accept is not None for v in log),
                          **{lever: dict(zip(FEATURES, r.weights)) for lever, r in linear.items()}}
            variants = [Variant(name, None)] + [
                Variant(name, lever, forecaster=r) if lever in FORECASTS else Variant(name, lever, recalibration=r)
                for lever, r in linear.items()]
            if "retrained" in tried:
                retrained, fits[name]["retrained"] = retrain(head, log, job.seed)
                variants.append(Variant(name, "retrained", model=retrained))
            if "pre-draft" in tried:
                forecaster, fits[name]["pre-draft"] = retrain(head, log, job.seed, lever="pre-draft")
                variants.append(Variant(name, "pre-draft", forecaster=forecaster))
            if "perfect-pre-draft" in tried:
                variants.append(Variant(name, "perfect-pre-draft", perfect=True))
            measured = {}
            for variant in variants:
                bar.set_postfix_str(f"{name} {variant.name}", refresh=False)
                measured[variant.name] = measure(lab, head, variant, dev, thresholds)
                bar.update()
            draws = paired_draws(len(dev.prompts), job.seed)
            for variant in variants:
                for stop, (h, run) in measured[variant.name].items():
                    base_h, base = measured["as exported"][stop]
                    low, high = ratio_interval(run, base, draws)
                    rows.append({"head": name, "lever": variant.name, "stop": stop, "h": h, "base_h": base_h,
                                 "dev_throughput": throughput(run), "effect": throughput(run) / throughput(base),
                                 "effect_lo": low, "effect_hi": high,
                                 "kept": bool(variant.lever) and not variant.perfect and low > 1.0})
    return pd.DataFrame(rows), {"fits": fits, "notes": notes, "cost_model": lab.priced.record}


def print_levers(table: pd.DataFrame, caption: str) -> None:
    out = Table(title=f"levers on dev — throughput at {caption} over the head as exported [95% paired-bootstrap "
                      "CI over dev prompts]; kept only if the interval is above 1", title_justify="left")
    for column in ("head", "lever", "stop", "h (dev)", "dev tok / modelled s", "effect [95% CI]", "kept"):
        out.add_column(column, justify="left" if column in ("head", "lever", "stop") else "right")
    for _, row in table.iterrows():
        h = "—" if pd.isna(row["h"]) else f"{row['h']:g}"
        out.add_row(row["head"], row["lever"], row["stop"], h, f"{row['dev_throughput']:.2f}",
                    f"{row['effect']:.3f}× [{row['effect_lo']:.3f}, {row['effect_hi']:.3f}]",
                    "reference" if row["lever"] == "perfect-pre-draft" else "yes" if row["kept"] else "no")
    Console(width=160).print(out)


def run_levers(job: EvaluateJob) -> pd.DataFrame:
    """Fit, measure, write and print the lever table."""
    table, described = lever_rows(job)
    out = Path(job.evaluate.out_dir) / "levers"
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "levers.csv.partial"
    table.to_csv(partial, index=False)
    partial.replace(out / "levers.csv")
    dev = job.decoding.prompts["dev"]
    write_json_atomic(out / "levers.json", {"command": "accept_heads.levers", "code_version": code_version(),
                                            "fit_prompts (train split)": dev, "dev_prompts": dev,
                                            "cost": asdict(job.cost), "seed": job.seed, **described})
    print_levers(table, described["cost_model"]["caption"])
    print(f"levers: {out / 'levers.csv'}, {out / 'levers.json'}")
    return table
