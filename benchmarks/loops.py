"""Batch 1 through either loop: ``generate(prompt)`` (the batch-1 loop) vs ``generate_batch([prompt])`` (the batched loop).

    python -m benchmarks.loops [--target PATH --draft PATH | --random-init {tiny,1b}] [--prompts 16]
                               [--max-new-tokens 128] [--k 5] [--repeats 3] [--threads 1]

Both loops decode each prompt to the same tokens (``tests/decode/test_batched.py``); this times them.
The two loops take turns on every prompt and repeat, and the table gives each loop's tokens per
second and the ratio of the batched loop's time to the batch-1 loop's per prompt (mean, with a 95 %
interval over prompts). Whether batch 1 may simply run the batched loop is this ratio.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch

from ahconf.entry import quiet_library_output
from benchmarks.decoding import RANDOM_PAIRS, batch_prompts, load_pair
from decode.loops.decoder import SpeculativeDecoder
from decode.policies import Fixed
from decode.rules import Speculative
from decode.sampling import Sampling


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loops", description=__doc__.split("\n\n")[0])
    models = parser.add_mutually_exclusive_group()
    models.add_argument("--target", help="target model (hub id or directory); default: the zoo's target")
    parser.add_argument("--draft", help="draft model (hub id or directory); default: the zoo's draft")
    models.add_argument("--random-init", choices=sorted(RANDOM_PAIRS), help="a seeded random-init pair (see benchmarks.decoding)")
    parser.add_argument("--k", type=int, default=5, help="Fixed(k) candidates per round (default 5)")
    parser.add_argument("--prompts", type=int, default=16, help="number of prompts (default 16)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per prompt (default 128)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the prompts (default 3)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser.parse_args(argv)


def timed(run: Callable[[], int], device: torch.device) -> tuple[float, int]:
    """Seconds and generated tokens of one call."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, tokens


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Time both loops and print the table; returns the figures."""
    args = parse_args(argv)
    quiet_library_output()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    target, draft, described = load_pair(args, device)
    prompts = batch_prompts(args.target, args.prompts, target.config.get_text_config().vocab_size, device)
    decoder = SpeculativeDecoder(target, draft, rule=Speculative(), policy=Fixed(args.k), sampling=Sampling(),
                                 eos_token_id=None)
    budget = args.max_new_tokens

    def one(prompt: torch.Tensor, seed: int) -> int:
        return decoder.generate(prompt, max_new_tokens=budget, seed=seed).stats.generated

    def batched(prompt: torch.Tensor, seed: int) -> int:
        return decoder.generate_batch([prompt], max_new_tokens=budget, seed=seed).totals.tokens

    one(prompts[0], 0), batched(prompts[0], 0)  # warm-up
    seconds = {"batch-1 loop": [0.0] * len(prompts), "batched loop": [0.0] * len(prompts)}
    tokens = {name: 0 for name in seconds}
    for repeat in range(args.repeats):
        for i, prompt in enumerate(prompts):
            order = [("batch-1 loop", one), ("batched loop", batched)]
            for name, run in order if (i + repeat) % 2 == 0 else reversed(order):
                elapsed, generated = timed(lambda: run(prompt, i), device)
                seconds[name][i] += elapsed
                tokens[name] += generated
    ratios = [b / a for a, b in zip(seconds["batch-1 loop"], seconds["batched loop"])]
    mean = statistics.fmean(ratios)
    half = 1.96 * statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else math.nan
    print(f"{described}, device={device}, Fixed({args.k}), {len(prompts)} prompts x {budget} tokens x {args.repeats}")
    print(f"{'loop':<14} {'tokens/s':>10} {'seconds':>9}")
    rates = {}
    for name in seconds:
        total = sum(seconds[name])
        rates[name] = tokens[name] / total
        print(f"{name:<14} {rates[name]:10.1f} {total:9.2f}")
    print(f"batched / batch-1 time per prompt: {mean:.3f} [{mean - half:.3f}, {mean + half:.3f}] (95 % over prompts)")
    return {**rates, "time_ratio": mean, "time_ratio_lo": mean - half, "time_ratio_hi": mean + half}


if __name__ == "__main__":
    main()
