"""``python -m decode.bench --batch-sizes 1 8 32 --goodput [--head PATH]``: modelled goodput per batch size.

Measures the batch costs of the pair on this device (:func:`decode.batch_costs.measure_batch_costs`),
decodes the same ``max(B)`` prompts in batches of each size ``B`` with batched ``Fixed(K)`` for every ``K`` of
``--k-grid`` and, given a trained head, with ``Head(h)`` and the batch-aware ``GoodputHead`` (no
threshold), and prices every generation's forwards with the measured costs
(:meth:`BatchCosts.modelled_seconds`, prompts left out). Goodput = generated tokens / modelled
seconds; each method is compared with the best fixed K at the same ``B`` and with the target alone
(one token per row per forward: ``B / t_t(B, B)``). Modelled, so free of timer noise; the table of
measured costs is printed first.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from decode.batch_costs import BatchCosts, measure_batch_costs
from decode.costs import CostModel, LatencyShape
from decode.decoder import SpeculativeDecoder
from decode.export import load_head
from decode.policies import Fixed, GoodputHead, Head, Policy
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


def batch_one_costs(costs: BatchCosts) -> CostModel:
    """The batch-1 cost model of the same measurements (what ``GoodputHead`` uses outside a batch): ``t_t``
    verifies one candidate (two tokens fed), the shape follows the measured lengths."""
    verify = [costs.verify_time(1, candidates) for candidates in range(1, len(costs.target[0]))]
    return CostModel(t_draft=costs.draft_time(1), t_target=verify[0], t_companion=0.0,
                     latency=LatencyShape(tuple(t / verify[0] for t in verify)))


def decode_rows(target: PreTrainedModel, draft: PreTrainedModel, policy: Policy, prompts: list[torch.Tensor],
                batch: int, budget: int, eos: int | list[int] | None, costs: BatchCosts, name: str) -> GoodputRow:
    """Decode all ``prompts`` in consecutive batches of ``batch`` with ``policy`` and price their forwards."""
    decoder = SpeculativeDecoder(target, draft, rule=Speculative(), policy=policy, sampling=Sampling(),
                                 eos_token_id=eos)
    tokens, seconds = 0, 0.0
    for start in range(0, len(prompts), batch):
        totals = decoder.generate_batch(prompts[start : start + batch], max_new_tokens=budget, seed=start).totals
        tokens += totals.tokens
        seconds += costs.modelled_seconds(totals.target_shapes, totals.draft_shapes)
    return GoodputRow(name, batch, tokens, seconds)


def run_goodput(args: argparse.Namespace, target: PreTrainedModel, draft: PreTrainedModel, prompts: list[torch.Tensor],
                eos: int | list[int] | None) -> list[GoodputRow]:
    """The ``--goodput`` comparison; prints the measured costs and one table, returns its rows."""
    sizes = sorted(set(args.batch_sizes))
    costs = measure_batch_costs(target, draft, batches=sizes, max_length=max(args.k_grid) + 1)
    print("measured costs (ms): B, draft forward, target forward at 1..L tokens per row")
    for b, draft_s, row in zip(costs.batches, costs.draft, costs.target):
        print(f"  {b:4d} {1e3 * draft_s:8.2f}  " + " ".join(f"{1e3 * t:.2f}" for t in row))
    head = load_head(args.head, draft=draft, sampling=Sampling(), rule=Speculative()) if args.head else None
    rows: list[GoodputRow] = []
    print(f"{'method':<28} {'B':>4} {'tokens':>7} {'modelled s':>11} {'goodput':>9} {'x best K':>9} {'x target':>9}")
    budget = args.max_new_tokens
    for batch in sizes:
        here = [decode_rows(target, draft, Fixed(k), prompts, batch, budget, eos, costs, f"Fixed({k})")
                for k in args.k_grid]
        if head is not None:
            here.append(decode_rows(target, draft, Head(head, threshold=args.threshold), prompts, batch, budget, eos,
                                    costs, f"Head(h={args.threshold})"))
            goodput = GoodputHead(head, batch_one_costs(costs), batch_costs=costs)
            here.append(decode_rows(target, draft, goodput, prompts, batch, budget, eos, costs,
                                    "GoodputHead (batch costs)"))
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
