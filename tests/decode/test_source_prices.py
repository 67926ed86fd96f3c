"""Every acceptance source pays for its own compute (DESIGN §5): counted calls, priced once each."""

from __future__ import annotations

import pytest
import torch

from decode import SpeculativeDecoder, rules
from decode.costs import CostModel, SourcePrice
from decode.draft_round import DraftRound
from decode.head import AcceptanceHead
from decode.head_config import PRE_FEATURES, HeadConfig
from decode.policies.sources import (
    AcceptanceSource,
    DraftConfidence,
    HeadEstimate,
    OnlineMargin,
    TrueAcceptance,
    VLLMEstimator,
)
from decode.policies.stop_policy import StopPolicy
from decode.policies.stops import Goodput, Threshold
from decode.stats import DecodeStats


class Counting(AcceptanceSource):
    """A source that says 0.99 for every candidate and counts its own calls (not registered: a test's)."""

    name = "counting"

    def __init__(self, folds: bool = False) -> None:
        self.folds = folds
        self.calls = self.rounds = 0

    def estimate(self, state: DraftRound) -> float:
        self.calls += 1
        return 0.99

    def end_round(self, verified: int, accepted: int) -> None:
        self.rounds += 1


PRICED = CostModel(t_draft=0.01, t_target=0.1, t_companion=0.0,
                   sources=(("counting", SourcePrice(estimate=0.002, update=0.005)),))


def test_a_head_called_three_times_in_a_round_adds_three_of_its_steps():
    stats = DecodeStats(target_calls=1, draft_calls=3, verified_per_round=[3], source_key="counting", source_calls=3,
                        source_updates=1)
    assert PRICED.time(stats) == pytest.approx(3 * 0.01 + 0.1 + 3 * 0.002 + 0.005)
    free = CostModel(t_draft=0.01, t_target=0.1, t_companion=0.0)  # negative control: a model without source prices
    assert free.time(stats) == pytest.approx(3 * 0.01 + 0.1)
    assert PRICED.time(DecodeStats(target_calls=1, draft_calls=3, verified_per_round=[3])) == free.time(stats)


def test_a_model_with_prices_refuses_a_source_it_does_not_price():
    stats = DecodeStats(target_calls=1, draft_calls=1, verified_per_round=[1], source_key="head[0123abcd]",
                        source_calls=1)
    with pytest.raises(ValueError, match="no price for acceptance source 'head\\[0123abcd\\]'"):
        PRICED.time(stats)


@pytest.mark.parametrize("folds", [False, True])
@pytest.mark.parametrize("batched", [False, True])
def test_the_decoder_counts_every_estimate_and_every_folded_round(wide, folds, batched):
    source = Counting(folds)
    policy = StopPolicy(source, Threshold(0.9, k_min=1, k_max=3))
    decoder = SpeculativeDecoder(wide["target"], wide["draft"], rule=rules.Speculative(), policy=policy)
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    if batched:  # the rows share the source (its fresh() is itself), so its own count is the batch's
        every = decoder.generate(prompts, max_new_tokens=24, seed=[0, 1]).stats
    else:
        every = [decoder.generate(prompt, max_new_tokens=24, seed=i).stats for i, prompt in enumerate(prompts)]
    assert sum(s.source_calls for s in every) == source.calls  # each estimate counted once
    assert sum(s.source_updates for s in every) == (source.rounds if folds else 0)
    for stats in every:
        assert stats.source_key == "counting"
        assert stats.source_calls == stats.drafted > 0  # one estimate per drafted candidate under this stop
        assert stats.source_updates == (stats.rounds if folds else 0)
        fixed = CostModel(t_draft=0.01, t_target=0.1, t_companion=0.0).time(stats)
        assert PRICED.time(stats) == pytest.approx(fixed + 0.002 * stats.drafted + 0.005 * stats.source_updates)


def test_the_goodput_stop_prices_its_source_per_candidate_and_per_round():
    policy = StopPolicy(Counting(folds=True), Goodput(PRICED))
    assert policy.stop.step_cost() == pytest.approx(0.01 + 0.002)
    unpriced = StopPolicy(Counting(folds=True), Goodput(CostModel(t_draft=0.01, t_target=0.1, t_companion=0.0)))
    assert unpriced.stop.step_cost() == pytest.approx(0.01)
    policy.stop.end_round(drafted=2, verified=2, accepted=2, extra_draft_call=False)
    unpriced.stop.end_round(drafted=2, verified=2, accepted=2, extra_draft_call=False)
    assert policy.stop.seconds - unpriced.stop.seconds == pytest.approx(2 * 0.002 + 0.005)


def test_price_keys_say_what_is_priced():
    assert DraftConfidence().price_key == "confidence" and not DraftConfidence.folds
    assert OnlineMargin.folds and VLLMEstimator.folds
    assert TrueAcceptance().price_key is None  # a bound: its hindsight reads are free, as the oracle's are
    assert StopPolicy(TrueAcceptance(), Threshold(0.5)).price_key is None


def test_a_heads_key_follows_its_shape_not_its_weights():
    def head(hidden: int, seed: int) -> AcceptanceHead:
        torch.manual_seed(seed)
        return AcceptanceHead(HeadConfig(hidden_size=hidden, timing="pre", features=PRE_FEATURES))

    same = HeadEstimate(head(16, 0)).price_key
    assert same == HeadEstimate(head(16, 1)).price_key and same.startswith("head[")
    assert same != HeadEstimate(head(32, 0)).price_key
