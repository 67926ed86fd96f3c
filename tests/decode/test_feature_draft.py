"""A feature draft (EAGLE-style, :mod:`decode.drafts.feature_model`) decodes losslessly under every rule and policy.

Exactness is checked as in ``test_exact_distribution`` (the empirical distribution of 3-token continuations
against the enumerated one, TV bound from honest samples of the same size, negative controls), for one prompt
and in a batch; greedy decoding gives the target's greedy output; the draft reads the target's features from the
verifying forwards themselves (no extra target forward) and, past them, its own output.

The ensemble rules' ``r`` mixes ``p`` with the draft's ``q`` as drafted: a feature draft's ``q`` at a candidate
depends on its depth in the round (its own features past the first), so ``r`` is the enumerated mixture with the
target-fed ``q`` exactly where every candidate is a round's first (``Fixed(1)``; ``docs/design.md`` §8).
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from decode import Sampling, SpeculativeDecoder, policies, rules
from decode.artifacts.gguf import file_sha256
from decode.artifacts.hub import ModelLoadError, load_causal_lm
from decode.digests import Loaded
from decode.digests import loaded as record_of
from decode.drafts import FeatureDrafter, PlainDrafter, drafter_of
from decode.drafts.feature import FeatureFed
from decode.drafts.feature_model import BUILD_RECORD, FeatureDraftForCausalLM, target_features, teacher_forced_rounds
from decode.head import head_features
from decode.head_config import DEPTH_FEATURE, PRE_FEATURES, HeadConfig
from tests.helpers.batched import BATCH_BUDGETS, BATCH_PROMPTS, SAMPLE_ROWS, target_greedy, wide_prompts
from tests.helpers.exact_distribution import (
    LENGTH,
    N_DEFAULT,
    N_SLOW,
    POLICIES,
    PROMPT,
    RULES,
    AcceptAll,
    reference_warp,
    report,
    target_only,
    tv_bound,
)
from tests.helpers.micro_models import incremental_round_logits, micro_feature_draft, micro_lm


@pytest.fixture(scope="module")
def featured(tiny) -> dict:
    """The vocabulary-4 target and companion with a feature draft reading the target's last hidden states."""
    return {**tiny, "draft": micro_feature_draft(tiny["target"], seed=14, init=0.3)}


@pytest.fixture(scope="module")
def featured_wide(wide) -> dict:
    """The vocabulary-96 target with a feature draft that fuses two of its layers (EAGLE-3's fusion)."""
    return {**wide, "draft": micro_feature_draft(wide["target"], seed=24, hidden=16, feature_layers=(1, 2), init=0.3)}


@pytest.fixture(scope="module")
def featured_v2(tiny) -> dict:
    """The vocabulary-4 pair with a v2-recipe feature draft: EAGLE-3.1's norms and a rank-2 output layer over three
    of the four tokens (``q = 0`` on token 2, reached only through the residual)."""
    draft = micro_feature_draft(tiny["target"], seed=15, init=0.3, subset=[0, 1, 3], head_rank=2, feature_norm=True)
    return {**tiny, "draft": draft}


@pytest.fixture(scope="module")
def featured_eagle3(tiny) -> dict:
    """The vocabulary-4 pair with a draft whose first layer is EAGLE-3's (as vLLM loads it), over three tokens."""
    return {**tiny, "draft": micro_feature_draft(tiny["target"], seed=16, init=0.3, subset=[0, 1, 3],
                                                 first_layer="eagle3")}


@pytest.fixture(scope="module")
def featured_wide_eagle3(wide) -> dict:
    """The vocabulary-96 target with an EAGLE-3 first layer's draft fusing two of its layers, over 60 tokens."""
    return {**wide, "draft": micro_feature_draft(wide["target"], seed=29, hidden=16, feature_layers=(1, 2), init=0.3,
                                                 subset=list(range(60)), first_layer="eagle3", decoder_layers=2)}


WIDE_DRAFTS = ["featured_wide", "featured_wide_eagle3"]


def exact_distribution(models: dict, mix, sampling: Sampling) -> torch.Tensor:
    """Probability of each continuation of PROMPT, the draft reading the target's features at every position."""
    target, draft = models["target"], models["draft"]
    vocab = target.config.vocab_size
    conts = torch.tensor(list(itertools.product(range(vocab), repeat=LENGTH)))
    ids = torch.cat([PROMPT.expand(len(conts), -1), conts], dim=1)
    start, warp = PROMPT.shape[1] - 1, reference_warp(sampling)
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
        features = draft.fuse_features(target_features(out.hidden_states, draft.feature_layers))
        features = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)  # each reads the one before
        q = draft(input_ids=ids, features=features).logits
        p, q = (warp(x[:, start:start + LENGTH].double()) for x in (out.logits, q))
    return mix(p, q).gather(-1, conts.unsqueeze(-1)).squeeze(-1).prod(-1)


