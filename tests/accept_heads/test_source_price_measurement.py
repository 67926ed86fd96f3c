"""The prices of the sources' own compute, as measured: an online fit is timed over a request's rounds, reset between
requests as decoding resets it, so a fit that restarts with each request is not priced on a longer one's data."""

from __future__ import annotations

import pytest

from accept_heads.measure.source_prices import measure_source_prices, request_rounds
from decode.policies.sources import AcceptanceSource
from decode.sampling import Sampling


class CountingFit(AcceptanceSource):
    """A folding source that records how many rounds it folded between resets."""

    name = "counting"
    folds = True

    def __init__(self) -> None:
        self.since_reset, self.longest = 0, 0

    def estimate(self, state) -> float:
        return 0.5

    def end_round(self, verified: int, accepted: int) -> None:
        self.since_reset += 1
        self.longest = max(self.longest, self.since_reset)

    def reset(self) -> None:
        self.since_reset = 0


@pytest.mark.parametrize(("rounds", "longest"), [(5, 5), (200, 20)])  # 200: one request longer than the timing
def test_a_folding_source_is_timed_over_requests_of_the_given_rounds(rounds, longest):
    source = CountingFit()
    prices = measure_source_prices([source], 8, Sampling(), rounds=rounds, repeats=20)
    assert source.longest == longest and set(prices) == {"counting"}
    assert prices["counting"].update >= 0.0


def test_a_request_is_half_its_token_budget_in_rounds():
    assert [request_rounds(n) for n in (1, 2, 48, 64)] == [1, 1, 24, 32]
