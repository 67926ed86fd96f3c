"""Decoder mechanics: stats identities, budgets and EOS, caches, determinism, input errors."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from decode import HeadConfig, Sampling, SpeculativeDecoder, SVProfile, policies, rules
from decode.costs import CostModel
from decode.draft_round import Decision
from decode.head import PRE_FEATURES, AcceptanceHead
from decode.loops.runner import ModelRunner

PROMPT = torch.tensor([[3, 17, 42]])
EOS = 7


def make_policy(name: str, models: dict) -> policies.Policy:
    torch.manual_seed(4)
    hidden = models["draft"].config.hidden_size
    if name == "head_pre":
        config = HeadConfig(hidden, depth=2, timing="pre", features=PRE_FEATURES, companion_features=True)
        return policies.Head(AcceptanceHead(config), threshold=0.5)
    if name == "head_post":
        return policies.Head(AcceptanceHead(HeadConfig(hidden, depth=2, timing="post")), threshold=0.5)
    if name == "head_goodput":
        head = AcceptanceHead(HeadConfig(hidden, depth=2, timing="pre", features=PRE_FEATURES))
        return policies.GoodputHead(head, CostModel(t_draft=0.2, t_target=1.0, t_companion=0.0), k_max=8)
    if name == "sv":
        profile = SVProfile(
            x_edges=torch.tensor([0.0, 0.3, 1.0]), y_edges=torch.tensor([0.0, 0.5, 1.0]),
            table=torch.tensor([[0.3, 0.8], [0.6, 0.95]]), counts=torch.ones(2, 2),
            latency=torch.tensor([1.0, 1.05, 1.1, 1.15, 1.2, 1.25]),
        )
        return policies.SV(profile, k=6)
    return {
        "fixed1": policies.Fixed(1),
        "fixed4": policies.Fixed(4),
        "heuristic": policies.Heuristic(),
        "confidence": policies.Confidence(tau=0.2),
        "oracle": policies.Oracle(),
        "perfect": policies.PerfectHead(threshold=0.5, k_max=8),
        "perfect_goodput": policies.PerfectGoodput(CostModel(t_draft=0.2, t_target=1.0, t_companion=0.0), k_max=8),
    }[name]


RULES = {
    "speculative": rules.Speculative,
    "greedy": rules.Greedy,
    "fuzzy_js": lambda: rules.Fuzzy("js", 0.3),
    "fuzzy_kl": lambda: rules.Fuzzy("kl", 0.5),
    "fuzzy_tv": lambda: rules.Fuzzy("tv", 0.4),
    "weighted": lambda: rules.Ensemble("weighted", weight=0.3),
    "contrastive": lambda: rules.Ensemble("contrastive", mu=0.4),
}
POLICY_NAMES = ["fixed1", "fixed4", "heuristic", "confidence", "head_pre", "head_post", "head_goodput", "sv",
                "oracle", "perfect", "perfect_goodput"]


def decoder(models: dict, rule: rules.Rule, policy: policies.Policy, **kwargs) -> SpeculativeDecoder:
    companion = models["companion"] if policy.companion is not None else None
    return SpeculativeDecoder(models["target"], models["draft"], rule=rule, policy=policy, companion=companion, **kwargs)


@pytest.mark.parametrize("rule_name,policy_name", list(itertools.product(RULES, POLICY_NAMES)))
def test_stats_identities(wide, rule_name, policy_name):
    policy = make_policy(policy_name, wide)
    dec = decoder(wide, RULES[rule_name](), policy, eos_token_id=EOS)
    for seed, max_new in [(0, 40), (1, 17), (2, 1), (3, 0)]:
        out = dec.generate(PROMPT, max_new_tokens=max_new, seed=seed)
        s, new = out.stats, out.sequences[0, PROMPT.shape[1] :].tolist()
        assert s.generated == len(new) <= max_new
        assert EOS not in new[:-1]
        assert new[-1:] == [EOS] or s.generated == max_new
        assert s.drafted == s.accepted + s.discarded
        assert s.discarded == s.rejected + s.unverified
        assert s.generated == s.accepted + s.target_emitted
        assert s.target_calls == s.rounds
        assert sum(s.position_accepted) == sum(s.accepted_per_round) >= s.accepted
        assert all(0.0 <= a <= 1.0 for a in s.per_position_acceptance)
        if s.generated:
            assert s.verification_rate == pytest.approx(s.target_calls / s.generated)
            assert s.mean_accepted_length == pytest.approx(s.generated / s.target_calls)
            assert s.discard_rate == pytest.approx(s.discarded / s.generated)
        assert s.modelled_time(0.5, 2.0, 0.25) == pytest.approx(
            0.5 * s.draft_calls + 2.0 * s.target_calls + 0.25 * s.companion_calls
        )
        assert (s.companion_calls > 0) == (policy.companion is not None and s.drafted > 0)
        if policy_name == "oracle":
            assert s.rejected == 0  # the round stops before the first rejection its own draws decide
            if rule_name in ("weighted", "contrastive"):  # a tentative bonus is settled by one more draft call
                assert s.accepted <= s.draft_calls <= s.accepted + s.rounds
            else:
                assert s.draft_calls == s.accepted + (s.unverified > 0)  # Thm 4.1; an EOS cut leaves one call
        if policy_name.startswith("perfect") and rule_name not in ("weighted", "contrastive"):
            assert s.draft_calls == s.drafted  # decides before feeding y_i, as a pre head
        if policy_name != "sv":
            assert s.unverified <= s.drafted and (s.unverified == 0 or EOS in new)


def test_draft_calls_are_counted_honestly(wide):
    """Fixed and pre-head rounds cost one draft call per candidate; post-head early stops cost one more."""
    speculative = rules.Speculative()
    for name in ["fixed4", "head_pre"]:
        s = decoder(wide, speculative, make_policy(name, wide), eos_token_id=None).generate(PROMPT, 40).stats
        assert s.draft_calls == s.drafted
    s = decoder(wide, speculative, make_policy("head_post", wide), eos_token_id=None).generate(PROMPT, 40).stats
    assert s.draft_calls > s.drafted
    ensemble = decoder(wide, rules.Ensemble(weight=0.3), policies.Fixed(4), eos_token_id=None)
    s = ensemble.generate(PROMPT, 40).stats
    assert s.draft_calls >= s.drafted


def test_seeded_determinism(wide):
    dec = decoder(wide, rules.Speculative(), policies.Heuristic(), eos_token_id=None)
    a, b = dec.generate(PROMPT, 30, seed=5), dec.generate(PROMPT, 30, seed=5)
    assert torch.equal(a.sequences, b.sequences)
    assert (a.stats.draft_calls, a.stats.accepted_per_round) == (b.stats.draft_calls, b.stats.accepted_per_round)
    others = [dec.generate(PROMPT, 30, seed=seed).sequences for seed in range(6, 9)]
    assert any(not torch.equal(a.sequences, other) for other in others)


def test_kv_cache_matches_from_scratch_forward(wide, monkeypatch):
    """Every cached forward (after crops on rejection) equals a from-scratch forward to 1e-5."""
    feed = ModelRunner.feed
    checked = []

    def checked_feed(self, tokens, end, keep, inputs=None):
        logits = feed(self, tokens, end, keep, inputs)
        with torch.no_grad():
            full = self.model(tokens[:, :end]).logits[0, -keep:, : self.vocab].float()
        torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)
        assert self.cache.get_seq_length() == end
        checked.append(keep)
        return logits

    monkeypatch.setattr(ModelRunner, "feed", checked_feed)
    for rule, name in [(rules.Speculative(), "fixed4"), (rules.Ensemble(weight=0.3), "head_post"), (rules.Greedy(), "sv")]:
        out = decoder(wide, rule, make_policy(name, wide), eos_token_id=None).generate(PROMPT, 30, seed=2)
        assert out.stats.rejected > 0  # rollbacks happened
    assert len(checked) > 50


def test_oracle_bounds_fixed_k(wide):
    generator = torch.Generator().manual_seed(9)
    for _ in range(5):
        prompt = torch.randint(0, 96, (1, 4), generator=generator)
        oracle = decoder(wide, rules.Greedy(), policies.Oracle(), eos_token_id=None).generate(prompt, 32).stats
        assert oracle.discarded == 0
        for k in range(1, 7):
            fixed = decoder(wide, rules.Greedy(), policies.Fixed(k), eos_token_id=None).generate(prompt, 32).stats
            assert fixed.generated == oracle.generated
            assert oracle.verification_rate <= fixed.verification_rate


def noisy_copy(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """``model`` with Gaussian noise on its LM head: a draft that agrees with it about half the time."""
    draft = copy.deepcopy(model)
    head = draft.get_output_embeddings().weight
    with torch.no_grad():
        head.add_(scale * torch.randn(head.shape, generator=torch.Generator().manual_seed(seed)))
    return draft


@pytest.mark.parametrize("k_max", [None, 3])
@pytest.mark.parametrize("draft_name", ["wide_draft", "noisy_target"])
def test_oracle_pays_one_draft_call_per_accepted_token(wide, draft_name, k_max):
    """SpecDec++ Thm 4.1: ``N_d = N − N_t``; the draft call that produced a dropped candidate is not charged."""
    draft = wide["draft"] if draft_name == "wide_draft" else noisy_copy(wide["target"], 0.1, seed=0)
    dec = SpeculativeDecoder(
        wide["target"], draft, rule=rules.Greedy(), policy=policies.Oracle(k_max), eos_token_id=None
    )
    generator = torch.Generator().manual_seed(10)
    for _ in range(3):
        prompt = torch.randint(0, 96, (1, 4), generator=generator)
        out = dec.generate(prompt, 32)
        reference = wide["target"].generate(prompt, max_new_tokens=32, do_sample=False, min_new_tokens=32)
        assert torch.equal(out.sequences, reference)
        s = out.stats
        assert s.target_calls > 3 and s.accepted > 0  # drafts were both dropped and accepted
        assert s.draft_calls == s.generated - s.target_calls == s.accepted


@pytest.mark.parametrize("rule_name", ["speculative", "weighted"])
def test_realised_oracle_bounds_fixed_k_on_the_same_draws(wide, rule_name):
    """With the verification uniforms fixed in advance, the oracle verifies no rejected candidate and pays one draft
    call per accepted token, so its modelled time per token is below every fixed K's; a control that stops on the
    same acceptance probabilities without the draws (the perfect threshold stop) does verify rejections."""
    cost = CostModel(t_draft=0.2, t_target=1.0, t_companion=0.0)
    oracle, perfect, fixed = [], [], {k: [] for k in (1, 3, 6)}
    for seed in range(6):
        def run(policy):
            return decoder(wide, RULES[rule_name](), policy, eos_token_id=None).generate(PROMPT, 40, seed=seed).stats
        oracle.append(run(policies.Oracle()))
        perfect.append(run(policies.PerfectHead(threshold=0.5)))
        for k in fixed:
            fixed[k].append(run(policies.Fixed(k)))

    def seconds_per_token(stats):
        return sum(cost.times(s.draft_calls, 0, s.target_calls) for s in stats) / sum(s.generated for s in stats)
    settles = rule_name == "weighted"  # a tentative ensemble bonus is checked by one more draft call
    assert all(s.rejected == 0 and s.accepted <= s.draft_calls <= s.accepted + settles * s.rounds for s in oracle)
    assert all(s.draft_calls == s.accepted for s in oracle) or settles
    assert sum(s.accepted for s in oracle) > 0
    assert sum(s.rejected for s in perfect) > 0
    assert all(seconds_per_token(oracle) < seconds_per_token(runs) for runs in fixed.values())


def test_hindsight_acceptance_is_the_rules_label(wide, monkeypatch):
    """The probability a hindsight policy reads for each candidate is the rule's acceptance probability given the
    target's logits after the committed text and the round's earlier candidates (recomputed with full forwards)."""
    proposals, rounds = [], []
    end_round = policies.PerfectHead.end_round

    def record(self, state):
        proposals.append((len(rounds), state.tokens(), state.latest.hindsight.accept_prob, state.latest.step.q_logits))
        return Decision.CONTINUE

    def record_round(self, drafted, verified, accepted):
        rounds.append(accepted)
        end_round(self, drafted, verified, accepted)

    monkeypatch.setattr(policies.PerfectHead, "after_propose", record)
    monkeypatch.setattr(policies.PerfectHead, "end_round", record_round)
    rule = rules.Ensemble(weight=0.3)
    out = decoder(wide, rule, policies.PerfectHead(k_max=4), eos_token_id=None).generate(PROMPT, 16, seed=1)
    starts = [PROMPT.shape[1] + sum(a + 1 for a in rounds[:r]) for r in range(len(rounds))]
    with torch.no_grad():
        for r, candidates, accept, q_logits in proposals:
            context = torch.cat([out.sequences[0, : starts[r]], candidates[:-1]])[None]
            p_logits = wide["target"](context).logits[0, -1].float()
            expected = rule.label(p_logits[None], q_logits[None], candidates[-1:], Sampling())
            assert accept == pytest.approx(float(expected[0]), abs=1e-4)
    assert len(proposals) > len(rounds) > 2


def test_fuzzy_huge_threshold_accepts_everything(wide):
    dec = decoder(wide, rules.Fuzzy("kl", threshold=1e9), policies.Fixed(4), eos_token_id=None)
    s = dec.generate(PROMPT, 41, seed=0).stats
    assert s.rejected == 0 and s.discarded == 0 and s.accepted == s.drafted
    assert s.accepted_per_round == [4] * 8 + [0]  # 8 full rounds of 4 + bonus, then the last token alone


def test_policies_adapt_length(wide):
    heuristic = decoder(wide, rules.Fuzzy("kl", 1e9), policies.Heuristic(k0=2, k_max=9), eos_token_id=None)
    assert heuristic.generate(PROMPT, 60).stats.accepted_per_round[:4] == [2, 4, 6, 8]
    sv = decoder(wide, rules.Speculative(), make_policy("sv", wide), eos_token_id=None).generate(PROMPT, 60).stats
    assert sv.unverified > 0


def test_input_errors(wide):
    dec = decoder(wide, rules.Speculative(), policies.Fixed(2))
    assert len(dec.generate(torch.tensor([[1, 2], [3, 4]]), 5).sequences) == 2  # [B, n]: a batch of B prompts
    with pytest.raises(ValueError, match=r"got input_ids of shape \(1, 1, 2\)"):
        dec.generate(torch.tensor([[[1, 2]]]), 5)
    with pytest.raises(ValueError, match="empty prompt"):
        dec.generate(torch.zeros(1, 0, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="tokenizer"):
        dec.generate("hello", 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate(PROMPT, -1)


def test_a_prompt_with_no_room_in_the_context_is_one_line(wide):
    dec = decoder(wide, rules.Speculative(), policies.Fixed(2))  # micro models: a context of 256 tokens
    long_prompt = list(range(1, 91)) * 3  # 270 tokens
    message = ("SpeculativeDecoder: the prompt has 270 tokens and max_new_tokens=5, more than the models' context of 256 "
               "tokens; shorten the prompt or lower max_new_tokens")
    with pytest.raises(ValueError) as error:
        dec.generate(long_prompt, 5)
    assert str(error.value) == message
    with pytest.raises(ValueError, match=r"the prompt has 270 tokens and max_new_tokens=5, more than"):
        dec.generate([PROMPT, long_prompt], 5)  # the batched loop checks every row
    assert dec.generate(long_prompt[:250], 6).sequences.shape[1] <= 256  # a prompt that fits decodes


def test_invalid_combinations(wide):
    target, draft = wide["target"], wide["draft"]
    with pytest.raises(ValueError, match="companion"):
        SpeculativeDecoder(target, draft, policy=make_policy("sv", wide))
    with pytest.raises(ValueError, match="companion"):
        SpeculativeDecoder(target, draft, policy=make_policy("head_pre", wide))
    with pytest.warns(UserWarning, match="does not use the companion"):
        SpeculativeDecoder(target, draft, policy=policies.Fixed(2), companion=wide["companion"])


def test_text_prompt(wide, make_tokenizer):
    tokenizer = make_tokenizer(96)
    dec = decoder(wide, rules.Speculative(), policies.Fixed(3), tokenizer=tokenizer, eos_token_id=None)
    out = dec.generate("w3 w17 w42", 6, seed=0)
    assert out.sequences[0, :3].tolist() == PROMPT[0].tolist()
    assert out.sequences.shape[1] == 9 and len(out.text.split()) == 6
    assert torch.equal(out.sequences, dec.generate(PROMPT, 6, seed=0).sequences)


def test_sampling_validation_and_dict():
    assert Sampling.from_dict(Sampling(0.7, 5, 0.9).to_dict()) == Sampling(0.7, 5, 0.9)
    with pytest.raises(ValueError):
        Sampling(temperature=-1)
    with pytest.raises(ValueError):
        Sampling(top_p=0.0)


class HostTransfers(TorchDispatchMode):
    """Counts single values moved between Python and tensors: reads (``int()``, ``bool()``, ``.item()``,
    0-d indexing) and Python numbers written into a tensor. On CUDA each one is a host sync.

    ``.tolist()`` reads below the dispatcher and is not counted: the decoder's one sync per round.
    :func:`cache_setup` bounds the transfers of HF's caches, made once per generation.
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.item, torch.ops.aten._local_scalar_dense, torch.ops.aten.lift_fresh):
            self.count += 1
        return func(*args, **(kwargs or {}))