def decoder_for(models: dict, rule: rules.Rule, policy: policies.Policy, **kwargs) -> SpeculativeDecoder:
    companion = models["companion"] if policy.companion is not None else None
    kwargs.setdefault("eos_token_id", None)
    return SpeculativeDecoder(models["target"], models["draft"], rule=rule, policy=policy, companion=companion, **kwargs)


def one_prompt_tv(models: dict, rule: rules.Rule, mix, policy: policies.Policy, n: int) -> tuple[float, float]:
    decoder = decoder_for(models, rule, policy)
    counts = torch.zeros(decoder.vocab ** LENGTH, dtype=torch.float64)
    weights = torch.tensor([decoder.vocab ** (LENGTH - 1 - j) for j in range(LENGTH)])
    for seed in range(n):
        out = decoder.generate(PROMPT, max_new_tokens=LENGTH, seed=seed)
        counts[int((out.sequences[0, PROMPT.shape[1]:] * weights).sum())] += 1
    exact = exact_distribution(models, mix, Sampling())
    return float(0.5 * (counts / n - exact).abs().sum()), tv_bound(exact, n)


def batched_tv(models: dict, rule: rules.Rule, mix, policy: policies.Policy, n: int) -> tuple[float, float]:
    decoder = decoder_for(models, rule, policy)
    counts = torch.zeros(decoder.vocab ** LENGTH, dtype=torch.float64)
    weights = torch.tensor([decoder.vocab ** (LENGTH - 1 - j) for j in range(LENGTH)])
    for seed in range(n // len(SAMPLE_ROWS)):
        out = decoder.generate(BATCH_PROMPTS, max_new_tokens=BATCH_BUDGETS, seed=seed)
        for i in SAMPLE_ROWS:
            counts[int((out.sequences[i][PROMPT.shape[1]:] * weights).sum())] += 1
    exact = exact_distribution(models, mix, Sampling())
    return float(0.5 * (counts / counts.sum() - exact).abs().sum()), tv_bound(exact, n)


LOSSLESS = ("speculative",)  # to p under every policy; the ensembles' r as enumerated at Fixed(1) (docstring)
ALL_CASES = [f"{r}-{p}" for r, p in itertools.product(LOSSLESS, POLICIES)] + ["weighted-fixed1", "contrastive-fixed1"]
DEFAULT_CASES = [f"speculative-{p}" for p in ("fixed4", "confidence", "head_pre", "head_post", "sv", "perfect")] + [
    "weighted-fixed1", "contrastive-fixed1"]
BATCHED_CASES = ["speculative-fixed4", "speculative-head_post", "weighted-fixed1"]
V2_CASES = ["speculative-fixed4", "speculative-confidence", "weighted-fixed1"]


def case_parts(models: dict, case: str) -> tuple[rules.Rule, object, policies.Policy]:
    rule_name, policy_name = case.split("-")
    make_rule, mix = RULES[rule_name]
    return make_rule(), mix, POLICIES[policy_name](models)


@pytest.mark.parametrize("n", [N_DEFAULT, pytest.param(N_SLOW, marks=pytest.mark.slow)])
@pytest.mark.parametrize("case", DEFAULT_CASES)
def test_one_prompt_is_lossless(featured, case, n):
    tv, bound = one_prompt_tv(featured, *case_parts(featured, case), n)
    report(f"feature draft {case} n={n}", tv, bound)
    assert tv <= bound, f"{case}: TV {tv:.4f} exceeds {bound:.4f}"


@pytest.mark.parametrize("case", [*V2_CASES, *(pytest.param(c, marks=pytest.mark.slow)
                                                for c in sorted(set(ALL_CASES) - set(V2_CASES)))])
def test_the_v2_draft_kind_is_lossless(featured_v2, case):
    """The v2 recipe's options (normed features, a low-rank subset head that never proposes token 2) stay exact."""
    draft = featured_v2["draft"]
    with torch.no_grad():
        q = draft(input_ids=PROMPT, features=torch.randn(1, PROMPT.shape[1], draft.config.hidden_size)).logits
    assert q.softmax(-1)[0, :, 2].max() == 0 and draft.lm_head.down is not None
    tv, bound = one_prompt_tv(featured_v2, *case_parts(featured_v2, case), N_DEFAULT)
    report(f"feature draft v2 {case} n={N_DEFAULT}", tv, bound)
    assert tv <= bound, f"{case}: TV {tv:.4f} exceeds {bound:.4f}"


@pytest.mark.parametrize("case", [*V2_CASES, pytest.param("speculative-head_post", marks=pytest.mark.slow)])
def test_an_eagle3_first_layer_is_lossless(featured_eagle3, case):
    tv, bound = one_prompt_tv(featured_eagle3, *case_parts(featured_eagle3, case), N_DEFAULT)
    report(f"feature draft eagle3 {case} n={N_DEFAULT}", tv, bound)
    assert tv <= bound, f"{case}: TV {tv:.4f} exceeds {bound:.4f}"


def test_an_eagle3_first_layer_never_attends_the_first_position(featured_wide, featured_wide_eagle3):
    """The first position has no feature; vLLM's draft starts at the second token, and so does this one's attention
    (negative control: the fc first layer's draft attends it)."""
    ids, features = torch.tensor([[5, 17, 3, 88, 41]]), torch.randn(1, 5, 16)
    changed = ids.clone()
    changed[0, 0] = 60
    for models, attends in ((featured_wide_eagle3, False), (featured_wide, True)):
        with torch.no_grad():
            before, after = (models["draft"](input_ids=x, features=features).logits[0, 1:] for x in (ids, changed))
        assert ((before - after).abs().max() > 1e-4) == attends


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(set(ALL_CASES) - set(DEFAULT_CASES)))
def test_every_rule_and_policy_is_lossless(featured, case):
    tv, bound = one_prompt_tv(featured, *case_parts(featured, case), N_DEFAULT)
    report(f"feature draft {case} n={N_DEFAULT}", tv, bound)
    assert tv <= bound, f"{case}: TV {tv:.4f} exceeds {bound:.4f}"


