"""A head reading the request so far: the decoder feeds it the request's running rate of accepted first candidates,
per row of a batch and afresh at each generation."""

from __future__ import annotations

import pytest
import torch

from decode import Sampling, SpeculativeDecoder, rules
from decode.head import PRE_FEATURES, AcceptanceHead
from decode.head_config import REQUEST_FEATURE, HeadConfig
from decode.policies.sources import HeadEstimate
from decode.policies.stop_policy import StopPolicy
from decode.policies.stops import Threshold


class RecordingHead(HeadEstimate):
    """Records the request feature of every candidate it estimates, with the rounds seen before it."""

    def __init__(self, head: AcceptanceHead, log: list) -> None:
        super().__init__(head)
        self.log = log

    def predict(self, hidden, features):
        self.log.append((float(features[..., -1]), self.first_accepted, self.rounds))
        return super().predict(hidden, features)


def test_the_request_rate_counts_rounds_that_accepted_their_first_candidate():
    source = HeadEstimate(AcceptanceHead(HeadConfig(8, timing="pre", features=(*PRE_FEATURES, REQUEST_FEATURE))))
    assert source.request_acceptance == 0.5
    for verified, accepted in [(3, 3), (2, 0), (4, 1), (0, 0)]:  # a round with nothing verified is not counted
        source.end_round(verified, accepted)
    assert source.request_acceptance == pytest.approx((2 + 1) / (3 + 2))
    fresh = source.fresh()
    assert fresh.request_acceptance == 0.5 and source.request_acceptance == pytest.approx(3 / 5)
    source.reset()
    assert source.request_acceptance == 0.5


def test_the_decoder_feeds_the_head_its_requests_own_history(tiny):
    torch.manual_seed(5)
    head = AcceptanceHead(HeadConfig(tiny["draft"].config.hidden_size, depth=1, timing="pre",
                                     features=(*PRE_FEATURES, REQUEST_FEATURE)))
    log: list = []
    policy = StopPolicy(RecordingHead(head, log), Threshold(0.3, k_max=4))
    decoder = SpeculativeDecoder(tiny["target"], tiny["draft"], rule=rules.Speculative(), policy=policy,
                                 sampling=Sampling(), eos_token_id=None)
    first = decoder.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=24, seed=0)
    assert log[0][1:] == (0, 0) and log[0][0] == pytest.approx(0.5)  # no round yet: the prior's rate
    assert all(value == pytest.approx((a + 1) / (n + 2)) for value, a, n in log)
    assert log[-1][2] > 0 and first.stats.accepted_per_round  # later rounds read the history
    seen = len(log)
    decoder.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=24, seed=0)
    assert log[seen][1:] == (0, 0)  # a new generation starts a new request
    assert [v for v, _, _ in log[seen:]] == [v for v, _, _ in log[:seen]]  # the same seed, the same decisions
