"""Serve a trained feature draft with vLLM's CPU engine and check that vLLM accepts what our decoder accepts.

    python -m benchmarks.vllm_door --draft DIR --vllm-python PATH [--pair smollm2] [--k 3] [--prompts 8]
                                   [--max-new-tokens 64] [--repeats 3] [--threads N] [--dtype bfloat16|float32]

``DIR``: a feature draft with EAGLE-3's first layer for the pair's target (``python -m model_build.feature_draft
--first-layer eagle3``). It is exported as a speculators checkpoint (:mod:`decode.artifacts.export_draft`) and
served by vLLM (``method="eagle3"``, in its own environment and process, ``benchmarks/vllm_cpu.py``), while this
project's compiled decoder drafts with the same draft at the same fixed K. Both decode the pair's test prompts
greedily at batch 1 with no EOS stop; our two methods take turns prompt by prompt (``benchmarks.turns``), vLLM's
processes run after them alone on the machine (they cannot take turns with ours):

* losslessness: each engine's output against the target's greedy output by that engine alone (vLLM's target alone;
  our compiled target alone), and the two engines against each other, prompt by prompt;
* acceptance by draft position ``i = 1..K``: **unconditional** (rounds whose ``i``-th draft token was accepted, over
  rounds that drafted: vLLM's ``num_accepted_tokens_per_pos / num_drafts``) and **conditional** (over rounds that
  reached position ``i``), from vLLM's counters and from our :class:`decode.DecodeStats`;
* tokens per second of each (the median of ``--repeats`` rounds over the prompts), and of each target alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import torch
from rich.console import Console
from rich.table import Table

from ahconf.entry import quiet_library_output
from benchmarks.engines import VllmRun, ours, vllm_rates
from benchmarks.real_pair import load_real_pair
from benchmarks.turns import time_methods
from decode.artifacts.hub import ModelLoadError, load_causal_lm
from decode.artifacts.speculators import SpeculatorsError, check_exportable, export_speculators
from decode.loops.speculative_decoder import SpeculativeDecoder
from decode.policies.schedules import Fixed, TargetOnly
from decode.stats import DecodeStats
from decode.threads import torch_threads
from decode.timing import machine_class
from model_build.real.build import encoded_prompts

TOLERANCE = 0.03  # the largest difference in acceptance at any position the check allows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vllm_door", description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", type=Path, required=True, help="an EAGLE-3 first layer's feature draft directory")
    parser.add_argument("--pair", default="smollm2", help="the real pair whose target it drafts for (default smollm2)")
    parser.add_argument("--k", type=int, default=3, help="draft tokens a round, both engines (default 3)")
    parser.add_argument("--prompts", type=int, default=8, help="test prompts (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds over the prompts (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of both engines (default: every core)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                        help="both engines' precision (default: the pair's)")
    parser.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"),
                        help="a python with vllm-cpu installed (default $VLLM_PYTHON)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


@dataclass(frozen=True)
class Acceptance:
    """Acceptance by draft position ``[K]``: rounds that drafted, and rounds whose ``i``-th draft was accepted."""

    drafts: int
    accepted: tuple[int, ...]  # [K]

    @property
    def unconditional(self) -> list[float]:
        """P(the i-th draft token is accepted), over rounds that drafted."""
        return [a / self.drafts if self.drafts else float("nan") for a in self.accepted]

    @property
    def conditional(self) -> list[float]:
        """P(the i-th draft token is accepted | the (i−1)-th was), over rounds that reached it."""
        reached = (self.drafts, *self.accepted[:-1])
        return [a / r if r else float("nan") for a, r in zip(self.accepted, reached)]

    @classmethod
    def of_stats(cls, stats: list[DecodeStats], k: int) -> Acceptance:
        """Ours, from the decodes' per-round counts (rounds that verified at least one candidate)."""
        accepted = [0] * k
        drafts = 0
        for one in stats:
            for verified, taken in zip(one.verified_per_round, one.accepted_per_round):
                drafts += verified > 0
                for i in range(min(taken, k)):
                    accepted[i] += 1
        return cls(drafts, tuple(accepted))

    @classmethod
    def of_vllm(cls, run: VllmRun, k: int) -> Acceptance:
        """vLLM's, from its counters."""
        return cls(int(run.drafts or 0), tuple((run.accepted_per_position or [0] * k)[:k]))


def decode_all(decoder: SpeculativeDecoder, prompts: list[list[int]], budget: int
               ) -> tuple[list[list[int]], list[DecodeStats]]:
    """Each prompt decoded once, untimed: its output and stats (greedy, so what every timed round decodes again), and
    the graphs of every cache length the prompts need compiled or loaded before the timing."""
    outputs, stats = [], []
    for prompt in prompts:
        out = decoder.generate(prompt, max_new_tokens=budget, seed=0)
        outputs.append(out.sequences[0, len(prompt):].tolist())
        stats.append(out.stats)
    return outputs, stats


def same(a: list[list[int]], b: list[list[int]]) -> str:
    """``n / N`` prompts whose outputs are equal token for token."""
    return f"{sum(x == y for x, y in zip(a, b))} / {len(a)}"


