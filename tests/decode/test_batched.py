"""Batched decoding (``SpeculativeDecoder.generate`` of several prompts): every row is decoded as it would be alone.

Greedy rows equal the target's own greedy ``generate`` (prompts of different lengths, rows
finishing at different times by budget and by EOS); a batch of one is ``generate``; a row's output
and stats do not depend on the other rows; in a batch the speculative rule samples the target and
an ensemble rule its ``r`` (enumeration and TV bound of ``tests.helpers.exact_distribution``, with a
negative control), also with SV's jointly chosen lengths; per-row and batch counts are
consistent; the hindsight bounds decode each row as alone; the cache masks rows' padding and holes; unsupported
combinations are refused.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from decode import BatchDecodeOutput, DecodeOutput, HeadConfig, Sampling, SpeculativeDecoder, SVProfile, policies, rules
from decode.batch_costs import BatchCosts
from decode.costs import CostModel
from decode.head import PRE_FEATURES, AcceptanceHead
from decode.loops.batch_cache import BatchRunner
from decode.loops.batched import row_seed
from decode.policies.sources import MarginLogistic, OnlineMargin
from decode.policies.stops import Threshold
from decode.profile import goodput_length, joint_goodput_lengths
from tests.helpers.batched import (
    batched_empirical,
    comparable,
    make_decoder,
    target_greedy,
    wide_prompts,
)
from tests.helpers.exact_distribution import (
    LENGTH,
    PROMPT,
    AcceptAll,
    adversarial_sv_profile,
    exact_distribution,
    report,
    target_only,
    tv_bound,
    weighted,
)
from tests.helpers.exact_distribution import random_head as tiny_head
from tests.helpers.families import build

LAYOUTS = ["compact", "holes"]
#: Batch costs at which drafting never pays: a draft forward costs 50 target forwards.
#: Cheap drafts and a verification that grows slowly with its tokens: the budget's choices vary from step to step.
BUDGET_COSTS = BatchCosts(batches=(1, 8), draft=(0.1, 0.12),
                          target=((1.0, 1.05, 1.1, 1.2, 1.3), (1.2, 1.3, 1.4, 1.5, 1.6)))
HOPELESS = BatchCosts(batches=(1, 8), draft=(50.0, 50.0), target=((1.0,) * 4, (1.0,) * 4))
BUDGETS = [20, 6, 20, 0, 13, 20, 9]


def wide_policy(name: str, models: dict) -> policies.Policy:
    torch.manual_seed(3)
    hidden = models["draft"].config.hidden_size
    if name == "fixed5":
        return policies.Fixed(5)
    if name == "heuristic":  # state carried across rounds, per row
        return policies.Heuristic(k0=2, k_max=8)
    if name == "head_pre":  # needs the companion at every step
        head = AcceptanceHead(HeadConfig(hidden, depth=2, timing="pre", features=PRE_FEATURES, companion_features=True))
        return policies.Head(head, threshold=0.5)
    if name == "head_post":
        return policies.Head(AcceptanceHead(HeadConfig(hidden, depth=2, timing="post")), threshold=0.5, k_min=2)
    if name == "goodput_off":  # at these prices only the first round drafts: then target-only steps (k = 0)
        head = AcceptanceHead(HeadConfig(hidden, depth=2, timing="pre", features=PRE_FEATURES))
        return policies.GoodputHead(head, HOPELESS.batch_one(), k_max=8, batch_costs=HOPELESS)
    if name == "head_goodput":  # throughput state carried across rounds, per row
        head = AcceptanceHead(HeadConfig(hidden, depth=2, timing="pre", features=PRE_FEATURES))
        return policies.GoodputHead(head, CostModel(t_draft=0.2, t_target=1.0, t_companion=0.0), k_max=8)
    if name == "sv":  # the default t_t(B, T): the table at the mean length, so the joint lengths vary
        profile = SVProfile(
            x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 0.5, 1.0]),
            table=torch.tensor([[0.2, 0.6], [0.5, 0.9]]), counts=torch.ones(2, 2),
            latency=torch.tensor([1.0, 1.1, 1.2, 1.3, 1.4]),
        )
        return policies.SV(profile, k=5)
    raise KeyError(name)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy_name", ["fixed5", "head_pre", "head_post", "sv", "goodput_off"])
def test_greedy_batch_equals_target_greedy_row_by_row(wide, policy_name, layout):
    prompts = wide_prompts(96)
    free = [target_greedy(wide, p, b, None) for p, b in zip(prompts, BUDGETS)]
    eos = int(free[0][len(prompts[0]) + 4])  # row 0 stops by its 5th token; others wherever it occurs
    references = [target_greedy(wide, p, b, eos) for p, b in zip(prompts, BUDGETS)]
    new = [len(r) - len(p) for r, p in zip(references, prompts)]
    stopped = [n < b for n, b in zip(new, BUDGETS)]
    assert len(set(new)) >= 4 and 0 in new and stopped[0] and not all(stopped)  # rows finish at different times
    decoder = make_decoder(wide, rules.Greedy(), wide_policy(policy_name, wide), eos_token_id=eos)
    out = decoder.generate(prompts, max_new_tokens=BUDGETS, seed=1, layout=layout)
    for i, (sequence, reference) in enumerate(zip(out.sequences, references)):
        assert torch.equal(sequence, reference), f"row {i} diverged from the target's greedy output"
    assert out.prompt_lengths == [len(p) for p in prompts]


@pytest.mark.parametrize(
    "rule", [rules.Greedy(), rules.Speculative(), rules.Ensemble("contrastive", mu=0.5)],
    ids=["greedy", "speculative", "contrastive"],
)
@pytest.mark.parametrize("policy_name", ["fixed5", "head_post", "head_goodput", "sv"])
def test_batch_of_one_is_generate(wide, rule, policy_name):
    prompt = wide_prompts(96)[2]
    decoder = make_decoder(wide, rule, wide_policy(policy_name, wide))
    alone = decoder.generate(prompt, max_new_tokens=20, seed=4)
    batch = decoder.generate([prompt], max_new_tokens=20, seed=4)
    assert torch.equal(batch.sequences[0], alone.sequences[0])
    a, b = alone.stats, batch.stats[0]
    assert (a.target_calls, a.draft_calls, a.accepted, a.drafted, a.rejected, a.accepted_per_round) == (
        b.target_calls, b.draft_calls, b.accepted, b.drafted, b.rejected, b.accepted_per_round)
    assert batch.totals.target_calls == a.target_calls and batch.totals.draft_calls == a.draft_calls


ENSEMBLE = rules.Ensemble("weighted", weight=0.5)


@pytest.mark.parametrize(
    "rule, policy_name",
    [(rules.Speculative(), "fixed5"), (rules.Speculative(), "heuristic"), (rules.Speculative(), "head_pre"),
     (ENSEMBLE, "fixed5"), (ENSEMBLE, "head_post")],
    ids=["speculative-fixed5", "speculative-heuristic", "speculative-head_pre", "ensemble-fixed5",
         "ensemble-head_post"],
)
def test_a_row_does_not_depend_on_the_other_rows(wide, rule, policy_name):
    """Sampling: row 1 is the same with two different companions, and equals its prompt decoded alone."""
    prompts = wide_prompts(96)
    policy = wide_policy(policy_name, wide)
    decoder = make_decoder(wide, rule, policy, eos_token_id=[5, 40])
    row = prompts[2]
    first = decoder.generate([prompts[0], row, prompts[4]], max_new_tokens=[20, 16, 6], seed=9)
    second = decoder.generate([prompts[5], row, prompts[1], prompts[6]], max_new_tokens=[3, 16, 20, 20], seed=9,
                                    layout="compact")
    if policy_name == "heuristic":  # each row adapted its own copy; the decoder's policy is untouched
        assert policy.k == policy.k0 and len({tuple(s.verified_per_round) for s in first.stats}) == 3
    alone = decoder.generate(row, max_new_tokens=16, seed=row_seed(9, 1))
    assert torch.equal(first.sequences[1], second.sequences[1])
    assert torch.equal(first.sequences[1], alone.sequences[0])
    assert comparable(first.stats[1]) == comparable(second.stats[1]) == comparable(alone.stats)
    if rule is ENSEMBLE and policy_name == "fixed5":  # tentative bonuses were settled: one draft call each
        assert alone.stats.draft_calls > alone.stats.drafted


def test_each_row_can_bring_its_own_seed(wide):
    """``seed`` as a list: row i samples what ``generate(seed=seeds[i])`` samples; a wrong count is refused."""
    prompts = wide_prompts(96)[:3]
    decoder = make_decoder(wide, rules.Speculative(), policies.Heuristic(k0=2, k_max=8))
    seeds = [11, 40_000, 11]
    batch = decoder.generate(prompts, max_new_tokens=12, seed=seeds)
    for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
        alone = decoder.generate(prompt, max_new_tokens=12, seed=seed)
        assert torch.equal(batch.sequences[i], alone.sequences[0])
        assert comparable(batch.stats[i]) == comparable(alone.stats)
    other = decoder.generate(prompts, max_new_tokens=12, seed=[12, 40_000, 11])
    assert not torch.equal(other.sequences[0], batch.sequences[0])  # the seed is what row 0 drew from
    with pytest.raises(ValueError, match="3 prompts but 2 seeds"):
        decoder.generate(prompts, max_new_tokens=12, seed=[1, 2])


def test_row_seeds():
    assert row_seed(5, 0) == 5
    seeds = {row_seed(seed, row) for seed in range(200) for row in range(64)}
    assert len(seeds) == 200 * 64 and all(0 <= s < 2**63 for s in seeds)


# --- exact distribution of the speculative rule in a batch --------------------------------------------------------

N_BATCHED = 1000
BATCH_CASES = {
    "speculative-fixed4": (rules.Speculative, target_only, lambda m: policies.Fixed(4)),
    "speculative-head_post": (rules.Speculative, target_only, lambda m: policies.Head(tiny_head(m, "post"), 0.66)),
    "weighted-fixed4": (lambda: rules.Ensemble("weighted", weight=0.5), weighted(0.5), lambda m: policies.Fixed(4)),
    # the rows share one online fit, refitted every 3 rounds of any row
    "speculative-margin": (rules.Speculative, target_only,
                           lambda m: policies.StopPolicy(OnlineMargin(MarginLogistic(refit_every=3, min_count=4)),
                                                         Threshold(0.8, k_max=4))),
    # the survival budget picks which rows draft on from every row's estimates so far
    "speculative-survival_budget": (rules.Speculative, target_only,
                                    lambda m: policies.StopPolicy(OnlineMargin(MarginLogistic(refit_every=3,
                                                                                              min_count=4)),
                                                                  policies.SurvivalStop(BUDGET_COSTS, k_max=4))),
    # the first round drafts, the later ones are target-only steps (the draft's cache catches up after them)
    "speculative-goodput_off": (rules.Speculative, target_only,
                                lambda m: policies.GoodputHead(tiny_head(m, "post"), HOPELESS.batch_one(),
                                                               batch_costs=HOPELESS)),
}


@pytest.mark.parametrize("case", BATCH_CASES)
def test_lossless_rules_in_a_batch_sample_their_distribution(tiny, case):
    make_rule, mix, make_policy = BATCH_CASES[case]
    decoder = make_decoder(tiny, make_rule(), make_policy(tiny))
    exact = exact_distribution(tiny, mix, Sampling())
    tv = float(0.5 * (batched_empirical(decoder, N_BATCHED) - exact).abs().sum())
    bound = tv_bound(exact, N_BATCHED)
    report(f"batched {case} n={N_BATCHED}", tv, bound)
    assert tv <= bound, f"TV {tv:.4f} exceeds {bound:.4f}"


def test_batched_negative_control_exceeds_the_bound(tiny):
    decoder = make_decoder(tiny, AcceptAll(), policies.Fixed(4))
    exact = exact_distribution(tiny, target_only, Sampling())
    tv = float(0.5 * (batched_empirical(decoder, N_BATCHED) - exact).abs().sum())
    bound = tv_bound(exact, N_BATCHED)
    report(f"NEGATIVE batched accept_all n={N_BATCHED}", tv, bound)
    assert tv > bound


def sv_models(make_lm) -> dict:
    """The models of ``test_sv_is_lossless_with_a_y_dependent_profile``."""
    return {"target": make_lm(4, seed=53, init=0.3), "draft": make_lm(4, seed=51, init=0.3),
            "companion": make_lm(4, seed=52, init=0.3)}


def test_joint_sv_lengths_are_lossless_with_a_y_dependent_profile(make_lm):
    """Joint lengths must be stopping times (DESIGN §1 pitfalls): judged on the (t_1, t_2) marginal.

    Ten rows of the test prompt beside two others, n = 3000. With these models and latency
    ``1 + 0.2 · T / B`` a row's second candidate is verified when its first one's full ``α`` is
    high; letting the second one's own ``Y`` decide instead (using its full ``α`` in the gain)
    gives TV ≈ 0.084 against a bound of ≈ 0.053 (correct rule: ≈ 0.029).
    """
    models = sv_models(make_lm)
    policy = policies.SV(adversarial_sv_profile(), k=4, batch_latency=lambda batch, total: 1.0 + 0.2 * total / batch)
    decoder = make_decoder(models, rules.Speculative(), policy)
    prompts = [PROMPT[0]] * 10 + [torch.tensor([3]), torch.tensor([2, 0, 1, 3, 2])]
    budgets = [LENGTH] * 10 + [1, 5]
    n, cells = 3000, decoder.vocab ** (LENGTH - 1)
    counts = torch.zeros(cells, dtype=torch.float64)
    for seed in range(n // 10):
        out = decoder.generate(prompts, max_new_tokens=budgets, seed=seed, layout="holes")
        for sequence in out.sequences[:10]:
            counts[int(sequence[PROMPT.shape[1]]) * decoder.vocab + int(sequence[PROMPT.shape[1] + 1])] += 1
    exact = exact_distribution(models, target_only, Sampling()).view(cells, -1).sum(-1)
    tv = float(0.5 * (counts / n - exact).abs().sum())
    bound = tv_bound(exact, n)
    report(f"batched speculative-sv(adversarial) (t1, t2) n={n}", tv, bound)
    assert tv <= bound, f"TV {tv:.4f} exceeds {bound:.4f}"


def test_joint_lengths_of_one_row_are_goodput_length():
    generator = torch.Generator().manual_seed(0)
    table = torch.tensor([1.0, 1.05, 1.12, 1.2, 1.3])
    latency = SVProfile(x_edges=torch.tensor([0.0, 1.0]), y_edges=torch.tensor([0.0, 1.0]), table=torch.ones(1, 1),
                        counts=torch.ones(1, 1), latency=table).batch_latency
    seen = set()
    for _ in range(200):
        k = int(torch.randint(1, 7, (1,), generator=generator))
        alpha, ahead = torch.rand(k, generator=generator), torch.rand(k, generator=generator)
        length = goodput_length(alpha, ahead, table)
        assert joint_goodput_lengths([alpha], [ahead], latency) == [length]
        seen.add(length)
    assert len(seen) >= 4  # the cases reach several lengths


def test_joint_lengths_spend_candidates_where_they_gain():
    sure, doubtful = torch.tensor([0.9, 0.9, 0.9, 0.9]), torch.tensor([0.3, 0.3, 0.3, 0.3])
    rows = [sure, doubtful, torch.empty(0)]  # the last row drafted nothing: it verifies nothing
    assert joint_goodput_lengths(rows, rows, lambda batch, total: 1.0) == [4, 4, 0]  # free: verify all
    assert joint_goodput_lengths(rows, rows, lambda batch, total: 1.0 + 10.0 * total) == [1, 1, 0]  # at least 1
    lengths = joint_goodput_lengths(rows, rows, lambda batch, total: 1.0 + 0.1 * total)
    assert lengths[0] > lengths[1] >= 1 and lengths[2] == 0


# --- counts, caches, errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy_name", ["fixed5", "head_post", "sv"])
def test_stats_are_consistent(wide, policy_name):
    prompts = wide_prompts(96)
    decoder = make_decoder(wide, rules.Speculative(), wide_policy(policy_name, wide), eos_token_id=[5, 40])
    out = decoder.generate(prompts, max_new_tokens=BUDGETS, seed=2)
    for sequence, n, stats, budget in zip(out.sequences, out.prompt_lengths, out.stats, BUDGETS):
        assert stats.generated == len(sequence) - n <= budget
        assert stats.target_calls == stats.rounds == len(stats.verified_per_round)
        assert stats.drafted == stats.accepted + stats.rejected + stats.unverified
        assert stats.generated == stats.accepted + stats.target_emitted
        assert stats.accepted == sum(stats.accepted_per_round)
        if policy_name != "head_post":  # one forward per candidate: the first reads the last committed token(s)
            assert stats.draft_calls == stats.drafted
        else:  # a post head may stop after feeding y_i: one forward more in that round
            assert stats.drafted <= stats.draft_calls <= stats.drafted + stats.rounds
    rounds = [s.target_calls for s in out.stats]
    draft_calls = [s.draft_calls for s in out.stats]
    assert out.totals.target_calls == max(rounds)  # every round verifies every live row at once
    assert max(draft_calls) <= out.totals.draft_calls <= sum(draft_calls)
    assert out.totals.draft_calls < sum(draft_calls) and out.totals.target_calls < sum(rounds)
    assert out.totals.tokens == sum(s.generated for s in out.stats)
    assert out.stats[BUDGETS.index(0)].generated == 0 and out.stats[BUDGETS.index(0)].target_calls == 0
    assert (sum(s.unverified for s in out.stats) > 0) == (policy_name == "sv")  # SV leaves candidates unverified


@pytest.mark.parametrize("layout", LAYOUTS)
def test_batch_runner_rows_see_only_their_own_tokens(wide, layout):
    """Masked padding, rolled-back holes and dropped rows leave each row's logits those of its own tokens."""
    target = wide["target"]
    tokens = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(1))

    def alone(row: int, n: int) -> torch.Tensor:
        return target(tokens[row : row + 1, :n]).logits[0, -1]

    runner = BatchRunner(target, 96, rows=2, layout=layout)
    runner.feed(tokens, {0: 5, 1: 2}, keep=1)
    runner.feed(tokens, {1: 4}, keep=1)  # row 0 gets a masked column
    runner.rollback({0: 4, 1: 3})  # drop token 4 of row 0, token 3 of row 1
    out = runner.feed(tokens, {0: 7, 1: 4}, keep=1)
    assert torch.allclose(out[0][-1], alone(0, 7), atol=1e-5) and torch.allclose(out[1][-1], alone(1, 4), atol=1e-5)
    assert runner.consumed == [7, 4] and runner.mask.sum(1).tolist() == [7, 4]
    assert runner.row_calls == [2, 3] and runner.calls == 3
    widths, excess = [], []
    for _ in range(10):  # row 0 keeps 1 of 3 candidates, row 1 its 1 (beside 2 padding columns)
        before = runner.consumed[0]
        runner.feed(tokens, {0: before + 3, 1: runner.consumed[1] + 1}, keep=1)
        runner.rollback({0: before + 1})
        widths.append(runner.width)
        excess.append(runner.width - max(runner.consumed))
        assert runner.width <= 2 * max(runner.consumed)
    if layout == "compact":
        assert max(excess) == 0
    else:  # holes stay until the cache is over twice the longest row, then the rows are re-packed
        assert max(excess) > 0 and any(b < a for a, b in itertools.pairwise(widths))
    assert runner.consumed == [17, 14]
    out = runner.feed(tokens, {0: 18, 1: 15}, keep=1)
    assert torch.allclose(out[0][-1], alone(0, 18), atol=1e-5) and torch.allclose(out[1][-1], alone(1, 15), atol=1e-5)
    runner.rollback({}, rows=[1])  # row 0 finished: it leaves the cache
    assert runner.rows == [1] and runner.cache.layers[0].keys.shape[0] == 1
    out = runner.feed(tokens, {1: 16}, keep=1)
    assert torch.allclose(out[1][-1], alone(1, 16), atol=1e-5)


