"""The decoder behind transformers' ``generate(custom_generate=...)``: same sequences, lossless, HF conventions."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from decode import Sampling, SpeculativeDecoder, SpeculativeGenerateOutput, policies, rules, speculative_generate
from decode.metadata import HeadMetadata
from tests.helpers.exact_distribution import (
    LENGTH,
    PROMPT,
    AcceptAll,
    exact_distribution,
    random_head,
    target_only,
    tv_bound,
)

WIDE_PROMPT = torch.tensor([[5, 17, 42, 8, 77]])


class Recorder(BaseStreamer):
    """A streamer that keeps what it is given."""

    def __init__(self) -> None:
        self.puts: list[torch.Tensor] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.clone())

    def end(self) -> None:
        self.ended += 1


def head_policy(models: dict) -> policies.Head:
    return policies.Head(random_head(models, "post"), threshold=0.66, k_max=6)


def door(models: dict, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    kwargs.setdefault("pad_token_id", 0)
    kwargs.setdefault("attention_mask", torch.ones_like(ids))  # else generate reads the pad id 0 in a prompt as padding
    return models["target"].generate(ids, custom_generate=speculative_generate, draft_model=models["draft"], **kwargs)


def ours(models: dict, policy: policies.Policy, sampling: Sampling | None = None,
         rule: rules.Rule | None = None) -> SpeculativeDecoder:
    """Our decoder on ``models`` (greedy sampling and rule unless given)."""
    return SpeculativeDecoder(models["target"], models["draft"], rule=rule or rules.Greedy(), policy=policy,
                              sampling=sampling or Sampling(temperature=0.0), eos_token_id=None)


def test_greedy_through_generate_equals_our_decoder_for_one_prompt(wide):
    policy = head_policy(wide)
    got = door(wide, WIDE_PROMPT, policy=policy, do_sample=False, max_new_tokens=24)
    expected = ours(wide, policy).generate(WIDE_PROMPT, max_new_tokens=24).sequences
    assert torch.equal(got, expected)
    # and what the target alone decodes greedily: the greedy rule is lossless
    assert torch.equal(got, wide["target"].generate(WIDE_PROMPT, do_sample=False, max_new_tokens=24, pad_token_id=0))


def test_a_head_given_alone_stops_at_its_chosen_h_and_the_k_range_it_records(wide):
    head = random_head(wide, "post")
    head.metadata = HeadMetadata(draft="draft", tokenizer_hash="x", rule=rules.Greedy().spec(),
                                 sampling=Sampling(temperature=0.0), head_config=head.config, k_min=1, k_max=6)
    head.threshold = 0.66  # as load_head reads it from the evaluation's record

    def calls(policy: policies.Policy) -> tuple[int, int]:
        stats = ours(wide, policy).generate(WIDE_PROMPT, max_new_tokens=24).stats
        return stats.target_calls, stats.draft_calls

    (got,) = door(wide, WIDE_PROMPT, head=head, do_sample=False, max_new_tokens=24, return_dict_in_generate=True).stats
    assert (got.target_calls, got.draft_calls) == calls(policies.Head(head, threshold=0.66, k_max=6))
    assert calls(policies.Head(head, threshold=0.66, k_max=6)) != calls(policies.Head(head, threshold=0.05, k_max=20))


def test_greedy_through_generate_equals_our_decoder_for_a_padded_batch(wide):
    ids = torch.tensor([[0, 0, 5, 17, 42], [9, 3, 33, 12, 70], [0, 0, 0, 61, 2]])
    mask = (torch.arange(5)[None, :] >= torch.tensor([2, 0, 3])[:, None]).long()
    policy = head_policy(wide)
    got = door(wide, ids, attention_mask=mask, policy=policy, do_sample=False, max_new_tokens=16, pad_token_id=95)
    expected = ours(wide, policy).generate(ids, attention_mask=mask, max_new_tokens=16)
    assert torch.equal(got[:, :5], ids)
    for row, (sequence, n) in enumerate(zip(expected.sequences, expected.prompt_lengths)):
        assert torch.equal(got[row, 5 : 5 + len(sequence) - n], sequence[n:])
    assert got.shape[1] == 5 + 16


def test_sampling_through_generate_is_lossless_with_a_negative_control(tiny):
    """Temperature and top-k reach the decoder through generate's own processors; the sequence distribution is
    the target's under that transform, exactly (mean + 5 sd of honest samples of the same size)."""
    sampling = Sampling(temperature=0.7, top_k=3)
    exact = exact_distribution(tiny, target_only, sampling)
    n = 1000
    bound = tv_bound(exact, n)
    weights = torch.tensor([4 ** (LENGTH - 1 - j) for j in range(LENGTH)])

    def tv(rule: rules.Rule) -> float:
        counts = torch.zeros(4**LENGTH, dtype=torch.float64)
        for seed in range(n):
            out = door(tiny, PROMPT, policy=head_policy(tiny), rule=rule, seed=seed, do_sample=True, temperature=0.7,
                       top_k=3, max_new_tokens=LENGTH)
            counts[int((out[0, PROMPT.shape[1] :] * weights).sum())] += 1
        return float(0.5 * (counts / n - exact).abs().sum())

    assert tv(rules.Speculative()) <= bound
    assert tv(AcceptAll()) > bound  # a rule that accepts every candidate samples the draft


