"""What each acceptance source's own compute costs on this machine (DESIGN §5, "every source pays for itself").

:func:`measure_source_prices` times each source's estimate of one candidate (:meth:`AcceptanceSource.estimate`: a
head's forward with its features, eager as the decoder runs it) and, for a source that folds rounds into an online fit
(:attr:`AcceptanceSource.folds`), one verified round's update (:meth:`AcceptanceSource.end_round`, its refits
amortised over a request's rounds, reset between requests as decoding resets it). The candidate is a draft output of
the heads' width and the draft's vocabulary, so the price does not depend on the draft's kind: what a source computes
from it is the same.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping

import torch

from decode.costs import SourcePrice
from decode.draft_round import DraftRound, DraftStep
from decode.head import AcceptanceHead
from decode.policies.sources import SOURCES, AcceptanceSource, HeadEstimate
from decode.sampling import Sampling


def median_seconds(call: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``call`` over ``repeats`` calls, after one warm-up."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def request_rounds(max_new_tokens: int) -> int:
    """The verified rounds of a request decoding ``max_new_tokens`` tokens, at two tokens a round (a round emits one
    at the least; DESIGN §5): how long an online fit that starts afresh at each request grows before it is reset."""
    return max(1, max_new_tokens // 2)


def folded_round_seconds(source: AcceptanceSource, state: DraftRound, repeats: int, rounds: int) -> float:
    """Mean seconds of an estimate and a verified round's update over ``repeats`` rounds (a periodic refit among them
    counts its share), the source reset every ``rounds`` rounds as decoding resets it at each request: a fit on one
    request's observations is priced at what it costs on that many."""
    def one_round(index: int) -> None:
        if index % rounds == 0:
            source.reset()
        source.estimate(state)
        source.end_round(1, 1)

    one_round(0)
    start = time.perf_counter()
    for index in range(repeats):
        one_round(index)
    return (time.perf_counter() - start) / repeats


def candidate_round(vocab_size: int, hidden_size: int, sampling: Sampling, seed: int = 0) -> DraftRound:
    """A round with one proposed candidate: random draft logits ``[V]`` and hidden state ``[H]``, and the draft's
    output after it consumed the candidate (what a ``post`` head reads)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab_size, generator=generator)
    state = DraftRound(sampling)
    state.next = DraftStep(logits, torch.randn(hidden_size, generator=generator), torch.tensor(0))
    state.draw(logits.argmax())
    state.next = DraftStep(logits, torch.randn(hidden_size, generator=generator), logits.argmax())  # fed y (post)
    return state


def deployable_sources(heads: Mapping[str, AcceptanceHead]) -> list[AcceptanceSource]:
    """One of every registered source a serving policy can stop on: the training-free ones, and each head-reading
    one per head in ``heads`` (the hindsight bound is free: its reads are uncounted)."""
    built: list[AcceptanceSource] = []
    for kind in SOURCES.values():
        if kind.needs_hindsight:
            continue
        if kind.reads == "head":
            built += [kind(head) for head in heads.values()]
        else:
            built.append(kind(**({kind.parameter: 1.0} if kind.parameter else {})))
    return built


def measure_source_prices(sources: Iterable[AcceptanceSource], vocab_size: int, sampling: Sampling, *,
                          rounds: int, repeats: int = 200) -> dict[str, SourcePrice]:
    """Each source's :class:`~decode.costs.SourcePrice` by its price key, measured in this process: the median of
    ``repeats`` estimates, and for a folding source the mean of ``repeats`` verified rounds (estimate and update),
    reset every ``rounds`` rounds (a request's: :func:`request_rounds`), less its estimate."""
    prices: dict[str, SourcePrice] = {}
    with torch.inference_mode():
        for source in sources:
            key = source.price_key
            if key is None or key in prices:
                continue
            hidden = source.head.config.hidden_size if isinstance(source, HeadEstimate) else 1
            state = candidate_round(vocab_size, hidden, sampling)
            source.reset()
            estimate = median_seconds(lambda source=source: source.estimate(state), repeats)
            update = 0.0
            if source.folds:
                update = max(folded_round_seconds(source, state, repeats, rounds) - estimate, 0.0)
            source.reset()
            prices[key] = SourcePrice(estimate, update)
    return prices