@pytest.mark.parametrize("case", BATCHED_CASES)
def test_a_batch_is_lossless(featured, case):
    rule, mix, policy = case_parts(featured, case)
    if policy.needs_hindsight:
        pytest.skip("hindsight bounds decode one prompt at a time")
    tv, bound = batched_tv(featured, rule, mix, policy, N_DEFAULT)
    report(f"feature draft batched {case} n={N_DEFAULT}", tv, bound)
    assert tv <= bound, f"{case}: TV {tv:.4f} exceeds {bound:.4f}"


@pytest.mark.parametrize("batched", [False, True], ids=["one prompt", "batch"])
def test_negative_control_exceeds_the_bound(featured, batched):
    measure = batched_tv if batched else one_prompt_tv
    tv, bound = measure(featured, AcceptAll(), target_only, policies.Fixed(4), N_DEFAULT)
    report(f"NEGATIVE feature draft accept_all batched={batched} n={N_DEFAULT}", tv, bound)
    assert tv > bound


@pytest.mark.parametrize("draft", WIDE_DRAFTS)
@pytest.mark.parametrize("policy", ["fixed4", "confidence", "head_post", "sv"])
def test_greedy_is_the_target_greedy_output(request, draft, policy):
    featured_wide = request.getfixturevalue(draft)
    prompts = wide_prompts(96)
    budgets = [20, 6, 20, 0, 13, 20, 9]
    decoder = decoder_for(featured_wide, rules.Greedy(), POLICIES[policy](featured_wide))
    references = [target_greedy(featured_wide, p, b, None) for p, b in zip(prompts, budgets)]
    batch = decoder.generate(prompts, max_new_tokens=budgets, seed=1)
    for i, (prompt, budget, reference) in enumerate(zip(prompts, budgets, references)):
        assert torch.equal(batch.sequences[i], reference), f"row {i} diverged from the target's greedy output"
        alone = decoder.generate(prompt[None], max_new_tokens=budget, seed=1)
        assert torch.equal(alone.sequences[0], reference)
    assert sum(s.accepted for s in batch.stats) > 0  # the draft's candidates were used


class Recorder:
    """Counts the target's forwards and records every feature the draft reads, by position."""

    def __init__(self, models: dict) -> None:
        self.target_forwards = 0
        self.reads: list[tuple[int, int, torch.Tensor]] = []  # (position, tape end, feature)
        models["target"].register_forward_pre_hook(self._count)
        self._feed = FeatureFed._prepare

    def _count(self, module, args) -> None:
        self.target_forwards += 1

    def prepare(self, fed: FeatureFed, row: int, start: int, end: int) -> None:
        self._feed(fed, row, start, end)
        tape_end = min(end, fed.tape.known[row] + 1)
        for position in range(start, end):
            self.reads.append((position, tape_end, fed.inputs[row, position].clone()))


