"""``python -m benchmarks.decoding --batch-sizes 1 8 32 --goodput [--head PATH] [--profile PATH]``: goodput per B.

Measures the batch costs of the pair (and of the companion, with ``--profile``) on this device
(:func:`decode.batch_costs.measure_batch_costs`, once per machine and model set:
:mod:`accept_heads.measure.machine_costs`), decodes the same ``max(B)`` prompts in batches of
each size ``B`` with batched ``Fixed(K)`` for every ``K`` of ``--k-grid``, the target alone through our own
loop (``TargetOnly``, ``K = 0``) and vLLM's survival budget on its online margin logistic; given a trained head
also with ``Head(h)``, the batch-aware ``GoodputHead`` (no threshold) and the survival budget on the head, and
given an SV profile with ``SV`` (verification lengths chosen jointly at the measured ``t_t(B, T)``). Each method's
goodput is given twice: modelled (its forwards priced at the measured costs, :meth:`BatchCosts.modelled_seconds`,
prompts left out; free of timer noise) and measured (the wall clock of its decodes, every method and the target
alone taking turns batch by batch, after one warm-up decode each). Each is compared with the best fixed K at the
same ``B`` (``K = 0`` allowed) by the same measure and with the target alone (modelled: one token per row per
forward, ``B / t_t(B, B)``; measured: HF ``generate`` and our own loop on the same batches). The table of measured
costs is printed first.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from accept_heads.measure.machine_costs import machine_batch_costs
from decode.artifacts.serialization import load_head, load_profile
from decode.batch_costs import BatchCosts
from decode.loops.speculative_decoder import SpeculativeDecoder
from decode.loops.target_alone import generate_target_alone
from decode.policies.base import Policy
from decode.policies.schedules import Fixed, TargetOnly
from decode.policies.sources import HeadEstimate, VLLMEstimator
from decode.policies.stop_policy import GoodputHead, Head, StopPolicy
from decode.policies.stops import SurvivalStop
from decode.policies.sv import SV
from decode.rules import Speculative
from decode.sampling import Sampling
from decode.timing import Stopwatch


@dataclass
class GoodputRow:
    """One method at one batch size: its tokens, the modelled seconds of its forwards and its wall clock."""

    method: str
    batch: int
    tokens: int
    modelled_s: float
    measured_s: float = 0.0

    @property
    def goodput(self) -> float:
        """Generated tokens per modelled second."""
        return self.tokens / self.modelled_s if self.modelled_s else 0.0

    @property
    def measured(self) -> float:
        """Generated tokens per measured second."""
        return self.tokens / self.measured_s if self.measured_s else 0.0


TARGET_ALONE = "target alone (HF generate)"
TARGET_LOOP = "target alone (our loop, K=0)"


@dataclass
class Method:
    """A method of the comparison: what decodes one batch of prompts (``seed``: the batch's seed) and returns its
    tokens and the modelled seconds of its forwards."""

    name: str
    run: Callable[[list[torch.Tensor], int], tuple[int, float]]


def decoder_method(name: str, decoder: SpeculativeDecoder, budget: int, costs: BatchCosts) -> Method:
    """A method of our decoder: its batch's forwards priced at the measured costs."""
    def run(prompts: list[torch.Tensor], seed: int) -> tuple[int, float]:
        totals = decoder.generate(prompts, max_new_tokens=budget, seed=seed).totals
        return totals.tokens, costs.modelled_seconds(totals.target_shapes, totals.draft_shapes, totals.companion_shapes)

    return Method(name, run)


def target_method(target: PreTrainedModel, budget: int, eos: int | list[int] | None, costs: BatchCosts) -> Method:
    """The target alone with HF ``generate``, modelled at one token per row per forward (the prompt's forward left
    out, as for the decoders)."""
    def run(prompts: list[torch.Tensor], seed: int) -> tuple[int, float]:
        out = generate_target_alone(target, prompts, budget, eos, seed=seed)
        return out.tokens, costs.target_alone_seconds(out.rows, out.steps)

    return Method(TARGET_ALONE, run)


def measure_turns(methods: list[Method], prompts: list[torch.Tensor], batch: int) -> list[GoodputRow]:
    """Every method decodes the same batches of ``batch`` prompts, taking turns batch by batch (the first method
    rotating), so drift on a shared machine hits all alike; a row per method."""
    rows = [GoodputRow(m.name, batch, 0, 0.0) for m in methods]
    for index, start in enumerate(range(0, len(prompts), batch)):
        chunk = prompts[start : start + batch]
        for turn in range(len(methods)):
            m = (index + turn) % len(methods)
            with Stopwatch(chunk[0].device) as clock:
                tokens, modelled = methods[m].run(chunk, start)
            rows[m].tokens += tokens
            rows[m].modelled_s += modelled
            rows[m].measured_s += clock.seconds
    return rows


def print_costs(costs: BatchCosts) -> None:
    """The measured table, in milliseconds."""
    print("measured costs (ms) at B rows x 1..L tokens per row")
    for name, table in (("target", costs.target), ("draft", costs.draft_widths), ("companion", costs.companion)):
        for b, row in zip(costs.batches, table):
            print(f"  {name:<9} B={b:<4d} " + " ".join(f"{1e3 * t:.2f}" for t in row))


def run_goodput(args: argparse.Namespace, target: PreTrainedModel, draft: PreTrainedModel, prompts: list[torch.Tensor],
                eos: int | list[int] | None, companion: PreTrainedModel | None = None) -> list[GoodputRow]:
    """The ``--goodput`` comparison; prints the measured costs and one table, returns its rows."""
    sizes = sorted(set(args.batch_sizes))
    profile = load_profile(args.profile, sampling=Sampling(), rule=Speculative()) if args.profile else None
    if profile is not None and companion is None:
        raise ValueError("--profile needs the companion model the profile was fitted with (--companion)")
    sv_k = profile.metadata.k_range(1, profile.latency.numel())[1] if profile is not None else 0
    models = {role: {"id": name, "resolved": name, "dtype": args.dtype}
              for role, name in (("target", args.target), ("draft", args.draft), ("companion", args.companion)) if name}
    costs, source = machine_batch_costs(target, draft, models=models, batches=sizes,
                                        max_length=max([*args.k_grid, sv_k]) + 1, repeats=5,
                                        companion=companion if profile is not None else None)
    print(f"batch costs {'read from' if source.reused else 'measured and stored in'} {source.path}")
    print_costs(costs)
    head = load_head(args.head, draft=draft, sampling=Sampling(), rule=Speculative()) if args.head else None
    policies: list[tuple[str, Policy]] = [(f"Fixed({k})", Fixed(k)) for k in args.k_grid]
    if head is not None:
        at_h = Head(head, threshold=args.threshold)
        policies += [(f"Head(h={at_h.threshold})", at_h),
                     ("GoodputHead (batch costs)", GoodputHead(head, costs.batch_one(), batch_costs=costs))]
    if profile is not None:
        policies.append((f"SV(k={sv_k}, batch costs)", SV(profile, k=sv_k, batch_latency=costs.verify_time)))
    estimator = VLLMEstimator()  # vLLM's released estimator, learning along the whole comparison
    policies += [("vLLM estimator, survival budget (batch costs)",
                  StopPolicy(estimator, SurvivalStop(costs, k_max=max(args.k_grid)))),
                 (TARGET_LOOP, TargetOnly())]
    if head is not None:
        policies.append(("HeadBudget (survival, batch costs)", StopPolicy(HeadEstimate(head), SurvivalStop(costs))))
    budget = args.max_new_tokens
    methods = [target_method(target, budget, eos, costs)] + [
        decoder_method(name, SpeculativeDecoder(target, draft, rule=Speculative(), policy=policy, sampling=Sampling(),
                                                companion=companion if policy.companion else None, eos_token_id=eos),
                       budget, costs)
        for name, policy in policies]
    for method in methods:  # warm-up: first-call allocations and kernel selection stay out of the timings
        method.run(prompts[:1], 0)
    rows: list[GoodputRow] = []
    print(f"{'method':<38} {'B':>4} {'tokens':>7} {'modelled s':>11} {'goodput':>9} {'x best K':>9} {'x target':>9} "
          f"{'tokens/s':>9} {'x best K':>9} {'x HF':>9} {'x loop':>9}")
    for batch in sizes:
        here = measure_turns(methods, prompts, batch)
        fixed = [r for r in here if r.method.startswith("Fixed") or r.method == TARGET_LOOP]  # K = 0 allowed
        best = max(fixed, key=lambda r: r.goodput)
        best_measured = max(fixed, key=lambda r: r.measured)
        hf, loop = here[0], next(r for r in here if r.method == TARGET_LOOP)
        for row in here:
            mark = ("*" if row is best else "") + ("+" if row is best_measured else "")
            print(f"{row.method + (' ' + mark if mark else ''):<38} {batch:4d} {row.tokens:7d} {row.modelled_s:11.3f} "
                  f"{row.goodput:9.1f} {row.goodput / best.goodput:8.3f}x {row.goodput / loop.goodput:8.3f}x "
                  f"{row.measured:9.1f} {row.measured / best_measured.measured:8.3f}x "
                  f"{row.measured / hf.measured:8.3f}x {row.measured / loop.measured:8.3f}x")
        rows += here
    print("modelled: tokens / seconds of the batched forwards priced at the measured costs (prompts left out; "
          "x target: over the target alone, one token per row per forward); measured: tokens / wall-clock seconds, "
          "the methods taking turns batch by batch (x HF / x loop: over the target alone by HF generate / by our own "
          "loop); * / + = best fixed K (K = 0: our loop) at that B, modelled / measured")
    return rows
