"""Measured batch costs (``decode.batch_costs``), a machine's cost profile at batch 1, and the goodput head that stops
rows at the batch's prices."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch

from decode import HeadConfig, policies, rules
from decode.batch_costs import BatchCosts, CostProfile, measure_batch_costs
from decode.compile.config import SHORT
from decode.compile.owner import CompiledModels
from decode.costs import CostModel, LatencyShape
from decode.head import PRE_FEATURES, AcceptanceHead
from decode.loops.step_costs import measure_cost_profile
from decode.loops.target_alone import generate_target_alone
from decode.policies import stops
from decode.profile import SVProfile
from tests.helpers.batched import comparable, make_decoder, wide_prompts

#: Verifying L candidates (L + 1 tokens fed) costs 1.0 + 0.1 (L - 1): linear, so the cost model's shape and the
#: table extrapolate alike.
LINEAR = tuple(1.0 + 0.1 * i for i in range(6))


def test_times_interpolate_between_and_extend_beyond_the_grid():
    costs = BatchCosts(batches=(1, 4), draft=(0.2, 0.5), target=((1.0, 1.5, 2.0), (2.0, 4.0, 6.0)))
    assert costs.draft_time(1) == 0.2 and costs.draft_time(2.5) == pytest.approx(0.35)
    assert costs.draft_time(8) == pytest.approx(0.5 + 0.1 * 4)  # the last interval's slope
    assert costs.target_time(4, 8) == pytest.approx(4.0)  # 2 tokens per row
    assert costs.target_time(4, 2) == pytest.approx(2.0)  # fewer candidates than rows: one token each
    assert costs.target_time(1, 5) == pytest.approx(2.0 + 0.5 * 2)  # beyond the measured lengths
    assert costs.target_time(2, 4) == pytest.approx((1.5 * 2 + 4.0 * 1) / 3)  # between batch sizes, L = 2
    assert costs.verify_time(4, 4) == pytest.approx(4.0)  # one candidate per row: two tokens fed
    assert costs.marginal_candidate(4, 1) == pytest.approx((6.0 - 4.0) / 4)


@pytest.mark.parametrize("bad", [
    {"batches": (2, 1), "draft": (1.0, 1.0), "target": ((1.0,), (1.0,))},
    {"batches": (1, 2), "draft": (1.0,), "target": ((1.0,), (1.0,))},
    {"batches": (1, 2), "draft": (1.0, 1.0), "target": ((1.0,), (1.0, 2.0))},
])
def test_a_malformed_table_is_refused(bad):
    with pytest.raises(ValueError):
        BatchCosts(**bad)


def test_measured_costs_cover_every_batch_size_and_length(wide):
    costs = measure_batch_costs(wide["target"], wide["draft"], batches=(1, 3), max_length=2, context=4, repeats=1)
    assert costs.batches == (1, 3) and len(costs.draft) == 2 and [len(r) for r in costs.target] == [2, 2]
    assert [len(r) for r in costs.draft_widths] == [2, 2] and costs.draft == tuple(r[0] for r in costs.draft_widths)
    assert min(costs.draft) > 0 and min(min(r) for r in costs.target) > 0
    assert costs.draft[0] <= costs.draft[1]  # made non-decreasing in the rows and in the tokens
    assert all(a <= b for row in costs.target for a, b in zip(row, row[1:]))
    assert all(a <= b for a, b in zip(costs.target[0], costs.target[1]))


def test_companion_forwards_are_priced_from_the_companions_table():
    costs = BatchCosts(batches=(1, 4), draft=(0.2, 0.5), target=((1.0, 1.5), (2.0, 4.0)),
                       companion=((0.3, 0.4), (0.6, 0.9)))
    assert costs.companion_time(4, 8) == pytest.approx(0.9) and costs.companion_time(1, 1) == pytest.approx(0.3)
    prompt = (4, 10)  # every model's first forward holds the prompts: left out
    seconds = costs.modelled_seconds([prompt, (4, 2)], [prompt, (4, 1)], [prompt, (4, 2)])
    assert seconds == pytest.approx(4.0 + 0.5 + 0.9)
    assert costs.batch_one().t_companion == pytest.approx(0.3)
    without = BatchCosts(batches=(1, 4), draft=(0.2, 0.5), target=((1.0, 1.5), (2.0, 4.0)))
    with pytest.raises(ValueError, match="no companion prices"):  # never priced as free
        without.modelled_seconds([prompt, (4, 2)], [prompt], [prompt, (4, 2)])
    assert without.batch_one().t_companion == 0.0
    with pytest.raises(ValueError, match="companion row"):
        BatchCosts(batches=(1, 4), draft=(0.2, 0.5), target=((1.0,), (2.0,)), companion=((0.3,),))


def test_draft_forwards_are_priced_from_the_measured_widths_when_there_are_some():
    linear = BatchCosts(batches=(1, 4), draft=(0.2, 0.5), target=((1.0, 1.5), (2.0, 4.0)))
    measured = BatchCosts(batches=(1, 4), draft=(0.2, 0.5), target=((1.0, 1.5), (2.0, 4.0)),
                          draft_widths=((0.2, 0.25, 0.3), (0.5, 0.6, 0.9)))
    assert linear.draft_forward_time(4, 2) == pytest.approx(1.0)  # two one-token forwards
    assert measured.draft_forward_time(4, 2) == pytest.approx(0.6) and measured.draft_forward_time(1, 1) == 0.2
    prompt = (4, 10)
    assert measured.modelled_seconds([prompt], [prompt, (4, 1), (4, 2)]) == pytest.approx(0.5 + 0.6)
    with pytest.raises(ValueError, match="draft_widths row"):
        BatchCosts(batches=(1, 4), draft=(0.2, 0.5), target=((1.0,), (2.0,)), draft_widths=((0.2,),))


def test_the_target_alone_pays_one_forward_of_one_token_per_row_and_step():
    costs = BatchCosts(batches=(1, 4), draft=(0.2, 0.5), target=((1.0, 1.5), (2.0, 4.0)))
    assert costs.target_alone_seconds(4, 10) == pytest.approx(10 * 2.0)
    assert costs.target_alone_seconds(1, 3) == pytest.approx(3 * 1.0)


def test_measured_companion_table_has_the_targets_layout(wide):
    costs = measure_batch_costs(wide["target"], wide["draft"], batches=(1, 2), max_length=3, context=4, repeats=1,
                                companion=wide["companion"])
    assert [len(row) for row in costs.companion] == [3, 3] and min(min(r) for r in costs.companion) > 0
    assert all(a <= b for row in costs.companion for a, b in zip(row, row[1:]))


@pytest.mark.parametrize("eos", [None, [5, 7, 9, 11, 13]])
def test_target_alone_counts_tokens_to_each_rows_eos_and_the_steps_the_batch_paid(wide, eos):
    prompts = wide_prompts(96)[:3]
    out = generate_target_alone(wide["target"], prompts, 12, eos, do_sample=True, seed=2)
    assert out.rows == 3 and out.wall_time_s > 0 and out.steps <= 11
    if eos is None:
        assert out.tokens == 3 * 12 and out.steps == 11  # every row decodes the budget
    else:
        assert 3 <= out.tokens < 3 * 12  # some row stopped at an EOS id (seeded), each kept at least one token
    greedy = [generate_target_alone(wide["target"], prompts, 12, eos, do_sample=False, seed=s).tokens for s in (1, 2)]
    assert greedy[0] == greedy[1]  # greedy does not depend on the seed


def test_a_profiles_measured_batch_table_is_svs_t_t_of_b_and_t():
    sizes, table = (1, 4), ((1.0, 1.5, 2.0), (2.0, 4.0, 6.0))
    profile = SVProfile(x_edges=torch.tensor([0.0, 1.0]), y_edges=torch.tensor([0.0, 1.0]), table=torch.ones(1, 1),
                        counts=torch.ones(1, 1), latency=torch.tensor([1.0, 1.0]),
                        batch_sizes=torch.tensor(sizes), batch_latency_table=torch.tensor(table, dtype=torch.float64))
    costs = BatchCosts(batches=sizes, draft=(0.1, 0.2), target=table)
    for batch, total in ((1, 1), (4, 4), (4, 7), (2, 3), (4, 12)):
        assert profile.batch_latency(batch, total) == pytest.approx(costs.verify_time(batch, total))
    flat = SVProfile(x_edges=torch.tensor([0.0, 1.0]), y_edges=torch.tensor([0.0, 1.0]), table=torch.ones(1, 1),
                     counts=torch.ones(1, 1), latency=torch.tensor([1.0, 1.0]))
    assert flat.batch_latency(4, 12) == 1.0 != profile.batch_latency(4, 12)  # without a table: no batch effect
    assert set(profile.tensors()) - set(flat.tensors()) == {"batch_sizes", "batch_latency_table"}
    with pytest.raises(ValueError, match="together"):
        SVProfile(x_edges=torch.tensor([0.0, 1.0]), y_edges=torch.tensor([0.0, 1.0]), table=torch.ones(1, 1),
                  counts=torch.ones(1, 1), latency=torch.tensor([1.0]), batch_sizes=torch.tensor([1, 4]),
                  batch_latency_table=torch.ones(3, 2))


def goodput_head(hidden: int, batch_costs: BatchCosts | None, t_target: float = 1.0) -> policies.GoodputHead:
    torch.manual_seed(3)
    head = AcceptanceHead(HeadConfig(hidden, depth=2, timing="pre", features=PRE_FEATURES))
    costs = CostModel(t_draft=0.2, t_target=t_target, t_companion=0.0, latency=LatencyShape(LINEAR))
    return policies.GoodputHead(head, costs, k_max=8, batch_costs=batch_costs)


def test_a_batch_of_one_at_the_same_prices_decides_as_the_batch_one_goodput_head(wide):
    alone_policy = goodput_head(wide["draft"].config.hidden_size, None)
    batch_policy = goodput_head(wide["draft"].config.hidden_size,
                                BatchCosts(batches=(1,), draft=(0.2,), target=((1.0,) + LINEAR,)))
    prompt = wide_prompts(96)[2]
    alone = make_decoder(wide, rules.Speculative(), alone_policy).generate(prompt, max_new_tokens=24, seed=5)
    batch = make_decoder(wide, rules.Speculative(), batch_policy).generate([prompt], max_new_tokens=24,
                                                                                 seed=[5])
    assert len(alone.stats.verified_per_round) > 2  # several rounds were decided
    assert torch.equal(batch.sequences[0], alone.sequences[0])
    assert comparable(batch.stats[0]) == comparable(alone.stats)


def test_the_batch_opens_a_drafting_round_only_where_the_forecast_pays(wide):
    hidden = wide["draft"].config.hidden_size
    flat = BatchCosts((1, 4), draft=(0.2, 0.25), target=((1.0,) * 6, (1.2,) * 6))
    rows = [goodput_head(hidden, flat).stop for _ in range(4)]
    assert stops.batch_opening_pays(rows, 4, throughput=10.0)  # no forecast yet: the first round drafts
    for row, first in zip(rows, (0.9, 0.8, 0.7, 0.9)):
        row.stops(1, first, first)  # a first candidate's estimate makes the next round's forecast
    assert stops.batch_opening_pays(rows, 4, throughput=4 / 1.2)  # draft forwards are cheap, columns free
    assert not stops.batch_opening_pays(rows, 4, throughput=40.0)  # a batch 10x faster: not worth a draft
    costly = [goodput_head(hidden, BatchCosts((1, 4), draft=(5.0, 5.0), target=((1.0,) * 6, (1.2,) * 6))).stop
              for _ in range(4)]
    for row in costly:
        row.stops(1, 0.9, 0.9)
    assert not stops.batch_opening_pays(costly, 4, throughput=4 / 1.2)


def test_where_drafting_never_pays_the_batch_decodes_target_only_steps(wide):
    """After the first round (no forecast yet) every round of the batch is a target step: no draft forwards."""
    hidden = wide["draft"].config.hidden_size
    hopeless = BatchCosts((1, 4), draft=(50.0, 50.0), target=((1.0,) * 6, (1.2,) * 6))
    cheap = BatchCosts((1, 4), draft=(0.01, 0.01), target=((1.0,) * 6, (1.2,) * 6))
    prompts = wide_prompts(96)[:4]
    runs = {}
    for name, costs in (("hopeless", hopeless), ("cheap", cheap)):
        decoder = make_decoder(wide, rules.Speculative(), goodput_head(hidden, costs))
        runs[name] = decoder.generate(prompts, max_new_tokens=16, seed=2)
    off, on = runs["hopeless"], runs["cheap"]
    assert all(s.generated == 16 for s in off.stats)  # every row still decodes its budget
    assert all(set(s.verified_per_round[1:]) == {0} for s in off.stats)  # later rounds verify nothing
    assert off.totals.draft_calls <= 8 and off.totals.target_calls >= 15  # the first round's drafts only
    assert on.totals.draft_calls > off.totals.draft_calls and on.totals.target_calls < off.totals.target_calls


def test_rows_draft_longer_where_verification_is_cheap_in_its_length(wide):
    """Same head, same prompts: a device whose verification barely grows with the candidates (GPU-like) drafts
    more per round than one that pays per candidate (compute-bound)."""
    hidden = wide["draft"].config.hidden_size
    batches = (1, 4)
    flat = BatchCosts(batches, draft=(0.2, 0.25), target=((1.0,) * 6, (1.2,) * 6))
    steep = BatchCosts(batches, draft=(0.2, 0.25), target=(tuple(1.0 + i for i in range(6)),
                                                           tuple(4.0 * (1 + i) for i in range(6))))
    prompts = wide_prompts(96)[:4]

    def drafted_per_round(costs: BatchCosts) -> float:
        decoder = make_decoder(wide, rules.Speculative(), goodput_head(hidden, costs))
        out = decoder.generate(prompts, max_new_tokens=20, seed=1)
        return sum(s.drafted for s in out.stats) / sum(s.rounds for s in out.stats)

    cheap, dear = drafted_per_round(flat), drafted_per_round(steep)
    assert cheap > dear + 1.0, (cheap, dear)


#: A profile's target forwards of m = 1..4 tokens (T(m), seconds) and the draft's one-token step.
STEPS = (0.040, 0.050, 0.060, 0.080)
PROFILE = CostProfile("a CPU, AVX512, 1 thread", "bfloat16",
                      BatchCosts(batches=(1,), draft=(0.003,), target=(STEPS,), companion=((0.01, 0.02, 0.03, 0.04),)))


class Rounds:
    """What the cost model reads of a generation: its calls and the candidates each round verified."""

    def __init__(self, verified: list[int], draft_calls: int) -> None:
        self.target_calls, self.draft_calls, self.companion_calls = len(verified), draft_calls, 0
        self.verified_per_round = verified
        self.source_key, self.source_calls, self.source_updates = None, 0, 0  # no source priced


def test_a_profile_prices_a_round_of_l_candidates_at_the_forward_of_l_plus_one_tokens():
    model = PROFILE.cost_model()
    assert PROFILE.ratios() == pytest.approx((1.0, 1.25, 1.5, 2.0))  # T(m) / T(1)
    assert (model.t_target, model.target_alone, model.t_draft, model.t_companion) == (0.050, 0.040, 0.003, 0.01)
    assert model.latency.values == pytest.approx((1.0, 0.060 / 0.050, 0.080 / 0.050))  # T(L + 1) / T(2)
    # rounds verifying 3, 1 and 2 candidates feed 4, 2 and 3 tokens: T(4) + T(2) + T(3), and six draft steps
    assert model.time(Rounds([3, 1, 2], draft_calls=6)) == pytest.approx(0.080 + 0.050 + 0.060 + 6 * 0.003)
    assert PROFILE.shares() == pytest.approx({"draft": 0.075, "companion": 0.25})


def test_a_profile_says_where_and_how_it_was_measured():
    caption = PROFILE.caption()
    assert "a CPU, AVX512, 1 thread" in caption and "bfloat16" in caption and "eager" in caption
    assert "draft 0.075" in caption and "1.00 1.25 1.50 2.00" in caption
    with pytest.raises(ValueError, match="no compiled forwards"):
        PROFILE.caption(compiled=True)
    with pytest.raises(ValueError, match="batch size 1"):
        CostProfile("a CPU", "float32", BatchCosts(batches=(1, 2), draft=(1.0, 1.0), target=((1.0,), (1.0,))))


def test_a_profile_round_trips_through_its_json():
    compiled = replace(PROFILE, compiled=BatchCosts(batches=(1,), draft=(0.002,), target=((0.03, 0.035, 0.04, 0.05),)))
    for profile in (PROFILE, compiled):
        assert CostProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile
    assert compiled.ratios(compiled=True)[-1] == pytest.approx(0.05 / 0.03)


def test_a_measured_profile_times_every_feed_of_a_compiled_round_at_batch_one(wide):
    profile = measure_cost_profile(wide["target"], wide["draft"], wide["companion"], repeats=1, context=8)
    assert profile.dtype == "float32" and "thread" in profile.machine and profile.compiled is None
    costs = profile.eager
    assert costs.batches == (1,) and len(costs.target[0]) == len(costs.companion[0]) == SHORT
    assert profile.ratios()[0] == 1.0 and all(a <= b for a, b in zip(profile.ratios(), profile.ratios()[1:]))
    assert costs.draft == (costs.draft_widths[0][0],) and set(profile.shares()) == {"draft", "companion"}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
def test_a_compiled_profile_times_the_models_compiled_forwards(wide):
    with CompiledModels() as owner:
        profile = measure_cost_profile(wide["target"], wide["draft"], repeats=1, context=8, compiled=True, owner=owner)
        assert owner.log(wide["target"]).graphs >= 2  # the one-token graph and the symbolic one
    assert profile.compiled is not None and len(profile.compiled.target[0]) == SHORT
    assert "compiled" in profile.caption(compiled=True)
