"""Every model family the experiments name decodes exactly, also far past a sliding window (issue 17).

Tiny random-init models are built from configs (no hub): per family a target, a draft and a
companion (perturbed copies of the target, so that they agree often but not always). Mistral has a
sliding window on every layer, Gemma-2/3 alternate a local (sliding) and a global layer; the window
is WINDOW tokens, and 40 new tokens make every cache roll back well past it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedModel, Qwen3NextConfig, Qwen3NextForCausalLM

from decode import EnsembleDecoder, HeadConfig, Sampling, SpeculativeDecoder, SVProfile, policies, rules
from decode.head import AcceptanceHead
from decode.loops.runner import ModelRunner
from tests.helpers.ensemble import GAMMAS, make_fn, members, reference_greedy
from tests.helpers.exact_distribution import empirical, exact_distribution, report, target_only, tv_bound
from tests.helpers.families import FAMILIES, HIDDEN, VOCAB, WINDOW, build

MAX_NEW = 40
N_SAMPLES = 500
#: A prompt shorter than the window and one longer (the prefill alone passes it).
PROMPTS = [torch.tensor([[1, 2, 3, 4, 5]]), torch.arange(20, 32).view(1, -1)]
#: Which cache layers of each family slide (ModelRunner builds them from the config).
SLIDING_LAYERS = {"mistral": [True, True], "gemma2": [True, False], "gemma3": [True, False]}


def perturbed(model: PreTrainedModel, scale: float, seed: int) -> PreTrainedModel:
    """A copy of ``model`` with Gaussian noise of ``scale`` times each weight tensor's spread."""
    copied = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in copied.parameters():
            if weight.numel() > 1:
                weight.add_(scale * weight.std() * torch.randn(weight.shape, generator=generator))
    return copied


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> dict:
    """Target, draft, companion of one family and the target's greedy ``generate`` for each prompt."""
    target = build(request.param)
    models = {"name": request.param, "target": target, "draft": perturbed(target, 0.1, seed=2),
              "companion": perturbed(target, 0.2, seed=3)}
    models["references"] = [
        target.generate(p, max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, do_sample=False) for p in PROMPTS
    ]
    return models


@pytest.fixture
def rollbacks(monkeypatch) -> list[int]:
    """The target length of every :meth:`ModelRunner.rollback` that drops tokens."""
    seen: list[int] = []
    rollback = ModelRunner.rollback

    def recording(self: ModelRunner, length: int) -> None:
        if self.consumed > length:
            seen.append(length)
        rollback(self, length)

    monkeypatch.setattr(ModelRunner, "rollback", recording)
    return seen


def speculative_policies(hidden: int) -> dict[str, Callable[[], policies.Policy]]:
    """Policy factories; the head is a random post head for a draft of ``hidden`` size."""

    def head() -> policies.Policy:
        torch.manual_seed(4)
        return policies.Head(AcceptanceHead(HeadConfig(hidden, depth=2, timing="post")), threshold=0.5, k_min=2)

    profile = SVProfile(
        x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 0.5, 1.0]),
        table=torch.tensor([[0.2, 0.6], [0.5, 0.9]]), counts=torch.ones(2, 2), latency=torch.tensor([1.0, 1.1, 1.2]),
    )
    return {
        "fixed1": lambda: policies.Fixed(1),
        "fixed4": lambda: policies.Fixed(4),
        "head": head,
        "sv": lambda: policies.SV(profile, k=5),
    }


def test_each_family_gets_its_cache_layer_types(family):
    """The matrix covers full-attention, sliding-window and hybrid caches."""
    runner = ModelRunner(family["target"], VOCAB)
    assert runner.cache.is_sliding == SLIDING_LAYERS.get(family["name"], [False, False])


@pytest.mark.parametrize("family_name", list(SLIDING_LAYERS))
def test_the_window_shapes_the_greedy_output(family_name):
    """The parity checks have power: the same weights without a reachable window decode differently."""
    windowed, unbounded = build(family_name), build(family_name, window=1024)
    for prompt in PROMPTS:
        a = windowed.generate(prompt, max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, do_sample=False)
        b = unbounded.generate(prompt, max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, do_sample=False)
        assert not torch.equal(a, b)


@pytest.mark.parametrize("policy_name", ["fixed1", "fixed4", "head", "sv"])
def test_speculative_greedy_matches_target_generate(family, rollbacks, policy_name):
    policy = speculative_policies(family["draft"].config.hidden_size)[policy_name]()
    companion = family["companion"] if policy.companion is not None else None
    decoder = SpeculativeDecoder(
        family["target"], family["draft"], rule=rules.Greedy(), policy=policy, companion=companion, eos_token_id=None
    )
    accepted = 0
    for prompt, reference in zip(PROMPTS, family["references"]):
        out = decoder.generate(prompt, max_new_tokens=MAX_NEW)
        assert torch.equal(out.sequences, reference), f"{family['name']} {policy_name} on {prompt.tolist()}"
        accepted += out.stats.accepted
    assert accepted > 0
    assert max(rollbacks, default=0) >= WINDOW, "no rollback past the window: the check has no power"