def cache_setup(models: dict) -> int:
    """Transfers a ``DynamicCache`` makes when it first sees each layer (two per layer), target and draft."""
    return 2 * sum(models[name].config.num_hidden_layers for name in ("target", "draft"))


@pytest.mark.parametrize("eos", [None, EOS])
@pytest.mark.parametrize("rule", [rules.Speculative(), rules.Greedy(), rules.Ensemble("weighted", weight=1.0)])
def test_fixed_rounds_move_no_single_values(wide, rule, eos):
    """Fixed(k) drafting, EOS handling, emitted-token writes and the ensemble's bonus check move no single value.

    Only the rule's verification may read one per round (weight 1 accepts every candidate, so the
    ensemble checks a tentative bonus every round).
    """
    dec = decoder(wide, rule, policies.Fixed(4), eos_token_id=eos)
    with HostTransfers() as moves:
        s = dec.generate(PROMPT, 40, seed=1).stats
    assert s.drafted >= 2 * s.rounds
    assert moves.count <= s.rounds + cache_setup(wide)


def test_dynamic_policy_without_eos_reads_no_token(wide):
    """Confidence reads ``max q_i`` once per candidate; with no EOS the decoder reads no drafted token."""
    dec = decoder(wide, rules.Speculative(), policies.Confidence(tau=0.1), eos_token_id=None)
    with HostTransfers() as moves:
        s = dec.generate(PROMPT, 40, seed=1).stats
    assert s.drafted > s.rounds
    assert moves.count <= s.drafted + s.rounds + cache_setup(wide)