@pytest.mark.parametrize("rule", [rules.Greedy(), rules.Speculative()], ids=["greedy", "speculative"])
@pytest.mark.parametrize("bound", ["oracle", "perfect-h", "perfect-goodput"])
def test_the_hindsight_bounds_decode_each_row_as_alone(wide, rule, bound):
    """A bound reads the target in hindsight through a batched cache of its own: each row's tokens and counted calls
    are its decode alone (the hindsight forwards uncounted, the oracle's dropped candidates uncharged per row)."""
    policy = {"oracle": policies.Oracle(), "perfect-h": policies.PerfectHead(0.6),
              "perfect-goodput": policies.PerfectGoodput(CostModel(t_draft=0.2, t_target=1.0, t_companion=0.0))}[bound]
    prompts, budgets = wide_prompts(96)[:5], [20, 6, 20, 13, 20]
    decoder = make_decoder(wide, rule, policy, eos_token_id=[5, 40])
    batch = decoder.generate(prompts, max_new_tokens=budgets, seed=9)
    for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
        alone = decoder.generate(prompt, max_new_tokens=budget, seed=row_seed(9, i))
        assert torch.equal(batch.sequences[i], alone.sequences[0]), f"row {i}"
        assert comparable(batch.stats[i]) == comparable(alone.stats), f"row {i}"
    if bound == "oracle":  # a dropped candidate's draft call is uncharged: draft calls = accepted, row by row
        assert all(s.draft_calls == s.accepted for s in batch.stats) and sum(s.rejected for s in batch.stats) == 0