@pytest.mark.parametrize("mode", ["sd", "alternate"])
def test_ensemble_greedy_is_argmax_of_r(family, rollbacks, mode):
    models = members(family, 2)
    decoder = EnsembleDecoder(
        models, make_fn("weighted", 2), GAMMAS[(mode, 2)], mode, Sampling(temperature=0.0), eos_token_id=None
    )
    for prompt in PROMPTS:
        reference = reference_greedy(models, "weighted", prompt, MAX_NEW)
        out = decoder.generate(prompt, max_new_tokens=MAX_NEW)
        assert torch.equal(out.sequences, reference), f"{family['name']} {mode} on {prompt.tolist()}"
    assert max(rollbacks, default=0) >= WINDOW, "no rollback past the window: the check has no power"


@pytest.mark.parametrize("family_name", list(SLIDING_LAYERS))
def test_runner_rolls_back_past_the_window_and_stays_within_it(family_name):
    """Cached logits equal from-scratch forwards across rollbacks; sliding layers keep < WINDOW states after each."""
    model = build(family_name)
    tokens = torch.randint(VOCAB, (1, 60), generator=torch.Generator().manual_seed(0))
    runner = ModelRunner(model, VOCAB)
    generator = torch.Generator().manual_seed(1)
    drops_past_window = 0
    while runner.consumed < 50:
        end = runner.consumed + int(torch.randint(1, 6, (), generator=generator))
        logits = runner.feed(tokens, end, keep=end - runner.consumed)
        with torch.no_grad():
            full = model(tokens[:, :end]).logits[0, -logits.shape[0] :].float()
        torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)
        drop = min(4, int(torch.randint(0, end - runner.floor + 1, (), generator=generator)))
        runner.rollback(end - drop)
        drops_past_window += drop > 0 and end - drop >= WINDOW
        assert runner.floor == runner.consumed == end - drop
        for layer in runner.cache.layers:
            if layer.is_sliding:
                assert layer.keys.shape[-2] == min(runner.consumed, WINDOW - 1)
    assert drops_past_window > 3
    with pytest.raises(RuntimeError, match=f"{type(model).__name__}: cannot roll back"):
        runner.rollback(runner.floor - 1)


def test_a_cache_that_cannot_roll_back_is_refused_by_name():
    """Recurrent linear-attention states cannot be cropped: a clear error, never a silently different output."""
    config = Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, layer_types=["linear_attention", "full_attention"],
        num_experts=2, num_experts_per_tok=1, moe_intermediate_size=HIDDEN, shared_expert_intermediate_size=HIDDEN,
        linear_num_value_heads=2, linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8,
        initializer_range=0.5, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(1)
    target = Qwen3NextForCausalLM(config).eval()
    decoder = SpeculativeDecoder(target, perturbed(target, 0.5, seed=2), rules.Greedy(), policies.Fixed(4),
                                 eos_token_id=None)
    with pytest.raises(RuntimeError, match="Qwen3NextForCausalLM: its cache layers .* cannot be rolled back"):
        decoder.generate(PROMPTS[0], max_new_tokens=MAX_NEW)


def test_sampling_is_exact_past_a_sliding_window(monkeypatch):
    """Speculative sampling on a vocabulary-4 Gemma-2 (window 4, prompt of 6) reproduces p exactly."""
    monkeypatch.setattr("tests.helpers.exact_distribution.PROMPT", torch.tensor([[0, 1, 2, 3, 2, 1]]))
    target = build("gemma2", seed=11, vocab=4, window=4)
    models = {"target": target, "draft": perturbed(target, 0.5, seed=12)}
    decoder = SpeculativeDecoder(target, models["draft"], rules.Speculative(), policies.Fixed(4), eos_token_id=None)
    expected = exact_distribution(models, target_only, Sampling())
    bound = tv_bound(expected, N_SAMPLES)
    tv = float(0.5 * (empirical(decoder, N_SAMPLES) - expected).abs().sum())
    report(f"gemma2 window 4 speculative-fixed4 n={N_SAMPLES}", tv, bound)
    assert tv <= bound
    unbounded = {"target": build("gemma2", seed=11, vocab=4, window=1024), "draft": models["draft"]}
    without_window = exact_distribution(unbounded, target_only, Sampling())
    assert float(0.5 * (without_window - expected).abs().sum()) > bound, "the window must matter to this check"
