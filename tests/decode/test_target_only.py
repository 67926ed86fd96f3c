"""The target alone through our own loop: no draft forward, one target forward per token, the target's own text."""

from __future__ import annotations

import torch

from decode import Sampling, SpeculativeDecoder, policies, rules


def test_the_target_alone_loop_calls_no_draft_and_matches_the_targets_greedy_generate(wide):
    target, draft = wide["target"], wide["draft"]
    greedy = SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policies.TargetOnly(),
                                sampling=Sampling(temperature=0.0), eos_token_id=None)
    prompt = torch.tensor([[1, 2, 3]])
    out = greedy.generate(prompt, max_new_tokens=10, seed=0)
    assert torch.equal(out.sequences, target.generate(prompt, max_new_tokens=10, do_sample=False))
    assert (out.stats.draft_calls, out.stats.drafted, out.stats.target_calls) == (0, 0, 10)
    sampled = SpeculativeDecoder(target, draft, policy=policies.TargetOnly(), eos_token_id=None)
    batch = sampled.generate([torch.tensor([1, 2, 3]), torch.tensor([4, 5])], max_new_tokens=7, seed=[0, 1])
    assert batch.totals.draft_calls == 0 and batch.totals.target_calls == 7 and batch.totals.tokens == 14
    assert not torch.equal(batch.sequences[0][3:], out.sequences[0][3:10])  # sampled, not the greedy text
