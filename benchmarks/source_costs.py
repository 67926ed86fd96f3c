"""What each acceptance source's own step costs beside the draft's step (issue 78's "every source pays for itself").

    python -m benchmarks.source_costs [--draft zoo:draft] [--context 64] [--repeats 200]

The draft decodes one token after a ``--context``-token prefix (its KV cache kept), timed over ``--repeats // 4``
forwards (median); each registered source's price is what the evaluation measures
(:func:`accept_heads.measure.source_prices.measure_source_prices`: the median estimate of one candidate, and an
online source's mean folded round); a head is a randomly initialised one of the demo's shape (its cost does not
depend on its weights). The perfect predictor reads the target in hindsight: free, left out. The cost model charges
these prices once per call a decode counts (``decode.costs.CostModel``, ``cost.source=measured``).
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table
from transformers import DynamicCache

from accept_heads.measure.source_prices import (
    deployable_sources,
    measure_source_prices,
    median_seconds,
    request_rounds,
)
from ahconf.entry import quiet_library_output
from decode.artifacts.hub import load_causal_lm
from decode.cache_api import cache_kwargs, drop_last
from decode.head import AcceptanceHead
from decode.head_config import PRE_FEATURES, HeadConfig
from decode.sampling import Sampling
from decode.timing import machine_class
from runtime.schemes import resolve_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.source_costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", default="zoo:draft", help="the draft (a zoo: / real: id, a path or a hub id)")
    parser.add_argument("--context", type=int, default=64, help="tokens in the draft's cache before the timed step")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=64,
                        help="a request's token budget: an online fit is reset after its rounds")
    args = parser.parse_args(argv)
    quiet_library_output()
    torch.set_num_threads(1)
    draft = load_causal_lm(resolve_id(args.draft))
    prefix = torch.randint(0, draft.config.vocab_size, (1, args.context), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        cache = DynamicCache()
        out = draft(input_ids=prefix, output_hidden_states=True, **cache_kwargs(draft, cache))
        token = out.logits[0, -1].argmax().view(1, 1)

        def draft_step() -> None:
            draft(input_ids=token, output_hidden_states=True, **cache_kwargs(draft, cache))
            drop_last(cache, 1)

        step_us = 1e6 * median_seconds(draft_step, max(1, args.repeats // 4))
        head = AcceptanceHead(HeadConfig(hidden_size=draft.config.hidden_size, timing="pre", features=PRE_FEATURES))
        prices = measure_source_prices(deployable_sources({"demo": head.eval()}), draft.config.vocab_size, Sampling(),
                                       rounds=request_rounds(args.max_new_tokens), repeats=args.repeats)
        table = Table(title=f"each source's step beside the draft's ({args.draft}, {machine_class(draft.device)}, "
                            f"medians of {args.repeats})")
        for column in ("source", "estimate (µs)", "fold a round (µs)", "estimate ÷ draft step"):
            table.add_column(column, justify="left" if column == "source" else "right")
        table.add_row("draft step", f"{step_us:.0f}", "", "1")
        for key, price in prices.items():
            estimate = 1e6 * price.estimate
            table.add_row(key, f"{estimate:.0f}", f"{1e6 * price.update:.0f}", f"{estimate / step_us:.3f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