def test_the_draft_reads_the_verifying_forwards_features(wide, monkeypatch):
    models = {**wide, "target": micro_lm(96, seed=21, hidden=32, layers=2, init=0.3),
              "draft": micro_feature_draft(wide["target"], seed=25, hidden=32, init=0.3)}
    recorder = Recorder(models)
    monkeypatch.setattr(FeatureFed, "_prepare", lambda fed, row, start, end: recorder.prepare(fed, row, start, end))
    out = decoder_for(models, rules.Speculative(), policies.Fixed(3)).generate([5, 9, 2, 7], max_new_tokens=40, seed=3)
    stats = out.stats
    assert recorder.target_forwards == stats.target_calls == stats.rounds  # one target forward per round, no more
    with torch.no_grad():
        hidden = models["target"](out.sequences, output_hidden_states=True).hidden_states[-1][0]
    from_target = [(t, f) for t, end, f in recorder.reads if 0 < t < end]
    own = [(t, f) for t, end, f in recorder.reads if t >= end]
    again = {t for t, _ in own} & {t for t, _ in from_target}
    assert stats.accepted > 0 and len(again) > 0  # accepted candidates are fed again with the target's features
    for position, feature in from_target:
        torch.testing.assert_close(feature, hidden[position - 1], atol=1e-4, rtol=1e-4)
    distance = torch.stack([(f - hidden[t - 1]).norm() for t, f in own if t - 1 < len(hidden)])
    assert distance.min() > 1e-3  # negative control: past the target's features the draft reads its own


def test_a_feature_draft_saves_and_loads_with_the_auto_classes(featured_wide, tmp_path):
    draft = featured_wide["draft"]
    draft.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(drafter_of(loaded), FeatureDrafter) and type(loaded).__name__ == FeatureDraftForCausalLM.__name__
    assert isinstance(drafter_of(featured_wide["target"]), PlainDrafter)
    assert loaded.feature_layers == (1, 2) and loaded.fuse is not None
    ids, features = torch.tensor([[1, 2, 3]]), torch.randn(1, 3, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids, features=features).logits,
                                   draft(input_ids=ids, features=features).logits)
    assert set(load_file(tmp_path / "model.safetensors")) >= {"fc.weight", "fuse.weight"}


def test_a_feature_draft_refuses_a_forward_without_features(featured_wide):
    with pytest.raises(ValueError, match="features"):
        featured_wide["draft"](input_ids=torch.tensor([[1, 2]]))


def test_transformers_generate_drives_a_feature_draft(featured_wide):
    from decode.loops.hf_generate import speculative_generate

    target, prompt = featured_wide["target"], torch.tensor([[3, 1, 4, 1, 5]])
    out = target.generate(prompt, custom_generate=speculative_generate, draft_model=featured_wide["draft"],
                          do_sample=False, max_new_tokens=16, min_new_tokens=16, eos_token_id=None, pad_token_id=0)
    reference = target.generate(prompt, do_sample=False, max_new_tokens=16, min_new_tokens=16, eos_token_id=None,
                                pad_token_id=0)
    assert torch.equal(out, reference)