def test_the_seed_comes_from_torch_when_not_given(wide):
    def sample(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return door(wide, WIDE_PROMPT, policy=policies.Fixed(3), do_sample=True, top_k=0, max_new_tokens=20)

    assert torch.equal(sample(1), sample(1))
    assert any(not torch.equal(sample(1), sample(s)) for s in (2, 3, 4))


def test_the_streamer_receives_the_prompt_then_every_token(wide):
    recorder = Recorder()
    loop = functools.partial(speculative_generate, streamer=recorder)
    out = wide["target"].generate(WIDE_PROMPT, custom_generate=loop, draft_model=wide["draft"],
                                  policy=policies.Fixed(4), do_sample=False, max_new_tokens=20, pad_token_id=0)
    assert torch.equal(recorder.puts[0], WIDE_PROMPT)
    assert len(recorder.puts) > 2  # once per round, not once at the end
    assert torch.equal(torch.cat([p.flatten() for p in recorder.puts[1:]]), out[0, WIDE_PROMPT.shape[1] :])
    assert recorder.ended == 1


def test_stopping_criteria_end_the_generation_after_the_round_that_meets_them(wide):
    class AtLeast(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= WIDE_PROMPT.shape[1] + 7)

    full = door(wide, WIDE_PROMPT, policy=policies.Fixed(3), do_sample=False, max_new_tokens=30)
    cut = door(wide, WIDE_PROMPT, policy=policies.Fixed(3), do_sample=False, max_new_tokens=30,
               stopping_criteria=StoppingCriteriaList([AtLeast()]))
    generated = cut.shape[1] - WIDE_PROMPT.shape[1]
    assert 7 <= generated <= 7 + 3  # a round commits at most K + 1 tokens
    assert torch.equal(cut, full[:, : cut.shape[1]])


def test_return_dict_carries_the_stats_and_eos_ends_a_row(wide):
    out = door(wide, WIDE_PROMPT, policy=policies.Fixed(3), do_sample=False, max_new_tokens=20,
               return_dict_in_generate=True)
    assert isinstance(out, SpeculativeGenerateOutput)
    assert out.stats[0].generated == out.sequences.shape[1] - WIDE_PROMPT.shape[1] == 20
    eos = int(out.sequences[0, WIDE_PROMPT.shape[1] + 4])
    stopped = door(wide, WIDE_PROMPT, policy=policies.Fixed(3), do_sample=False, max_new_tokens=20, eos_token_id=eos)
    assert stopped.shape[1] <= WIDE_PROMPT.shape[1] + 5 and int(stopped[0, -1]) == eos


def test_what_the_decoder_cannot_honour_is_refused_in_one_line(wide):
    cases = [
        ({"repetition_penalty": 1.3, "do_sample": True}, "RepetitionPenaltyLogitsProcessor"),
        ({"output_scores": True, "return_dict_in_generate": True}, "output_scores"),
        ({"num_beams": 2}, "num_beams=1"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            door(wide, WIDE_PROMPT, max_new_tokens=4, **kwargs)
    with pytest.raises(ValueError, match="draft_model=draft"):
        wide["target"].generate(WIDE_PROMPT, custom_generate=speculative_generate, assistant_model=wide["draft"],
                                max_new_tokens=4, pad_token_id=0)
