"""``python -m benchmarks.decoding --batch-sizes 1 8 32 --goodput [--head PATH] [--profile PATH]``: goodput per B.

Measures the batch costs of the pair (and of the companion, with ``--profile``) on this device
(:func:`decode.batch_costs.measure_batch_costs`, once per machine and model set:
:mod:`accept_heads.evaluation.machine_costs`), decodes the same ``max(B)`` prompts in batches of
each size ``B`` with batched ``Fixed(K)`` for every ``K`` of ``--k-grid``, given a trained head with
``Head(h)`` and the batch-aware ``GoodputHead`` (no threshold), and given an SV profile with ``SV``
(verification lengths chosen jointly at the measured ``t_t(B, T)``). Each method's goodput is given twice:
modelled (its forwards priced at the measured costs, :meth:`BatchCosts.modelled_seconds`, prompts left out;
free of timer noise) and measured (the wall clock of its decodes, every method and the target alone taking
turns at each ``B``, after one warm-up decode each). Each is compared with the best fixed K at the same ``B``
by the same measure and with the target alone (modelled: one token per row per forward, ``B / t_t(B, B)``;
measured: HF ``generate`` on the same batches). The table of measured costs is printed first.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from accept_heads.evaluation.machine_costs import machine_batch_costs
from decode.artifacts.serialization import load_head, load_profile
from decode.batch_costs import BatchCosts
from decode.loops.speculative_decoder import SpeculativeDecoder
from decode.loops.target_alone import generate_target_alone
from decode.policies import SV, Fixed, GoodputHead, Head, Policy
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


def decode_rows(decoder: SpeculativeDecoder, prompts: list[torch.Tensor], batch: int, budget: int, costs: BatchCosts,
                name: str) -> GoodputRow:
    """Decode all ``prompts`` in batches of ``batch`` with ``decoder``, price their forwards and time them."""
    tokens, seconds = 0, 0.0
    with Stopwatch(prompts[0].device) as clock:
        for start in range(0, len(prompts), batch):
            totals = decoder.generate(prompts[start : start + batch], max_new_tokens=budget, seed=start).totals
            tokens += totals.tokens
            seconds += costs.modelled_seconds(totals.target_shapes, totals.draft_shapes, totals.companion_shapes)
    return GoodputRow(name, batch, tokens, seconds, clock.seconds)


def target_rows(target: PreTrainedModel, prompts: list[torch.Tensor], batch: int, budget: int,
                eos: int | list[int] | None, costs: BatchCosts) -> GoodputRow:
    """The target alone on the same batches (HF ``generate``), timed; modelled at one token per row per forward
    (the prompt's forward left out, as for the decoders)."""
    tokens, seconds = 0, 0.0
    with Stopwatch(prompts[0].device) as clock:
        for start in range(0, len(prompts), batch):
            run = generate_target_alone(target, prompts[start : start + batch], budget, eos, seed=start)
            tokens += run.tokens
            seconds += costs.target_alone_seconds(run.rows, run.steps)
    return GoodputRow(TARGET_ALONE, batch, tokens, seconds, clock.seconds)


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
    decoders = [(name, SpeculativeDecoder(target, draft, rule=Speculative(), policy=policy, sampling=Sampling(),
                                          companion=companion if policy.companion else None, eos_token_id=eos))
                for name, policy in policies]
    budget = args.max_new_tokens
    for _, decoder in decoders:  # warm-up: first-call allocations and kernel selection stay out of the timings
        decoder.generate(prompts[:1], max_new_tokens=budget, seed=0)
    generate_target_alone(target, prompts[:1], budget, eos)
    rows: list[GoodputRow] = []
    print(f"{'method':<28} {'B':>4} {'tokens':>7} {'modelled s':>11} {'goodput':>9} {'x best K':>9} {'x target':>9} "
          f"{'tokens/s':>9} {'x best K':>9} {'x target':>9}")
    for batch in sizes:
        here = [target_rows(target, prompts, batch, budget, eos, costs)]
        here += [decode_rows(decoder, prompts, batch, budget, costs, name) for name, decoder in decoders]
        fixed = [r for r in here if r.method.startswith("Fixed")]
        best = max(fixed, key=lambda r: r.goodput)
        best_measured = max(fixed, key=lambda r: r.measured)
        for row in here:
            mark = ("*" if row is best else "") + ("+" if row is best_measured else "")
            print(f"{row.method + (' ' + mark if mark else ''):<28} {batch:4d} {row.tokens:7d} {row.modelled_s:11.3f} "
                  f"{row.goodput:9.1f} {row.goodput / best.goodput:8.3f}x {row.goodput / here[0].goodput:8.3f}x "
                  f"{row.measured:9.1f} {row.measured / best_measured.measured:8.3f}x "
                  f"{row.measured / here[0].measured:8.3f}x")
        rows += here
    print("modelled: tokens / seconds of the batched forwards priced at the measured costs (prompts left out); "
          "measured: tokens / wall-clock seconds, the methods taking turns at each B; * / + = best fixed K at that B, "
          "modelled / measured")
    return rows