@pytest.mark.parametrize("draft", WIDE_DRAFTS)
def test_one_forward_per_depth_computes_each_round_step_as_decoding_does(request, draft):
    """``depth_hidden`` over a left-padded batch equals drafting round by round, one token per forward (an eagle3
    first layer's rounds started at the first position, which has no feature and starts none in decoding, left
    out)."""
    target, draft = request.getfixturevalue(draft)["target"], request.getfixturevalue(draft)["draft"]
    first = 1 if draft.config.first_layer == "eagle3" else 0
    sequences = [[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 12], [44, 8, 90, 15, 27, 3, 66]]
    depths, width = 3, max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, width - len(sequence):], mask[row, width - len(sequence):] = torch.tensor(sequence), 1
    rounds = teacher_forced_rounds(target, draft, ids, mask, depths)
    head = torch.no_grad()(draft.get_output_embeddings())
    compared = 0
    for row, sequence in enumerate(sequences):
        reference = incremental_round_logits(target, draft, sequence, depths)
        offset = width - len(sequence)
        for depth in range(1, depths + 1):
            for position, logits in reference[depth - 1].items():
                if position - depth + 1 < first:
                    continue
                torch.testing.assert_close(head(rounds[depth - 1][row, offset + position]), logits, atol=1e-5,
                                           rtol=1e-5)
                compared += 1
    assert compared == sum(len(s) * depths - depths * (depths - 1) // 2 - first * depths for s in sequences)
    # Negative controls: a deeper step differs from the first, and so does a plain causal pass over the draft's own
    # outputs (every earlier position reading its own feature: the training's unrolled approximation).
    assert (head(rounds[1][0, -1]) - head(rounds[0][0, -1])).abs().max() > 1e-3
    with torch.no_grad():
        plain = draft(input_ids=ids[:1, -len(sequences[0]):],
                      features=torch.cat([torch.zeros_like(rounds[0][:1, :1]), rounds[0][:1, :-1]], dim=1)).logits
    assert (plain[0, -1] - head(rounds[1][0, -1])).abs().max() > 1e-3


def test_a_head_reads_the_candidates_depth_capped_at_its_labels():
    config = HeadConfig(hidden_size=4, depth=0, timing="pre", features=(*PRE_FEATURES, DEPTH_FEATURE), depths=4)
    assert [config.depth_of(i) for i in (1, 3, 4, 9)] == [1, 3, 4, 4]
    q, y = torch.softmax(torch.randn(2, 3, 7), dim=-1), torch.randint(7, (2, 3))
    features = head_features(q, y, config.features, depth=torch.tensor([1, 2, 3]))
    assert features.shape == (2, 3, 4) and features[..., -1].tolist() == [[1.0, 2.0, 3.0]] * 2
    with pytest.raises(ValueError, match="depth"):
        head_features(q, y, config.features)
    with pytest.raises(ValueError, match="unknown head features"):
        HeadConfig(hidden_size=4, timing="pre", features=("round",))


@pytest.mark.parametrize("draft", WIDE_DRAFTS)
@pytest.mark.parametrize("policy", [policies.Fixed(3), policies.Confidence(0.4, k_max=6)], ids=str)
def test_a_batch_decodes_each_prompt_as_alone(request, draft, policy):
    """Each row of a batch reads its own features and makes the draws it makes alone (float32: the same tokens)."""
    target, draft = request.getfixturevalue(draft)["target"], request.getfixturevalue(draft)["draft"]
    prompts = [[3, 1, 4, 1, 5, 9, 2], [6, 5, 3], [5, 8, 9, 7, 9, 3, 2, 3, 8, 4], [2, 7]]
    seeds = [100 + i for i in range(len(prompts))]
    decoder = SpeculativeDecoder(target, draft, rule=rules.Speculative(), policy=policy, sampling=Sampling())
    batched = decoder.generate(prompts, max_new_tokens=20, seed=seeds)
    for row, (prompt, seed) in enumerate(zip(prompts, seeds)):
        alone = decoder.generate(prompt, max_new_tokens=20, seed=seed).sequences[0, len(prompt):]
        assert batched.sequences[row][len(prompt):len(prompt) + len(alone)].tolist() == alone.tolist()
    other = decoder.generate(prompts[0], max_new_tokens=20, seed=seeds[1]).sequences[0, len(prompts[0]):]
    assert other.tolist() != batched.sequences[0][len(prompts[0]):len(prompts[0]) + len(other)].tolist()


def test_a_built_draft_directory_with_one_flipped_byte_is_refused_unless_verify_is_off(featured_wide, tmp_path):
    target, draft = featured_wide["target"], featured_wide["draft"]
    draft.save_pretrained(tmp_path)
    files = {p.name: file_sha256(p) for p in sorted(tmp_path.iterdir())}
    (tmp_path / BUILD_RECORD).write_text(json.dumps({"files": files}))
    assert load_causal_lm(str(tmp_path)).loaded == Loaded(str(tmp_path), True)  # negative control: intact, checked
    weights = tmp_path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 + 4] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as error:
        load_causal_lm(str(tmp_path))
    message = str(error.value)
    assert "\n" not in message and f"{weights} is corrupt or was edited" in message and "verify=False" in message
    edited = load_causal_lm(str(tmp_path), verify=False)
    assert edited.loaded == Loaded(str(tmp_path), False)
    stats = SpeculativeDecoder(target, edited, rule=rules.Greedy(), policy=policies.Fixed(2)).generate(
        torch.tensor([[1, 2, 3]]), max_new_tokens=4).stats
    assert stats.unverified_files == [str(tmp_path)]
    checked = SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policies.Fixed(2)).generate(
        torch.tensor([[1, 2, 3]]), max_new_tokens=4).stats
    assert checked.unverified_files == []  # made in memory: nothing to name
    (tmp_path / BUILD_RECORD).unlink()
    assert record_of(load_causal_lm(str(tmp_path))) is None  # built elsewhere: nothing recorded, read as it is