def test_unsupported_combinations_are_refused(wide):
    prompts = wide_prompts(96)[:2]
    decoder = make_decoder(wide, rules.Greedy(), policies.Fixed(2))
    with pytest.raises(ValueError, match="2 prompts but 3 max_new_tokens"):
        decoder.generate(prompts, max_new_tokens=[1, 2, 3])
    with pytest.raises(ValueError, match="at least one prompt"):
        decoder.generate([], max_new_tokens=4)
    with pytest.raises(ValueError, match="unknown cache layout"):
        decoder.generate(prompts, max_new_tokens=4, layout="ragged")


def test_text_prompts_and_a_2d_tensor(wide, make_tokenizer):
    tokenizer = make_tokenizer(96)
    decoder = make_decoder(wide, rules.Greedy(), policies.Fixed(3), tokenizer=tokenizer)
    out = decoder.generate(["w3 w4 w5", "w9"], max_new_tokens=[4, 6])
    assert [len(s) for s in out.sequences] == [7, 7] and out.texts is not None and len(out.texts) == 2
    assert out.texts[1] == tokenizer.decode(out.sequences[1][1:])
    again = decoder.generate(torch.tensor([[3, 4, 5], [9, 9, 9]]), max_new_tokens=4)
    assert torch.equal(again.sequences[0], out.sequences[0])


