"""Label the test and out-of-distribution prompts' responses, measure each rule's structure, print and write it."""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from accept_heads.measure.inputs import PromptSet, load_ood, load_split
from accept_heads.structure.measures import Structure, structure
from accept_heads.structure.rounds import round_candidates
from ahconf.rule_config import build_rule
from ahconf.schema import StructureJob
from data_gen.collect import Labeller
from data_gen.shards import write_json_atomic
from decode.artifacts.version import code_version
from decode.drafts import drafter_of
from decode.rules import Rule
from decode.sampling import Sampling
from runtime.models import Trio, load_trio

#: The file the measurements go to, under ``paths.run_dir``.
OUT_FILE = "structure/structure.json"


def prompt_sets(job: StructureJob, trio: Trio) -> list[PromptSet]:
    """The test split and every out-of-distribution set, as many prompts each as the collection's test split."""
    count = job.prompts.sizes.get("test", job.decoding.prompts["test"])
    budget = replace(job.decoding, max_new_tokens=job.collect.max_new_tokens)
    context = trio.target.config.max_position_embeddings
    test = load_split(job.prompts, budget, job.seed, trio.tokenizer, context, "test", count)
    return [test, *load_ood(job.prompts, budget, job.seed, trio.tokenizer, context, count)]


def labelled(job: StructureJob, trio: Trio, sampling: Sampling, rules: list[Rule], prompts: PromptSet,
             depths: int) -> list[dict]:
    """The target's responses to ``prompts`` under ``sampling``, labelled for ``rules`` as collection labels them."""
    labeller = Labeller(trio, sampling, {rule.label_column: rule for rule in rules if rule.labelled()}, [], job.seed,
                        depths)
    rows = []
    batches = range(0, len(prompts.prompts), job.collect.batch_size)
    for start in tqdm(batches, desc=f"label {prompts.name} ({'greedy' if sampling.greedy else 'sampled'})",
                      unit="batch", dynamic_ncols=True):
        rows += labeller.generate(prompts.prompts[start : start + job.collect.batch_size], job.collect.max_new_tokens)
    return rows


def measure_structure(job: StructureJob) -> list[Structure]:
    """Every configured rule's structure on every set: the rules whose transform is greedy along the target's greedy
    responses, the others along its sampled ones (as ``make demo`` and ``make real`` collect them)."""
    trio = load_trio(job.models, job.paths.zoo_dir, verify=job.decoding.verify)
    sampling = Sampling(**asdict(job.sampling))
    rules = [build_rule(name, job.rules) for name in (job.structure.rules or job.rules.names)]
    depths = job.collect.depths
    labelled_depths = drafter_of(trio.draft).labelled_depths(depths)
    results = []
    for prompts in prompt_sets(job, trio):
        for greedy in sorted({rule.transform(sampling).greedy for rule in rules}):
            group = [rule for rule in rules if rule.transform(sampling).greedy == greedy]
            responses = Sampling(temperature=0.0) if greedy and not sampling.greedy else sampling
            rows = labelled(job, trio, responses, group, prompts, labelled_depths)
            for rule in group:
                candidates = round_candidates(rows, rule.label_column, depths, job.seed, rule.labels_from)
                results.append(structure(candidates, rule.name, prompts.name, job.seed))
    return results


def print_structure(results: list[Structure]) -> None:
    """The two tables: acceptance by depth, and what each variable adds beyond the draft's top probability."""
    console = Console(width=160)
    depths = max(len(r.depths) for r in results)
    by_depth = Table(title="acceptance by depth of the round, over every round started along the responses: "
                           "conditional (given the earlier depths accepted) [95% bootstrap CI over prompts] and "
                           "unconditional", title_justify="left")
    for column in ("rule", "set", "", *(f"d{d}" for d in range(1, depths + 1))):
        by_depth.add_column(column, justify="left" if column in ("rule", "set", "") else "right")
    for r in results:
        by_depth.add_row(r.rule, r.set, "conditional",
                         *(f"{d.conditional:.3f} [{d.low:.3f}, {d.high:.3f}]" for d in r.depths))
        by_depth.add_row("", "", "unconditional", *(f"{d.unconditional:.3f}" for d in r.depths))
    console.print(by_depth)
    gains = Table(title="what each variable tells about a reached candidate's verdict beyond the draft's top "
                        "probability: I(A; Z | X) in bits, shuffle-corrected [95% half-sample interval over prompts], its "
                        "share of H(A | X), and the share accepted in each of its bins", title_justify="left")
    for column in ("rule", "set", "variable Z", "bits", "% of H(A|X)", "accepted by bin"):
        gains.add_column(column, justify="right" if column in ("bits", "% of H(A|X)") else "left")
    for r in results:
        gains.add_row(r.rule, r.set, f"draft's top probability X alone: I(A; X) of H(A) = {r.h_a:.3f}",
                      f"{r.top_prob_gain:.4f}", f"{100 * r.top_prob_gain / r.h_a:.1f}" if r.h_a else "—", "")
        for g in r.gains:
            bins = "  ".join(f"{label}: {share:.2f}" for label, share in zip(g.bins, g.acceptance, strict=True)
                             if not math.isnan(share))  # a bin no candidate falls in (positions past the responses)
            gains.add_row("", "", g.variable, f"{g.gain:.4f} [{g.low:.4f}, {g.high:.4f}]", f"{100 * g.fraction:.1f}",
                          bins)
    console.print(gains)


def run_structure(job: StructureJob) -> Path:
    """Measure, print, and write ``structure.json`` (atomically) under ``paths.run_dir``."""
    results = measure_structure(job)
    print_structure(results)
    path = Path(job.paths.run_dir) / OUT_FILE
    write_json_atomic(path, {"code_version": code_version(), "models": asdict(job.models),
                             "sampling": asdict(job.sampling), "seed": job.seed, "depths": job.collect.depths,
                             "max_new_tokens": job.collect.max_new_tokens,
                             "results": [asdict(r) for r in results]})
    print(f"structure: {path}")
    return path
