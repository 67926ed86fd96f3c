"""``python -m benchmarks.collection``: collection throughput vs plain batched ``target.generate``, and
labelling given responses vs generating them in the job.

Every pipeline gets the same prompts, batch size, sampling transform and token budget; the figure
is labelled positions (response tokens) per second, wall clock. In-job collection runs the target's
decode loop and then the draft and companion over every response and computes every label column
(goal ≥ 0.8× plain generation); labelling from responses (``data_gen.collect responses=PATH``)
labels the responses that collection produced, the target teacher-forced in one forward per
batch (goal ≥ 5× in-job collection). Prints figures; it is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch
from rich.console import Console
from rich.table import Table

from ahconf.entry import quiet_library_output
from ahconf.schema import CollectJob, Config, ModelSpec
from data_gen.collect import Labeller, batches_of
from data_gen.prompts import load_prompts
from data_gen.responses import GivenResponse
from decode.loops.prompt_input import left_pad, pad_id
from decode.threads import torch_threads
from runtime.encoding import EncodedPrompt, encode_prompts
from runtime.models import Trio, load_trio

PIPELINES = ("target.generate (plain, no labels)", "data_gen.collect (generate + label)",
             "data_gen.collect responses= (label)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.collection", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="zoo:target", help="hub id, local dir or zoo:<role> (default: zoo:target)")
    parser.add_argument("--draft", default="zoo:draft")
    parser.add_argument("--companion", default="zoo:companion", help="'none' to collect without a companion")
    parser.add_argument("--prompts", type=int, default=64, help="number of built-in train prompts")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=3, help="passes of the three pipelines, taking turns")
    return parser


def _plain_generate(trio: Trio, batches: list[list[list[int]]], max_new_tokens: int) -> tuple[int, float]:
    """Response tokens and seconds of plain batched sampling with ``generate`` (left padding, KV cache)."""
    tokenizer = trio.tokenizer
    pad = pad_id(tokenizer.pad_token_id, tokenizer.eos_token_id)
    tokens, started = 0, time.perf_counter()
    for prompts in batches:
        ids, mask = left_pad(prompts, pad, trio.target.device)
        out = trio.target.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad,
        )
        response = out[:, ids.shape[1]:]
        tokens += int((response != pad).sum())
    return tokens, time.perf_counter() - started


def _collection(labeller: Labeller, batches: list[list[EncodedPrompt]], job: CollectJob
                ) -> tuple[list[dict], float]:
    """In-job collection: rows and seconds."""
    rows, started = [], time.perf_counter()
    for batch in batches:
        rows.extend(labeller.generate(batch, job.collect.max_new_tokens))
    return rows, time.perf_counter() - started


def _labelling(labeller: Labeller, given: list[GivenResponse], batch_size: int) -> tuple[int, float]:
    """Labelling given responses, batched as ``data_gen.collect responses=`` batches a shard: positions and seconds."""
    positions, started = 0, time.perf_counter()
    for batch in batches_of(given, batch_size, by_length=True):
        positions += sum(len(r["response_ids"]) for r in labeller.given([given[i] for i in batch]))
    return positions, time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    quiet_library_output()
    torch_threads(args.threads or None)
    config = Config()
    companion = None if args.companion == "none" else ModelSpec(id=args.companion)
    config.models = replace(config.models, target=ModelSpec(id=args.target), draft=ModelSpec(id=args.draft),
                            companion=companion)
    config.collect = replace(config.collect, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    trio = load_trio(config.models, config.paths.zoo_dir)
    prompts = load_prompts("builtin", "train", size=args.prompts, style="function", seed=0)
    encoded, _ = encode_prompts(prompts, trio.tokenizer, "raw", args.max_prompt_tokens, "left")
    batches = [encoded[i : i + args.batch_size] for i in range(0, len(encoded), args.batch_size)]
    _plain_generate(trio, [[p.token_ids for p in batches[0]]], 8)  # warm-up
    job = config.collect_job()
    labeller = Labeller.for_job(trio, job)
    rates: dict[str, list[float]] = {name: [] for name in PIPELINES}
    positions: dict[str, int] = {}
    for _ in range(args.repeats):  # the pipelines take turns, so a slow spell of the machine hits all three
        positions[PIPELINES[0]], seconds = _plain_generate(trio, [[p.token_ids for p in b] for b in batches],
                                                           args.max_new_tokens)
        rates[PIPELINES[0]].append(positions[PIPELINES[0]] / seconds)
        rows, seconds = _collection(labeller, batches, job)
        positions[PIPELINES[1]] = sum(len(r["response_ids"]) for r in rows)
        rates[PIPELINES[1]].append(positions[PIPELINES[1]] / seconds)
        given = [GivenResponse(r["prompt_id"], r["prompt_ids"], r["response_ids"]) for r in rows]
        positions[PIPELINES[2]], seconds = _labelling(labeller, given, args.batch_size)
        rates[PIPELINES[2]].append(positions[PIPELINES[2]] / seconds)
    table = Table(title=f"collection throughput — {len(encoded)} prompts, batch {args.batch_size}, "
                        f"{args.max_new_tokens} new tokens, {torch.get_num_threads()} threads, {args.repeats} passes")
    for name in ("pipeline", "positions", "positions/s (median)", "range"):
        table.add_column(name, justify="right")
    for name in PIPELINES:
        table.add_row(name, str(positions[name]), f"{statistics.median(rates[name]):.0f}",
                      f"{min(rates[name]):.0f}–{max(rates[name]):.0f}")
    Console().print(table)
    _ratio("collection / plain generation", rates[PIPELINES[1]], rates[PIPELINES[0]], 0.8)
    _ratio("labelling from responses / collection", rates[PIPELINES[2]], rates[PIPELINES[1]], 5)


def _ratio(name: str, ours: list[float], theirs: list[float], goal: float) -> None:
    """The median of the passes' throughput ratios, and their range."""
    ratios = [a / b for a, b in zip(ours, theirs)]
    print(f"{name} throughput ratio: {statistics.median(ratios):.2f} (passes {min(ratios):.2f}–{max(ratios):.2f}; "
          f"goal ≥ {goal})")

if __name__ == "__main__":
    main()