def test_padded_ids_with_an_attention_mask_decode_as_the_unpadded_rows(wide):
    """A tokenizer's padded input_ids + attention_mask, left or right padded, are the rows without padding."""
    decoder = make_decoder(wide, rules.Greedy(), policies.Fixed(3))
    rows = [torch.tensor([3, 4, 5, 6]), torch.tensor([9, 2])]
    expected = decoder.generate(rows, max_new_tokens=5).sequences
    left = torch.tensor([[3, 4, 5, 6], [0, 0, 9, 2]]), torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    right = torch.tensor([[3, 4, 5, 6], [9, 2, 0, 0]]), torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    for ids, mask in (left, right):
        out = decoder.generate(ids, max_new_tokens=5, attention_mask=mask)
        assert all(torch.equal(a, b) for a, b in zip(out.sequences, expected))
    unmasked = decoder.generate(left[0], max_new_tokens=5).sequences[1]  # padding read as prompt tokens
    assert not torch.equal(unmasked, expected[1])
    with pytest.raises(ValueError, match="one non-empty run of ones"):
        decoder.generate(left[0], max_new_tokens=5, attention_mask=torch.tensor([[1, 0, 1, 1], [0, 0, 1, 1]]))
    with pytest.raises(ValueError, match="same shape"):
        decoder.generate(left[0], max_new_tokens=5, attention_mask=torch.ones(2, 3, dtype=torch.long))


