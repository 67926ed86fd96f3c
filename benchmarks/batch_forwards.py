"""Would compiling the batched loop pay? One decoding step of the real target at batch B, eager and compiled.

    python -m benchmarks.batch_forwards [--pair smollm2] [--batch 16] [--prompt-tokens 120]
                                        [--cache-lengths 256 512] [--steps 20] [--repeats 3] [--threads N]

Every step feeds one token to each of B rows after a prompt of ``--prompt-tokens``, with explicit positions and a 2-D
attention mask, as the batched loop feeds its caches (:mod:`decode.loops.batch_cache`):

* eager over transformers' ``DynamicCache``: what the batched loop runs;
* eager and compiled over a ``StaticCache`` of each cache length L (a static batch cache: attention reads all L
  columns, the unused ones masked);
* compiled over the ``DynamicCache`` with symbolic shapes (``torch.compile(dynamic=True)``): no padded columns.

Compiled forwards use the decoder's inductor settings (:func:`decode.loops.compiled.inductor_options`); a method's
first step after its prompt is its compile time. Each repeat prefills every method's cache again (untimed) and times
``--steps`` steps of each method in turn; the table shows the median milliseconds per step over the repeats with
their spread, and each method's ratio to the eager ``DynamicCache``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median

import torch
import torch._inductor.config
from rich.console import Console
from rich.table import Table
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel, StaticCache

from ahconf.entry import quiet_library_output
from benchmarks.real_pair import load_real_pair
from decode.cache_api import cache_kwargs
from decode.loops.compiled import RECOMPILE_LIMIT, inductor_options

Step = Callable[[int], None]  # feeds every row its next token (the step's index)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batch_forwards", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="smollm2", help="the real pair whose target is timed (default smollm2)")
    parser.add_argument("--batch", type=int, default=16, help="rows per forward (default 16, make real's batches)")
    parser.add_argument("--prompt-tokens", type=int, default=120, help="prompt length of every row (default 120)")
    parser.add_argument("--cache-lengths", type=int, nargs="+", default=[256, 512],
                        help="static cache lengths timed (default 256 512)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per method and repeat (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of turns (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: every core)")
    return parser.parse_args(argv)


@dataclass
class Method:
    """One way to run the step: ``prefill`` builds a fresh cache with the prompt and returns the step function."""

    name: str
    prefill: Callable[[], Step]
    compile_s: float | None = None  # the first compiled step's seconds (None: eager)
    ms: list[float] = field(default_factory=list)  # milliseconds per step, per repeat


class Batch:
    """The prompt ids ``[B, P]`` every method decodes after, and the model's forward over a given cache."""

    def __init__(self, model: PreTrainedModel, rows: int, prompt: int, seed: int = 0) -> None:
        self.model, self.rows, self.prompt = model, rows, prompt
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, model.config.vocab_size, (rows, prompt), generator=generator)

    def positions(self, start: int, n: int) -> Tensor:
        """Positions ``[B, n]`` from ``start``, contiguous."""
        return (torch.arange(n) + start)[None].expand(self.rows, -1).contiguous()

    def forward(self, model: Callable, cache: object, ids: Tensor, mask: Tensor, start: int) -> None:
        model(input_ids=ids, attention_mask=mask, position_ids=self.positions(start, ids.shape[1]),
              **cache_kwargs(self.model, cache))

    def dynamic(self, model: Callable) -> Callable[[], Step]:
        """Steps over a ``DynamicCache`` (the mask grows by one column a step)."""
        def prefill() -> Step:
            cache = DynamicCache(config=self.model.config)
            mask = torch.ones(self.rows, self.prompt, dtype=torch.long)
            self.forward(self.model, cache, self.ids, mask, 0)
            state = {"mask": mask}

            def step(i: int) -> None:
                state["mask"] = torch.cat([state["mask"], torch.ones(self.rows, 1, dtype=torch.long)], dim=1)
                self.forward(model, cache, self.ids[:, i % self.prompt, None].clone(), state["mask"], self.prompt + i)
            return step
        return prefill

    def static(self, model: Callable, length: int) -> Callable[[], Step]:
        """Steps over a ``StaticCache`` of ``length`` columns, one cache reused by every prefill (its address stays)."""
        cache = StaticCache(config=self.model.config, max_cache_len=length)

        def prefill() -> Step:
            for layer in cache.layers:
                if layer.is_initialized:
                    layer.cumulative_length.zero_()
            mask = torch.zeros(self.rows, length, dtype=torch.long)
            mask[:, : self.prompt] = 1
            self.forward(self.model, cache, self.ids, mask, 0)

            def step(i: int) -> None:
                mask[:, self.prompt + i] = 1
                self.forward(model, cache, self.ids[:, i % self.prompt, None].clone(), mask, self.prompt + i)
            return step
        return prefill


def methods(batch: Batch, lengths: list[int]) -> list[Method]:
    """Eager dynamic first (the reference), then eager and compiled static per length, then compiled dynamic."""
    model = batch.model
    static = torch.compile(model, dynamic=None)
    symbolic = torch.compile(model, dynamic=True)
    found = [Method("eager, DynamicCache", batch.dynamic(model))]
    for length in lengths:
        found.append(Method(f"eager, StaticCache L={length}", batch.static(model, length)))
        found.append(Method(f"compiled, StaticCache L={length}", batch.static(static, length), compile_s=0.0))
    found.append(Method("compiled, DynamicCache (symbolic shapes)", batch.dynamic(symbolic), compile_s=0.0))
    return found


def run(method: Method, steps: int, options: dict[str, object]) -> None:
    """Time one repeat of ``method``: a fresh prefill (untimed), its first step (the compile, once), ``steps`` steps."""
    with torch.no_grad(), torch._inductor.config.patch(options), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
        step = method.prefill()
        start = time.perf_counter()
        step(0)
        if method.compile_s == 0.0:
            method.compile_s = time.perf_counter() - start
        start = time.perf_counter()
        for i in range(1, steps + 1):
            step(i)
        method.ms.append(1000 * (time.perf_counter() - start) / steps)


def report(found: list[Method], args: argparse.Namespace) -> Table:
    out = Table(title=f"one step of the target at B = {args.batch} after {args.prompt_tokens} prompt tokens",
                caption=f"median of {args.repeats} repeats of {args.steps} steps, methods taking turns")
    for column in ("method", "ms / step", "spread", "× eager DynamicCache", "compile s"):
        out.add_column(column, justify="left" if column == "method" else "right")
    base = median(found[0].ms)
    for method in found:
        ms = median(method.ms)
        out.add_row(method.name, f"{ms:.1f}", f"{min(method.ms):.1f}–{max(method.ms):.1f}", f"{base / ms:.2f}",
                    "—" if method.compile_s is None else f"{method.compile_s:.0f}")
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    quiet_library_output()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.prompt_tokens + args.steps + 1 > min(args.cache_lengths):
        raise SystemExit(f"error: --cache-lengths must exceed --prompt-tokens + --steps "
                         f"({args.prompt_tokens + args.steps + 1}); raise them or shorten the prompt")
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    target = load_real_pair(args.pair, ("target",)).models["target"]
    console = Console()
    found = methods(Batch(target, args.batch, args.prompt_tokens), args.cache_lengths)
    options = inductor_options(target.device)
    for repeat in range(args.repeats):
        for method in found:
            if method.compile_s == 0.0:
                console.print(f"compiling: {method.name} (minutes) …")
            run(method, args.steps, options)
        console.print(f"repeat {repeat + 1}/{args.repeats} done")
    console.print(report(found, args))


if __name__ == "__main__":
    main()
