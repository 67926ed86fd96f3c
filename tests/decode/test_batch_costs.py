"""Measured batch costs (``decode.batch_costs``) and the goodput head that stops rows at the batch's prices."""

from __future__ import annotations

import pytest
import torch
from test_batched import comparable, make_decoder, wide_prompts

from decode import HeadConfig, policies, rules, stop_rules
from decode.batch_costs import BatchCosts, measure_batch_costs
from decode.costs import CostModel, LatencyShape
from decode.head import PRE_FEATURES, AcceptanceHead
from decode.loops.target_alone import generate_target_alone
from decode.profile import SVProfile

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
    batch = make_decoder(wide, rules.Speculative(), batch_policy).generate_batch([prompt], max_new_tokens=24,
                                                                                 seed=[5])
    assert len(alone.stats.verified_per_round) > 2  # several rounds were decided
    assert torch.equal(batch.sequences[0], alone.sequences[0])
    assert comparable(batch.stats[0]) == comparable(alone.stats)


def test_the_batch_opens_a_drafting_round_only_where_the_forecast_pays(wide):
    hidden = wide["draft"].config.hidden_size
    flat = BatchCosts((1, 4), draft=(0.2, 0.25), target=((1.0,) * 6, (1.2,) * 6))
    rows = [goodput_head(hidden, flat).stop for _ in range(4)]
    assert stop_rules.batch_opening_pays(rows, 4, throughput=10.0)  # no forecast yet: the first round drafts
    for row, first in zip(rows, (0.9, 0.8, 0.7, 0.9)):
        row.stops(1, first, first)  # a first candidate's estimate makes the next round's forecast
    assert stop_rules.batch_opening_pays(rows, 4, throughput=4 / 1.2)  # draft forwards are cheap, columns free
    assert not stop_rules.batch_opening_pays(rows, 4, throughput=40.0)  # a batch 10x faster: not worth a draft
    costly = [goodput_head(hidden, BatchCosts((1, 4), draft=(5.0, 5.0), target=((1.0,) * 6, (1.2,) * 6))).stop
              for _ in range(4)]
    for row in costly:
        row.stops(1, 0.9, 0.9)
    assert not stop_rules.batch_opening_pays(costly, 4, throughput=4 / 1.2)


def test_where_drafting_never_pays_the_batch_decodes_target_only_steps(wide):
    """After the first round (no forecast yet) every round of the batch is a target step: no draft forwards."""
    hidden = wide["draft"].config.hidden_size
    hopeless = BatchCosts((1, 4), draft=(50.0, 50.0), target=((1.0,) * 6, (1.2,) * 6))
    cheap = BatchCosts((1, 4), draft=(0.01, 0.01), target=((1.0,) * 6, (1.2,) * 6))
    prompts = wide_prompts(96)[:4]
    runs = {}
    for name, costs in (("hopeless", hopeless), ("cheap", cheap)):
        decoder = make_decoder(wide, rules.Speculative(), goodput_head(hidden, costs))
        runs[name] = decoder.generate_batch(prompts, max_new_tokens=16, seed=2)
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
        out = decoder.generate_batch(prompts, max_new_tokens=20, seed=1)
        return sum(s.drafted for s in out.stats) / sum(s.rounds for s in out.stats)

    cheap, dear = drafted_per_round(flat), drafted_per_round(steep)
    assert cheap > dear + 1.0, (cheap, dear)