def test_generate_takes_one_prompt_or_several_as_hf_generate_does(wide):
    """One entry for every batch size: a list of prompts or a padded batch with its mask goes to the batched loop."""
    decoder = make_decoder(wide, rules.Speculative(), policies.Fixed(3))
    rows = [torch.tensor([3, 4, 5, 6]), torch.tensor([9, 2])]
    batch = decoder.generate(rows, max_new_tokens=6, seed=5)
    listed = decoder.generate(rows, max_new_tokens=6, seed=5)
    padded = decoder.generate(torch.tensor([[3, 4, 5, 6], [0, 0, 9, 2]]), max_new_tokens=6, seed=5,
                              attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]]))
    for out in (listed, padded):
        assert isinstance(out, BatchDecodeOutput)
        assert all(torch.equal(a, b) for a, b in zip(out.sequences, batch.sequences))
    one = decoder.generate([3, 4, 5, 6], max_new_tokens=6, seed=5)  # a list of ids is one prompt
    assert isinstance(one, DecodeOutput) and torch.equal(one.sequences[0], batch.sequences[0])
    assert one.sequences.is_inference() and listed.sequences[0].is_inference()  # both loops run without autograd


@pytest.mark.parametrize("family", ["qwen2", "phi3", "gpt2", "mistral", "gemma2"])
def test_model_families(family):
    """Full-attention families decode batched as alone (GPT-2: learned positions); sliding windows are refused."""
    target, draft = build(family, seed=1), build(family, seed=2)
    decoder = SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policies.Fixed(3), eos_token_id=None)
    prompts = [torch.tensor([1, 2, 3, 4, 5]), torch.arange(20, 32), torch.tensor([7])]
    if family in ("mistral", "gemma2"):
        with pytest.raises(ValueError, match="full-attention cache layers only.*DynamicSlidingWindowLayer"):
            decoder.generate(prompts, max_new_tokens=4)
        return
    out = decoder.generate(prompts, max_new_tokens=[12, 7, 12])
    for prompt, sequence, budget in zip(prompts, out.sequences, [12, 7, 12]):
        assert torch.equal(sequence, decoder.generate(prompt, max_new_tokens=budget).sequences[0])
