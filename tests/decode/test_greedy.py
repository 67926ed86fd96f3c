"""The greedy rule reproduces the target's own greedy ``generate`` under every length policy."""

from __future__ import annotations

import pytest
import torch

from decode import HeadConfig, SpeculativeDecoder, SVProfile, policies, rules
from decode.head import PRE_FEATURES, AcceptanceHead

N_PROMPTS = 20
MAX_NEW = 24


def prompts(vocab: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randint(0, vocab, (1, int(torch.randint(1, 8, (1,), generator=generator))), generator=generator)
        for _ in range(N_PROMPTS)
    ]


def greedy_policies(models: dict) -> dict[str, policies.Policy]:
    torch.manual_seed(3)
    hidden = models["draft"].config.hidden_size
    pre = AcceptanceHead(HeadConfig(hidden, depth=2, timing="pre", features=PRE_FEATURES, companion_features=True))
    post = AcceptanceHead(HeadConfig(hidden, depth=2, timing="post"))
    profile = SVProfile(
        x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 0.5, 1.0]),
        table=torch.tensor([[0.2, 0.6], [0.5, 0.9]]), counts=torch.ones(2, 2), latency=torch.tensor([1.0, 1.1, 1.2]),
    )
    return {
        "fixed1": policies.Fixed(1),
        "fixed5": policies.Fixed(5),
        "heuristic": policies.Heuristic(),
        "confidence": policies.Confidence(tau=0.3),
        "head_pre": policies.Head(pre, threshold=0.5),
        "head_post": policies.Head(post, threshold=0.5, k_min=2),
        "sv": policies.SV(profile, k=5),
        "oracle": policies.Oracle(),
    }


@pytest.fixture(scope="module")
def references(wide):
    return [
        wide["target"].generate(p, max_new_tokens=MAX_NEW, do_sample=False, min_new_tokens=MAX_NEW)
        for p in prompts(wide["target"].config.vocab_size)
    ]


@pytest.mark.parametrize(
    "policy_name", ["fixed1", "fixed5", "heuristic", "confidence", "head_pre", "head_post", "sv", "oracle"]
)
def test_greedy_matches_target_generate(wide, references, policy_name):
    policy = greedy_policies(wide)[policy_name]
    companion = wide["companion"] if policy.companion is not None else None
    decoder = SpeculativeDecoder(
        wide["target"], wide["draft"], rule=rules.Greedy(), policy=policy, companion=companion, eos_token_id=None
    )
    for prompt, reference in zip(prompts(wide["target"].config.vocab_size), references):
        out = decoder.generate(prompt, max_new_tokens=MAX_NEW, seed=1)
        assert torch.equal(out.sequences, reference), f"{policy_name} diverged on prompt {prompt.tolist()}"


def test_speculative_at_temperature_zero_is_greedy(wide, references):
    from decode import Sampling

    decoder = SpeculativeDecoder(
        wide["target"], wide["draft"], rule=rules.Speculative(), policy=policies.Fixed(3),
        sampling=Sampling(temperature=0.0), eos_token_id=None,
    )
    for prompt, reference in zip(prompts(wide["target"].config.vocab_size)[:5], references):
        assert torch.equal(decoder.generate(prompt, max_new_tokens=MAX_NEW).sequences, reference)
