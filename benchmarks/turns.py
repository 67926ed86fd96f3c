"""Methods timed in turns at batch 1: each method on every prompt in turn, a table of tokens/s with intervals.

A method is ``run(prompt ids, seed) -> tokens generated``. Taking turns prompt by prompt makes a drift of the
machine's speed hit every method alike; with ``repeats`` the whole round of turns runs again and each method's
per-prompt tokens and seconds add up over the repeats (the spread over repeats is kept per method).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from rich.table import Table
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from accept_heads.measure.bootstrap import PromptCosts, paired_draws, ratio_interval
from decode.loops.target_alone import generate_target_alone
from decode.timing import Stopwatch

Decode = Callable[[list[int], int], int]  # (prompt ids, seed) → tokens generated


@dataclass
class Timed:
    """One method's per-prompt tokens and seconds (summed over repeats), and its tokens/s in each repeat."""

    name: str
    tokens: list[float]
    seconds: list[float]
    repeat_rates: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return sum(self.tokens) / sum(self.seconds)

    def costs(self) -> PromptCosts:
        return PromptCosts(tuple(str(i) for i in range(len(self.tokens))), np.array(self.tokens),
                           np.array(self.seconds))


def hf_target_alone(target: PreTrainedModel, budget: int, greedy: bool = False, static_cache: bool = False) -> Decode:
    """The target alone by HF ``generate`` as a method (no EOS stop; greedy or T = 1 sampling)."""
    def run(prompt: list[int], seed: int) -> int:
        ids = torch.tensor(prompt, device=target.device)
        return generate_target_alone(target, [ids], budget, None, do_sample=not greedy, seed=seed,
                                     static_cache=static_cache).tokens
    return run


def time_methods(methods: dict[str, Decode], prompts: list[list[int]], label: str, repeats: int = 1,
                 device: torch.device | None = None) -> list[Timed]:
    """Each method on every prompt, taking turns (after one untimed warm-up each), ``repeats`` times over."""
    device = device or torch.device("cpu")
    for run in methods.values():
        run(prompts[0][:32], 0)
    timed = [Timed(name, [0.0] * len(prompts), [0.0] * len(prompts)) for name in methods]
    for repeat in range(repeats):
        done = [(0.0, 0.0) for _ in methods]
        desc = label if repeats == 1 else f"{label} ({repeat + 1}/{repeats})"
        for seed, prompt in enumerate(tqdm(prompts, desc=desc, unit="prompt")):
            for m, (result, run) in enumerate(zip(timed, methods.values())):
                with Stopwatch(device) as watch:
                    tokens = run(prompt, seed)
                result.tokens[seed] += tokens
                result.seconds[seed] += watch.seconds
                done[m] = (done[m][0] + tokens, done[m][1] + watch.seconds)
        for result, (tokens, seconds) in zip(timed, done):
            result.repeat_rates.append(tokens / seconds)
    return timed


def table(title: str, timed: list[Timed], seed: int, reference: int = 0) -> Table:
    """tokens/s and the speed-up over ``timed[reference]`` with its paired interval (and the spread over repeats)."""
    repeats = len(timed[0].repeat_rates)
    caption = "interval: 95 % paired bootstrap over prompts; methods took turns per prompt"
    out = Table(title=title, caption=caption + (f"; {repeats} repeats" if repeats > 1 else ""))
    base = timed[reference]
    columns = ["method", "tokens/s"] + (["repeats (min–max)"] if repeats > 1 else [])
    for column in columns + [f"vs {base.name}", "95 % interval"]:
        out.add_column(column, justify="left" if column == "method" else "right")
    draws = paired_draws(len(base.tokens), seed)
    for one in timed:
        low, high = ratio_interval(one.costs(), base.costs(), draws)
        spread = [f"{min(one.repeat_rates):.1f}–{max(one.repeat_rates):.1f}"] if repeats > 1 else []
        out.add_row(one.name, f"{one.rate:.1f}", *spread, f"{one.rate / base.rate:.3f}", f"[{low:.3f}, {high:.3f}]")
    return out
