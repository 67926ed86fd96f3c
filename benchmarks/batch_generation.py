"""Batched generation eager against compiled (:class:`decode.compile.batch_steps.BatchSteps`): the response tokens per
second of the loop the collection and the feature draft's data generate with (:func:`data_gen.generation.generate_responses`).

    python -m benchmarks.batch_generation [--pair smollm2] [--batch-sizes 32 64] [--prompts 64]
                                          [--max-new-tokens 128] [--repeats 2]

The real pair's target samples (T = 1) its responses to the same chat-rendered train prompts, batch by batch, eager
and compiled taking turns (the order alternating), after one untimed pass of each on the first batch (which builds or
loads the compiled graphs: their seconds are printed apart). Both keep every step's logits, as the collection does.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from ahconf.entry import quiet_library_output
from benchmarks.real_pair import load_real_pair
from data_gen.generation import generate_responses
from decode.sampling import Sampling
from decode.timing import machine_class
from model_build.real.build import encoded_prompts


@dataclass(frozen=True)
class Throughput:
    """One batch size's response tokens and seconds, eager and compiled, summed over batches and repeats."""

    rows: int
    tokens: dict[str, int]
    seconds: dict[str, float]
    warm_up_s: dict[str, float]  # the untimed first pass (compiled: building or loading the graphs)

    def rate(self, method: str) -> float:
        return self.tokens[method] / self.seconds[method]


def main(argv: list[str] | None = None) -> list[Throughput]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batch_generation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="smollm2", help="the real pair (default smollm2)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--prompts", type=int, default=64, help="train prompts (default 64)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="passes over the prompts (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    quiet_library_output()
    real = load_real_pair(args.pair, ("target",))
    target, tokenizer = real.models["target"], real.tokenizer
    prompts = encoded_prompts(real.spec, tokenizer, "builtin", "train", args.prompts, args.seed, style="function")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def generate(batch: list[list[int]], compiled: bool, first: int) -> tuple[int, float]:
        generators = [torch.Generator().manual_seed(args.seed + first + i) for i in range(len(batch))]
        start = time.perf_counter()
        out = generate_responses(target, batch, sampling=Sampling(), max_new_tokens=args.max_new_tokens,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=pad, generators=generators,
                                 vocab=target.config.vocab_size, compiled=compiled)
        return sum(out.response_lengths), time.perf_counter() - start

    results = []
    for rows in args.batch_sizes:
        batches = [prompts[i:i + rows] for i in range(0, len(prompts) - rows + 1, rows)]
        methods = {"eager": False, "compiled": True}
        print(f"B = {rows}: waiting on the untimed first pass of each (compiled: building or loading its graphs)",
              flush=True)
        warm = {name: generate(batches[0], compiled, 0)[1] for name, compiled in methods.items()}
        tokens, seconds = dict.fromkeys(methods, 0), dict.fromkeys(methods, 0.0)
        turn = 0
        for _ in range(args.repeats):
            for index, batch in enumerate(batches):
                order = list(methods) if turn % 2 == 0 else list(reversed(methods))
                for name in order:
                    n, s = generate(batch, methods[name], index * rows)
                    tokens[name] += n
                    seconds[name] += s
                turn += 1
        results.append(Throughput(rows, tokens, seconds, warm))
    table = Table(title=f"batched generation, {real.spec.name} target, {real.dtype}, {machine_class(target.device)}, "
                        f"{args.max_new_tokens} tokens a response, T = 1")
    for column in ("B", "eager tok/s", "compiled tok/s", "compiled / eager", "first pass s (eager / compiled)"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(str(r.rows), f"{r.rate('eager'):.0f}", f"{r.rate('compiled'):.0f}",
                      f"{r.rate('compiled') / r.rate('eager'):.2f}x",
                      f"{r.warm_up_s['eager']:.0f} / {r.warm_up_s['compiled']:.0f}")
    Console(width=140).print(table)
    return results


if __name__ == "__main__":
    main()
