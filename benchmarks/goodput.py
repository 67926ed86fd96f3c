"""``python -m benchmarks.decoding --batch-sizes 1 8 32 --goodput [--head PATH] [--profile PATH]``: modelled goodput per B.

Measures the batch costs of the pair (and of the companion, with ``--profile``) on this device
(:func:`decode.batch_costs.measure_batch_costs`), decodes the same ``max(B)`` prompts in batches of
each size ``B`` with batched ``Fixed(K)`` for every ``K`` of ``--k-grid``, given a trained head with
``Head(h)`` and the batch-aware ``GoodputHead`` (no threshold), and given an SV profile with ``SV``
(verification lengths chosen jointly at the measured ``t_t(B, T)``), and prices every generation's
forwards with the measured costs (:meth:`BatchCosts.modelled_seconds`, prompts left out). Goodput = generated tokens / modelled
seconds; each method is compared with the best fixed K at the same ``B`` and with the target alone
(one token per row per forward: ``B / t_t(B, B)``). Modelled, so free of timer noise; the table of
measured costs is printed first.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from decode.artifacts.export import load_head, load_profile
from decode.batch_costs import BatchCosts, measure_batch_costs
from decode.loops.decoder import SpeculativeDecoder
from decode.policies import SV, Fixed, GoodputHead, Head, Policy
from decode.rules import Speculative
from decode.sampling import Sampling


@dataclass
class GoodputRow:
    """One method at one batch size."""

    method: str
    batch: int
    tokens: int
    modelled_s: float

    @property
    def goodput(self) -> float:
        """Generated tokens per modelled second."""
        return self.tokens / self.modelled_s if self.modelled_s else 0.0


def decode_rows(decoder: SpeculativeDecoder, prompts: list[torch.Tensor], batch: int, budget: int, costs: BatchCosts,
                name: str) -> GoodputRow:
    """Decode all ``prompts`` in consecutive batches of ``batch`` with ``decoder`` and price their forwards."""
    tokens, seconds = 0, 0.0
    for start in range(0, len(prompts), batch):
        totals = decoder.generate(prompts[start : start + batch], max_new_tokens=budget, seed=start).totals
        tokens += totals.tokens
        seconds += costs.modelled_seconds(totals.target_shapes, totals.draft_shapes, totals.companion_shapes)
    return GoodputRow(name, batch, tokens, seconds)


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
    sv_k = int(profile.metadata.get("k_max", profile.latency.numel())) if profile is not None else 0
    costs = measure_batch_costs(target, draft, batches=sizes, max_length=max([*args.k_grid, sv_k]) + 1,
                                companion=companion if profile is not None else None)
    print_costs(costs)
    head = load_head(args.head, draft=draft, sampling=Sampling(), rule=Speculative()) if args.head else None
    policies: list[tuple[str, Policy]] = [(f"Fixed({k})", Fixed(k)) for k in args.k_grid]
    if head is not None:
        policies += [(f"Head(h={args.threshold})", Head(head, threshold=args.threshold)),
                     ("GoodputHead (batch costs)", GoodputHead(head, costs.batch_one(), batch_costs=costs))]
    if profile is not None:
        policies.append((f"SV(k={sv_k}, batch costs)", SV(profile, k=sv_k, batch_latency=costs.verify_time)))
    decoders = [(name, SpeculativeDecoder(target, draft, rule=Speculative(), policy=policy, sampling=Sampling(),
                                          companion=companion if policy.companion else None, eos_token_id=eos))
                for name, policy in policies]
    rows: list[GoodputRow] = []
    print(f"{'method':<28} {'B':>4} {'tokens':>7} {'modelled s':>11} {'goodput':>9} {'x best K':>9} {'x target':>9}")
    budget = args.max_new_tokens
    for batch in sizes:
        here = [decode_rows(decoder, prompts, batch, budget, costs, name) for name, decoder in decoders]
        best = max((r for r in here if r.method.startswith("Fixed")), key=lambda r: r.goodput)
        alone = batch / costs.target_time(batch, batch)
        for row in here:
            mark = " *" if row is best else ""
            print(f"{row.method + mark:<28} {batch:4d} {row.tokens:7d} {row.modelled_s:11.3f} {row.goodput:9.1f} "
                  f"{row.goodput / best.goodput:8.3f}x {row.goodput / alone:8.3f}x")
        rows += here
    print("goodput = tokens / modelled seconds of the batched forwards at the measured costs (prompts left out); "
          "* = best fixed K at that B")
    return rows