def constant_head(hidden: int, accept: float) -> AcceptanceHead:
    """A ``pre`` head that predicts ``accept`` for every candidate."""
    head = AcceptanceHead(HeadConfig(hidden, depth=1, timing="pre", features=PRE_FEATURES))
    with torch.no_grad():
        head.out.weight.zero_()
        head.out.bias.fill_(torch.logit(torch.tensor(accept)).item())
    return head


@pytest.mark.parametrize("t_draft,expected", [(1e-4, 6), (10.0, 1)])
def test_goodput_head_drafts_while_the_expected_gain_pays_for_the_draft_call(wide, t_draft, expected):
    head = constant_head(wide["draft"].config.hidden_size, accept=0.9)
    policy = policies.GoodputHead(head, CostModel(t_draft=t_draft, t_target=1.0, t_companion=0.0), k_max=6)
    out = decoder(wide, rules.Speculative(), policy).generate(PROMPT, max_new_tokens=30, seed=0)
    assert out.stats.verified_per_round[:5] == [expected] * 5  # the last rounds may be cut by the budget


@pytest.mark.parametrize("timing", ["pre", "post"])
def test_goodput_head_charges_the_calls_the_decoder_counts(wide, timing):
    """λ's seconds are the decoder's modelled seconds: a ``post`` head that stops early made ``drafted + 1`` draft
    calls (it read the state after consuming ``y_i``). Only the settling call after the last round may be uncharged."""
    torch.manual_seed(5)
    hidden = wide["draft"].config.hidden_size
    config = HeadConfig(hidden, depth=1, timing=timing, features=PRE_FEATURES if timing == "pre" else ())
    costs = CostModel(t_draft=0.25, t_target=1.0, t_companion=0.0)
    policy = policies.GoodputHead(AcceptanceHead(config), costs, k_max=6)
    out = decoder(wide, rules.Speculative(), policy).generate(PROMPT, max_new_tokens=60, seed=0)
    early_stops = sum(v < 6 for v in out.stats.verified_per_round)
    assert early_stops >= 5, "the head must stop early in several rounds for the check to bite"
    uncharged = costs.time(out.stats) - policy.stop.seconds
    assert uncharged in (0.0, costs.t_draft), uncharged
