"""Heads reading what the draft's distribution cannot tell: the request so far (its running rate of accepted first
candidates, per row of a batch and afresh at each generation) and the round so far; an input the decoder cannot
supply is refused."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from decode import Sampling, SpeculativeDecoder, rules
from decode.artifacts.serialization import METADATA_KEY, load_head, save_head
from decode.head import PRE_FEATURES, AcceptanceHead
from decode.head_config import REQUEST_FEATURE, ROUND_FEATURE, TOP_K_FEATURES, HeadConfig
from decode.metadata import HeadMetadata
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


def test_the_round_so_far_is_the_summed_log_q_of_the_rounds_earlier_candidates(tiny):
    torch.manual_seed(6)
    features = (*PRE_FEATURES, *TOP_K_FEATURES, ROUND_FEATURE)
    head = AcceptanceHead(HeadConfig(tiny["draft"].config.hidden_size, depth=1, timing="pre", features=features))
    log: list = []

    class Recording(HeadEstimate):
        def predict(self, hidden, features):
            log.append(features.clone())
            return super().predict(hidden, features)

    policy = StopPolicy(Recording(head), Threshold(0.9, k_max=4))
    decoder = SpeculativeDecoder(tiny["target"], tiny["draft"], rule=rules.Speculative(), policy=policy,
                                 sampling=Sampling(), eos_token_id=None)
    decoder.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=24, seed=0)
    rounds, current = [], []
    for row in log:  # a round restarts where the round feature is back at 0
        if float(row[-1]) == 0.0 and current:
            rounds.append(current)
            current = []
        current.append(row)
    rounds.append(current)
    assert max(len(r) for r in rounds) > 1  # some rounds draft several candidates
    for round_features in rounds:
        for i, row in enumerate(round_features):
            assert float(row[-1]) == pytest.approx(sum(float(r[0]) for r in round_features[:i]), abs=1e-4)
            assert float(row[2]) >= float(row[3]) >= float(row[4]) >= float(row[5])  # top, then 2nd..4th


def test_a_head_reading_an_input_this_decoder_cannot_supply_is_refused_with_one_line(tmp_path):
    head = AcceptanceHead(HeadConfig(8, timing="pre", features=(*PRE_FEATURES, ROUND_FEATURE)))
    path = tmp_path / "head.safetensors"
    save_head(head, path, HeadMetadata(draft="micro", tokenizer_hash="x", rule=rules.Speculative().spec(),
                                       sampling=Sampling(), head_config=head.config))
    assert load_head(path).config.features == (*PRE_FEATURES, ROUND_FEATURE)  # recorded in its metadata
    # a head trained to read an input this decoder has no source for (a later version's, say)
    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as handle:
        header = handle.metadata()
    document = json.loads(header[METADATA_KEY])
    document["head_config"]["features"][-1] = "target_state"
    save_file(tensors, str(path), metadata={**header, METADATA_KEY: json.dumps(document)})
    with pytest.raises(ValueError, match="unknown head features") as refused:
        load_head(path)
    assert "\n" not in str(refused.value) and "target_state" in str(refused.value) and str(path) in str(refused.value)
