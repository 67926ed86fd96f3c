"""The feature draft's training recipe v2 (``docs/design.md`` §8): each loss against a hand-computed case, the
training-time test equal to decoding's incremental rounds, the on-policy and unreachable-position masks, the
low-rank head's start, and response shards over several temperatures."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from decode.drafts.feature_model import feature_reads, target_features
from model_build.feature_draft.__main__ import shards_table
from model_build.feature_draft.losses import (
    DISTRIBUTION_LOSSES,
    acceptance,
    lk_hybrid,
    lk_weight,
    soft_cross_entropy,
    total_variation,
)
from model_build.feature_draft.model import FeatureDraftShape, initial_draft, trained_tensors, warm_start
from model_build.feature_draft.response_pack import PackError, pack_responses, record_path, unpack_responses
from model_build.feature_draft.shards import RESPONSES, ShardPlan, ShardTimes, build_shards, read_shard, shard_file
from model_build.feature_draft.training import (
    FeatureTraining,
    depth_losses,
    subset_columns,
    subset_scores,
    unrolled_hidden,
)
from tests.helpers.micro_models import incremental_round_logits, micro_feature_draft, micro_lm

VOCAB = 96

# p: the target's top-3 (token 2 off the draft's subset, so zeroed); q: the draft's probabilities of the same tokens
P = torch.tensor([[0.5, 0.3, 0.0]])
Q = torch.tensor([[0.2, 0.5, 0.3]])


def test_each_loss_matches_its_definition_by_hand():
    log_q = Q.log()
    alpha = 0.2 + 0.3 + 0.0  # Σ min(p, q)
    kl = -(0.5 * math.log(0.2) + 0.3 * math.log(0.5))
    lam = math.exp(-3 * alpha)
    expected = {"kl": kl, "tv": 1 - alpha, "neg_log_alpha": -math.log(alpha), "lk": lam * kl + (1 - lam) * (1 - alpha)}
    assert acceptance(P, log_q).item() == pytest.approx(alpha)
    for name, value in expected.items():
        assert DISTRIBUTION_LOSSES[name](P, log_q).item() == pytest.approx(value, rel=1e-5), name


def test_the_lk_weight_is_detached():
    log_q = Q.log().requires_grad_()
    lk_hybrid(P, log_q).sum().backward()
    lam = lk_weight(acceptance(P, Q.log()))
    reference = Q.log().requires_grad_()
    (lam * soft_cross_entropy(P, reference) + (1 - lam) * total_variation(P, reference)).sum().backward()
    torch.testing.assert_close(log_q.grad, reference.grad)
    # negative control: a weight left in the graph gives another gradient
    attached = Q.log().requires_grad_()
    weight = torch.exp(-3 * acceptance(P, attached))
    (weight * soft_cross_entropy(P, attached) + (1 - weight) * total_variation(P, attached)).sum().backward()
    assert (attached.grad - log_q.grad).abs().max() > 1e-3


def test_an_unknown_loss_fails_in_one_line():
    with pytest.raises(ValueError, match="unknown feature-draft loss 'kld'; choose one of"):
        FeatureTraining(loss="kld")


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    target = micro_lm(VOCAB, seed=31, hidden=32, layers=2, init=0.3)
    draft = micro_feature_draft(target, seed=5, hidden=16, feature_layers=(1, 2), init=0.3, feature_norm=True)
    return target, draft


def teacher_batch(target, sequences: list[list[int]], top_k: int = 4) -> dict[str, torch.Tensor]:
    """A right-padded training batch as :class:`model_build.feature_draft.training.TeacherData` collates it."""
    width = max(map(len, sequences))
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.bool)
    for row, sequence in enumerate(sequences):
        ids[row, :len(sequence)], mask[row, :len(sequence)] = torch.tensor(sequence), True
    with torch.no_grad():
        out = target(ids, attention_mask=mask.long(), output_hidden_states=True)
    top = out.logits.softmax(-1).topk(top_k, dim=-1)
    return {"ids": ids, "features": target_features(out.hidden_states, (1, 2)), "top_ids": top.indices,
            "top_probs": top.values, "mask": mask}


def random_prompts(count: int, seed: int) -> list[list[int]]:
    """``count`` prompts of 3 to 11 random ids."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (int(n),), generator=generator).tolist()
            for n in torch.randint(3, 12, (count,), generator=generator)]


