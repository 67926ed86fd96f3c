"""What each acceptance source's own step costs beside the draft's step (issue 78's "every source pays for itself").

    python -m benchmarks.source_costs [--draft zoo:draft] [--context 64] [--repeats 200]

The draft decodes one token after a ``--context``-token prefix (its KV cache kept); each registered source then
estimates ``P̂`` of that candidate from the same draft output (:meth:`AcceptanceSource.estimate`), and an online
source folds one verified round (:meth:`AcceptanceSource.end_round`). Each is timed ``--repeats`` times in this process
(medians; the draft step over ``--repeats // 4`` forwards); a head is a randomly initialised one of the demo's
shape (its cost does not depend on its weights). The perfect predictor reads the target in hindsight: not a
deployable cost, left out. The cost model does not count these calls yet (``decode.costs.CostModel``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table
from transformers import DynamicCache

from ahconf.entry import quiet_library_output
from decode.artifacts.hub import load_causal_lm
from decode.cache_api import cache_kwargs, drop_last
from decode.draft_round import DraftRound, DraftStep
from decode.head import AcceptanceHead
from decode.head_config import PRE_FEATURES, HeadConfig
from decode.policies.sources import SOURCES, AcceptanceSource, HeadEstimate, TrueAcceptance
from decode.sampling import Sampling
from decode.timing import machine_class
from runtime.schemes import resolve_id


def median_us(call: Callable[[], object], repeats: int) -> float:
    """Median microseconds of ``call`` over ``repeats`` calls, after one warm-up."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def sources(hidden_size: int) -> dict[str, AcceptanceSource]:
    """One of every registered source that needs no hindsight (heads: a ``pre`` head of the demo's shape)."""
    head = AcceptanceHead(HeadConfig(hidden_size=hidden_size, timing="pre", features=PRE_FEATURES)).eval()
    built: dict[str, AcceptanceSource] = {}
    for name, kind in SOURCES.items():
        if issubclass(kind, TrueAcceptance):
            continue
        built[name] = kind(head) if issubclass(kind, HeadEstimate) else kind()
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.source_costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", default="zoo:draft", help="the draft (a zoo: / real: id, a path or a hub id)")
    parser.add_argument("--context", type=int, default=64, help="tokens in the draft's cache before the timed step")
    parser.add_argument("--repeats", type=int, default=200)
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

        step_us = median_us(draft_step, max(1, args.repeats // 4))
        state = DraftRound(Sampling())
        state.next = DraftStep(out.logits[0, -1], out.hidden_states[-1][0, -1], prefix[0, -1])
        state.draw(token[0, 0])
        table = Table(title=f"each source's step beside the draft's ({args.draft}, {machine_class(draft.device)}, "
                            f"medians of {args.repeats})")
        for column in ("source", "estimate (µs)", "fold a round (µs)", "estimate ÷ draft step"):
            table.add_column(column, justify="left" if column == "source" else "right")
        table.add_row("draft step", f"{step_us:.0f}", "", "1")
        for name, source in sources(draft.config.hidden_size).items():
            estimate = median_us(lambda source=source: source.estimate(state), args.repeats)
            fold = median_us(lambda source=source: (source.estimate(state), source.end_round(1, 1)), args.repeats)
            table.add_row(name, f"{estimate:.0f}", f"{max(fold - estimate, 0.0):.0f}", f"{estimate / step_us:.3f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