def acceptance_table(k: int, mine: Acceptance, theirs: Acceptance, title: str) -> Table:
    table = Table(title=title, caption=f"rounds that drafted: ours {mine.drafts} (one pass), vLLM {theirs.drafts} "
                  f"(the timed repeats); the check allows |difference| ≤ {TOLERANCE} at each position")
    for column in ("position", "ours, unconditional", "vLLM, unconditional", "|Δ|", "ours, conditional",
                   "vLLM, conditional", "|Δ|"):
        table.add_column(column, justify="right")
    for i in range(k):
        u, v = mine.unconditional[i], theirs.unconditional[i]
        c, d = mine.conditional[i], theirs.conditional[i]
        table.add_row(str(i + 1), f"{u:.3f}", f"{v:.3f}", f"{abs(u - v):.3f}", f"{c:.3f}", f"{d:.3f}",
                      f"{abs(c - d):.3f}")
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_library_output()
    if not args.vllm_python:
        print("error: pass --vllm-python PATH (a python with vllm-cpu: docs/library.md, \"Serving a trained draft with "
              "vLLM\")", file=sys.stderr)
        return 2
    torch_threads(args.threads or None)
    real = load_real_pair(args.pair, ())
    dtype = getattr(torch, args.dtype) if args.dtype else real.dtype
    try:  # loaded in the dtype (a cast would also round the rotary buffers that stay float32)
        target = load_causal_lm(str(real.target_dir), dtype=dtype)
        draft = check_exportable(load_causal_lm(str(args.draft), dtype=dtype))
    except (ModelLoadError, SpeculatorsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    prompts = encoded_prompts(real.spec, real.tokenizer, "builtin", "test", args.prompts, args.seed, style="function")
    k, budget = args.k, args.max_new_tokens
    machine = machine_class(torch.device("cpu"))
    print(f"machine: {machine}; {dtype}; K = {k}; "
          f"{len(prompts)} test prompts x {budget} tokens, greedy, batch 1")
    console = Console(width=140)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            exported = export_speculators(draft, Path(scratch) / "speculators", target=target, k=k,
                                          verifier=str(real.target_dir))
        except SpeculatorsError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print("waiting on our compiled decoder (compiling, one untimed pass, then the timed rounds in turns)")
        methods = {"ours, compiled, eagle3 draft": ours(target, draft, Fixed(k), budget, True, True),
                   "ours, compiled, target alone": ours(target, draft, TargetOnly(), budget, True, True)}
        decoded = {name: decode_all(decoder, prompts, budget) for name, (_, decoder) in methods.items()}
        timed = {one.name: one.repeat_rates for one in time_methods(
            {name: run for name, (run, _) in methods.items()}, prompts, "ours", repeats=args.repeats)}
        vllm_dtype = str(dtype).removeprefix("torch.")
        theirs = vllm_rates(args.vllm_python, real.target_dir, prompts, budget, args.repeats, args.threads,
                            (exported, k), method="eagle3", dtype=vllm_dtype)
        vllm_alone = vllm_rates(args.vllm_python, real.target_dir, prompts, budget, 1, args.threads, dtype=vllm_dtype)
    if theirs is None or vllm_alone is None:
        return 1
    (outputs, stats), (alone_outputs, _) = decoded.values()
    mine, vllm = Acceptance.of_stats(stats, k), Acceptance.of_vllm(theirs, k)
    console.print(acceptance_table(k, mine, vllm, f"acceptance by draft position, K = {k} ({machine})"))
    differences = [abs(a - b) for a, b in zip(mine.unconditional + mine.conditional,
                                              vllm.unconditional + vllm.conditional)]
    speed = Table(title="tokens per second (median of the repeats; their range)")
    for column in ("engine", "tokens/s", "range", "× vLLM eagle3"):
        speed.add_column(column, justify="right")
    rows = {"ours, compiled, eagle3 draft": timed["ours, compiled, eagle3 draft"],
            "vLLM CPU, eagle3 draft": theirs.rates, "vLLM CPU, target alone": vllm_alone.rates,
            "ours, compiled, target alone": timed["ours, compiled, target alone"]}
    for name, rates in rows.items():
        speed.add_row(name, f"{median(rates):.1f}", f"{min(rates):.1f}–{max(rates):.1f}",
                      f"{median(rates) / median(theirs.rates):.2f}")
    console.print(speed)
    lossless = {"vLLM eagle3 = vLLM target alone": same(theirs.outputs, vllm_alone.outputs),
                "ours = our target alone": same(outputs, alone_outputs),
                "ours = vLLM eagle3": same(outputs, theirs.outputs)}
    print("greedy outputs equal, prompt by prompt: " + "; ".join(f"{k_}: {v}" for k_, v in lossless.items()))
    print(f"largest acceptance difference at any position: {max(differences):.3f} "
          f"({'within' if max(differences) <= TOLERANCE else 'beyond'} {TOLERANCE})")
    if args.out:
        args.out.write_text(json.dumps({
            "machine": machine, "dtype": str(dtype), "k": k, "prompts": len(prompts), "max_new_tokens": budget,
            "ours": {"rates": rows["ours, compiled, eagle3 draft"], "unconditional": mine.unconditional,
                     "conditional": mine.conditional,
                     "drafts": mine.drafts},
            "vllm": {"rates": theirs.rates, "unconditional": vllm.unconditional, "conditional": vllm.conditional,
                     "drafts": vllm.drafts},
            "target_alone": {"ours": rows["ours, compiled, target alone"], "vllm": vllm_alone.rates},
            "lossless": lossless,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