SEQUENCES = [[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 12], [44, 8, 90, 15, 27, 3, 66]]


def test_the_training_time_test_computes_each_depth_as_an_incremental_decode(pair):
    """With gradients on (as in training), every depth's logits equal decoding's, one token per forward (float32);
    the causal unroll of v1 does not (negative control)."""
    target, draft = pair
    batch, depths = teacher_batch(target, SEQUENCES), 4
    reads = feature_reads(draft.fuse_features(batch["features"]), batch["mask"].long())
    exact = unrolled_hidden(draft, batch["ids"], batch["mask"], reads, depths, exact_masks=True)
    causal = unrolled_hidden(draft, batch["ids"], batch["mask"], reads, depths, exact_masks=False)
    assert exact[-1].requires_grad
    head = draft.get_output_embeddings()
    compared, differ = 0, 0.0
    for row, sequence in enumerate(SEQUENCES):
        reference = incremental_round_logits(target, draft, sequence, depths)
        for depth in range(1, depths + 1):
            for position, logits in reference[depth - 1].items():
                torch.testing.assert_close(head(exact[depth - 1][row, position]).detach(), logits, atol=1e-5,
                                           rtol=1e-5)
                differ = max(differ, float((head(causal[depth - 1][row, position]).detach() - logits).abs().max()))
                compared += 1
    assert compared == sum(len(s) * depths - depths * (depths - 1) // 2 for s in SEQUENCES)
    assert differ > 1e-3


def test_the_on_policy_pass_keeps_only_rejected_positions(pair):
    target, draft = pair
    batch = teacher_batch(target, SEQUENCES)
    with torch.no_grad():  # independently: the draft's depth-1 argmax, made the target's top token at every third
        reads = feature_reads(draft.fuse_features(batch["features"]), batch["mask"].long())
        guess = draft(input_ids=batch["ids"], features=reads).logits.argmax(-1)
    batch["top_ids"][:, ::3, 0] = guess[:, ::3]
    training = FeatureTraining(unroll=1)
    columns = subset_columns(draft)
    everywhere = depth_losses(draft, batch, training, columns)[0]
    on_policy = depth_losses(draft, batch, training, columns, on_policy=True)[0]
    trained = batch["mask"].clone()
    trained[:, 0] = False
    rejected = trained & (guess != batch["top_ids"][..., 0])
    assert everywhere.positions == int(trained.sum())
    assert on_policy.positions == int(rejected.sum()) and 0 < on_policy.positions < everywhere.positions
    assert on_policy.agreement.item() == 0.0  # every kept position is a rejection


def test_unreachable_positions_are_masked_after_the_first_miss(pair):
    """Depth 2 keeps a position only where depth 1 of its round had the token fed next in its top-k."""
    target, draft = pair
    batch = teacher_batch(target, SEQUENCES)
    columns = subset_columns(draft)
    plain = depth_losses(draft, batch, FeatureTraining(unroll=2), columns)
    masked = depth_losses(draft, batch, FeatureTraining(unroll=2, unreachable_top_k=8), columns)
    assert masked[0].positions == plain[0].positions
    with torch.no_grad():
        reads = feature_reads(draft.fuse_features(batch["features"]), batch["mask"].long())
        top = draft(input_ids=batch["ids"], features=reads).logits.topk(8, dim=-1).indices  # [B, L, 8]
    hits = (top[:, :-1] == batch["ids"][:, 1:, None]).any(-1)  # depth 1 at t proposed token t + 1 in its top-8
    depth2 = batch["mask"][:, 2:] & hits[:, 1:]  # depth 2 at t ≥ 2: its round started at t − 1
    assert masked[1].positions == int(depth2.sum()) < plain[1].positions


def test_a_low_rank_head_starts_as_the_best_rank_r_approximation():
    target = micro_lm(VOCAB, seed=31, hidden=32, layers=2, init=0.3)
    subset = torch.arange(0, VOCAB, 2)
    full = initial_draft(target, FeatureDraftShape(vocab_subset=48), subset)
    low = initial_draft(target, FeatureDraftShape(vocab_subset=48, head_rank=8, feature_norm=True), subset)
    hidden = torch.randn(5, 32)
    with torch.no_grad():
        exact, approx = subset_scores(full, hidden), subset_scores(low, hidden)
        whole = low.get_output_embeddings()(hidden)
    rows = target.get_input_embeddings().weight[subset].detach()
    best = torch.linalg.matrix_norm(rows - torch.linalg.svd(rows).U[:, :8] @ torch.diag(
        torch.linalg.svdvals(rows)[:8]) @ torch.linalg.svd(rows).Vh[:8])
    weight, down = low.lm_head.weight.detach(), low.lm_head.down.weight.detach()
    assert weight.shape == (48, 8) and down.shape == (8, 32)
    assert torch.linalg.matrix_norm(rows - weight @ down).item() == pytest.approx(best.item(), rel=1e-4)
    assert (approx - exact).abs().max() > 1e-4  # rank 8 of 32 is not the full layer
    off = torch.ones(VOCAB, dtype=torch.bool)
    off[subset] = False
    assert torch.equal(whole[:, off], torch.full_like(whole[:, off], torch.finfo(whole.dtype).min))


def test_an_eagle3_first_layer_starts_as_the_logit_lens_of_the_last_layer_it_reads():
    target = micro_lm(VOCAB, seed=31, hidden=32, layers=2, init=0.3)
    subset = torch.arange(0, VOCAB, 2)
    shape = FeatureDraftShape(vocab_subset=48, first_layer="eagle3", feature_layers=(0, 1))
    draft = initial_draft(target, shape, subset)
    assert shape.reads(micro_lm(VOCAB, seed=1, hidden=8, layers=30)) == (0, 1)
    assert FeatureDraftShape(first_layer="eagle3").reads(micro_lm(VOCAB, seed=1, hidden=8, layers=30)) == (2, 15, 27)
    ids = torch.randint(1, VOCAB, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
        reads = feature_reads(draft.fuse_features(target_features(hidden, (0, 1))), torch.ones_like(ids))
        logits = draft(input_ids=ids, features=reads).logits[0, 1:, subset]
        # layer 1's logit lens a position before, through the target's embeddings (the draft's output layer's start)
        lens = target.model.norm(hidden[1])[0, :-1] @ target.get_input_embeddings().weight[subset].T
    torch.testing.assert_close(logits, lens, atol=1e-4, rtol=1e-4)
    moved = initial_draft(target, FeatureDraftShape(vocab_subset=48, first_layer="eagle3", feature_layers=(1, 2)),
                          subset)
    with torch.no_grad():  # negative control: reading another layer last starts elsewhere
        other = moved(input_ids=ids, features=feature_reads(moved.fuse_features(target_features(hidden, (1, 2))),
                                                            torch.ones_like(ids))).logits[0, 1:, subset]
    assert (other - lens).abs().max() > 1e-2


def test_a_warm_start_takes_every_trained_tensor_and_refuses_another_shape():
    target = micro_lm(VOCAB, seed=31, hidden=32, layers=2, init=0.3)
    subset = torch.arange(0, VOCAB, 2)
    trained = initial_draft(target, FeatureDraftShape(vocab_subset=48), subset)
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(torch.randn_like(parameter))
    fresh = initial_draft(target, FeatureDraftShape(vocab_subset=48), subset)
    warm_start(fresh, trained_tensors(trained, torch.float32))
    assert all(torch.equal(fresh.state_dict()[name], tensor)
               for name, tensor in trained_tensors(trained, torch.float32).items())
    assert torch.equal(fresh.model.embed_tokens.weight, target.get_input_embeddings().weight)  # never trained
    other = initial_draft(target, FeatureDraftShape(vocab_subset=48, head_rank=8), subset)
    with pytest.raises(ValueError, match="lacks"):
        warm_start(other, trained_tensors(trained, torch.float32))


def test_response_shards_take_one_pass_per_temperature(tmp_path):
    target = micro_lm(VOCAB, seed=31, hidden=32, layers=2, init=0.3)
    prompts = random_prompts(6, seed=4)
    plan = ShardPlan(prompts_per_shard=3, response_tokens=6, generation_batch=2, target_sha256="micro",
                     temperatures=(1.0, 0.0))
    times = ShardTimes()
    paths = build_shards(target, prompts, tmp_path, plan, eos=None, pad=0, vocab=VOCAB, shards=4, teacher=False,
                         times=times)
    assert paths == [shard_file(tmp_path, RESPONSES, i) for i in range(4)]
    assert times.response_tokens == 12 * 6 and times.teacher_positions == 0  # every response runs its 6 tokens
    console = Console(record=True, width=160)
    console.print(shards_table(paths, times))
    assert "72 response tokens" in console.export_text()
    greedy = read_shard(paths[3], plan, RESPONSES)  # pass 1 (T = 0), the second slice: prompts 3..5
    at = 0
    for row, prompt in enumerate(prompts[3:]):
        length = int(greedy["lengths"][row])
        sequence = greedy["tokens"][at:at + length].tolist()
        reference = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=6, min_new_tokens=6)
        assert sequence == reference[0].tolist()
        at += length
    sampled = read_shard(paths[1], plan, RESPONSES)  # pass 0 (T = 1) over the same prompts: other tokens
    assert not torch.equal(sampled["tokens"], greedy["tokens"])
    with pytest.raises(ValueError, match="2 temperature passes; there are 6 prompts"):
        build_shards(target, prompts, tmp_path, plan, eos=None, pad=0, vocab=VOCAB, shards=5, teacher=False)
    one_pass = dataclasses.replace(plan, temperatures=(1.0,))
    assert "temperatures" not in one_pass.fingerprint(RESPONSES)["plan"]  # single T = 1 shards: fingerprints as before


def test_a_response_pack_restores_the_shards_and_refuses_what_does_not_match(tmp_path):
    target = micro_lm(VOCAB, seed=31, hidden=32, layers=2, init=0.3)
    prompts = random_prompts(5, seed=5)
    plan = ShardPlan(prompts_per_shard=2, response_tokens=5, generation_batch=2, target_sha256="micro",
                     temperatures=(1.0, 0.0))
    made = build_shards(target, prompts, tmp_path / "made", plan, eos=None, pad=0, vocab=VOCAB, shards=5,
                        teacher=False)
    pack = tmp_path / "responses.safetensors"
    record = pack_responses(tmp_path / "made", plan, 5, pack)
    assert record["sequences"] == 9 and record_path(pack).is_file()
    restored = unpack_responses(pack, plan, prompts, tmp_path / "restored")
    for a, b in zip(made, restored):
        assert a.name == b.name and load_file(a).keys() == load_file(b).keys()
        for name, tensor in load_file(a).items():
            assert torch.equal(tensor, load_file(b)[name]), name
    # negative controls: other prompts, another plan, a changed byte
    with pytest.raises(PackError, match="other prompts"):
        unpack_responses(pack, plan, [p[::-1] for p in prompts], tmp_path / "other")
    with pytest.raises(PackError, match="another configuration"):
        unpack_responses(pack, dataclasses.replace(plan, seed=1), prompts, tmp_path / "other")
    data = bytearray(pack.read_bytes())
    data[-1] ^= 1
    pack.write_bytes(bytes(data))
    with pytest.raises(PackError, match="sha256"):
        unpack_responses(pack, plan, prompts, tmp_path / "other")


def test_realism_chains_each_rounds_acceptances_and_reads_older_records():
    """Unconditional acceptance at depth d is the mean over rounds of the product along each round; conditional is
    its ratio to depth d − 1; a record from before per-round products falls back to the depth means."""
    from model_build.feature_draft.realism import DepthFigures, FeatureRealism, round_products

    overlaps = [[0.5, 1.0, 0.2], [0.4, 0.5], [1.0]]  # depth d, round s (deeper depths reach fewer rounds)
    assert round_products(overlaps) == [[0.5, 1.0, 0.2], [0.2, 0.5], [0.2]]
    figures = DepthFigures("dev", "dev", 1, 3, acceptance=(0.5, 0.45, 1.0), greedy_agreement=0.5,
                           old_acceptance=None, reached=(0.5, 0.35, 0.2))
    assert figures.conditional == pytest.approx((0.5, 0.7, 0.2 / 0.35))
    realism = FeatureRealism((figures,), cost=0.1, old_cost=None, dtype="float32")
    assert realism.modelled_speedup(figures, 2) == pytest.approx((1 + 0.5 + 0.35) / 1.2)  # flat: v_K = 1
    measured = FeatureRealism((figures,), cost=0.1, old_cost=None, dtype="float32", verify_costs=(1.1, 1.3, 1.4))
    assert measured.modelled_speedup(figures, 2) == pytest.approx((1 + 0.5 + 0.35) / (0.2 + 1.3))
    assert "measured" in measured.priced and "flat" in realism.priced
    assert FeatureRealism.from_dict(measured.to_dict()) == measured
    old = FeatureRealism.from_dict({**realism.to_dict(), "sets": [
        {k: v for k, v in figures.__dict__.items() if k != "reached"}]})
    assert old.sets[0].expected_chain == pytest.approx((0.5, 0.225, 0.225))


def test_the_unconditional_figure_multiplies_alpha_along_each_round(pair):
    target, draft = pair
    batch = teacher_batch(target, SEQUENCES)
    columns = subset_columns(draft)
    losses = depth_losses(draft, batch, FeatureTraining(unroll=3), columns)
    with torch.no_grad():  # α per position and depth, computed here from the draft's logits
        reads = feature_reads(draft.fuse_features(batch["features"]), batch["mask"].long())
        hiddens = unrolled_hidden(draft, batch["ids"], batch["mask"], reads, 3, exact_masks=True)
        p = batch["top_probs"]
        alphas = [torch.minimum(p, draft.get_output_embeddings()(h).softmax(-1).gather(-1, batch["top_ids"])).sum(-1)
                  for h in hiddens]
    for depth in range(1, 4):
        products = []
        for row, sequence in enumerate(SEQUENCES):
            for t in range(depth, len(sequence)):  # round start t − depth + 1 ≥ 1
                products.append(math.prod(float(alphas[j][row, t - depth + 1 + j]) for j in range(depth)))
        assert losses[depth - 1].positions == len(products)
        assert losses[depth - 1].reached.item() == pytest.approx(sum(products) / len(products), rel=1e-4)
    assert losses[0].reached.item() == pytest.approx(losses[0].overlap.item())


def test_the_ablation_trains_each_arm_once_and_prints_its_table(tmp_path, capsys):
    from model_build.feature_draft.ablation import main

    target = micro_lm(VOCAB, seed=31, hidden=32, layers=2, init=0.3)
    target.save_pretrained(tmp_path / "target")
    prompts = random_prompts(12, seed=6)
    plan = ShardPlan(prompts_per_shard=6, response_tokens=10, generation_batch=3, teacher_batch=3, top_k=8,
                     target_sha256="micro", feature_layers=(2,))
    build_shards(target, prompts, tmp_path / "data", plan, eos=None, pad=0, vocab=VOCAB, shards=2)
    argv = ["--target", str(tmp_path / "target"), "--data-dir", str(tmp_path / "data"), "--shards", "2",
            "--out", str(tmp_path / "ablation"), "--steps", "2", "--tokens-per-step", "64", "--vocab-subset", "48",
            "--repeats", "1", "--held-out-sequences", "3", "--arms", "base (v2 defaults)", "loss lk",
            "--dtype", "float32"]
    assert main([*argv[:3], str(tmp_path / "missing"), *argv[4:]]) == 2
    assert "lacks teacher-00000" in capsys.readouterr().err
    assert main(argv) == 0
    results = json.loads((tmp_path / "ablation" / "ablation.json").read_text())["arms"]
    assert [r["arm"] for r in results] == ["base (v2 defaults)", "loss lk"] and results[1]["training"]["loss"] == "lk"
    assert len(results[0]["held_out"]) == 8 and results[0]["accepted_length"]["2"] > 1
    assert "feature-draft recipe ablation" in capsys.readouterr().out
    finished = {p: p.stat().st_mtime_ns for p in (tmp_path / "ablation").glob("*/result.json")}
    assert len(finished) == 2 and main(argv) == 0  # a second run reads the results, trains nothing
    assert {p: p.stat().st_mtime_ns for p in finished} == finished
