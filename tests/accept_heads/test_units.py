"""Unit checks: weighted BCE, token mixing, head blocks, information gain, profile back-off, loggers."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch

from accept_heads.measure.information import information_gain
from accept_heads.measure.selection import best_value
from accept_heads.train import head_architecture
from accept_heads.training.loggers import make_logger
from accept_heads.training.metrics import AcceptanceMetrics, binary_kl, prior_shift, weighted_bce
from accept_heads.training.profile_fit import BinnedAcceptance, backed_off_table, equal_frequency_edges
from accept_heads.training.training_data import (
    SequenceItem,
    collate_sequences,
    load_positions,
    loss_everywhere,
    mix_batch,
    mixing_mask,
    request_rates,
)
from ahconf.schema import ConfigError, LoggerConfig
from data_gen.collect import features_for
from data_gen.schedule import warmup_cosine
from data_gen.shards import write_shard
from decode import rules
from decode.head import AcceptanceHead


def test_weighted_bce_matches_a_hand_computation():
    logits = torch.tensor([0.0, 2.0, -1.0])
    labels = torch.tensor([1.0, 0.25, 0.0])
    w_acc, w_rej = 1.0, 6.0
    s = [0.5, 1 / (1 + math.exp(-2)), 1 / (1 + math.exp(1))]
    a = [1.0, 0.25, 0.0]
    num = -sum(w_acc * ai * math.log(si) + w_rej * (1 - ai) * math.log(1 - si) for ai, si in zip(a, s))
    den = sum(w_acc * ai + w_rej * (1 - ai) for ai in a)
    assert float(weighted_bce(logits, labels, w_acc, w_rej)) == pytest.approx(num / den, rel=1e-6)
    kl = binary_kl(labels, logits)
    by_hand = 0.25 * math.log(0.25 / s[1]) + 0.75 * math.log(0.75 / (1 - s[1]))
    assert float(kl[1]) == pytest.approx(by_hand, rel=1e-5)
    assert float(kl[0]) == pytest.approx(-math.log(0.5), rel=1e-6)


@pytest.mark.parametrize("label", [0.3, 0.7])
def test_the_prior_shift_turns_the_weighted_loss_minimiser_into_the_acceptance_probability(label):
    """One logit fitted by weighted BCE (w_rej = 6) to a soft label: shifted, it is the label; raw it is not."""
    logit = torch.zeros((), requires_grad=True)
    optimiser = torch.optim.LBFGS([logit], lr=1.0, max_iter=200, tolerance_grad=1e-12, tolerance_change=1e-14)
    labels = torch.full((8,), label)

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = weighted_bce(logit.expand(8), labels, 1.0, 6.0)
        loss.backward()
        return loss

    optimiser.step(closure)
    raw = float(torch.sigmoid(logit.detach()))
    assert raw == pytest.approx(label / (label + 6 * (1 - label)), abs=1e-4)  # the weighted loss's minimiser
    assert abs(raw - label) > 0.2  # negative control: unshifted, the head under-predicts acceptance
    assert float(torch.sigmoid(logit.detach() + prior_shift(1.0, 6.0))) == pytest.approx(label, abs=1e-4)
    metrics = AcceptanceMetrics("val/", 1.0, 6.0)
    metrics.update(logit.detach().expand(8), labels, (labels > 0.5).float())
    assert float(metrics.compute()["val/mean_pred"]) == pytest.approx(label, abs=1e-4)  # metrics score the shifted


def test_selection_takes_the_fastest_value_and_the_smaller_one_on_a_tie():
    assert best_value([0.9, 0.5, 0.7], [2.0, 3.0, 1.0]) == 0.5
    assert best_value([7.0, 3.0, 5.0], [4.0, 4.0, 1.0]) == 3.0  # tie between K = 7 and K = 3
    with pytest.raises(ValueError, match="one throughput per value"):
        best_value([1.0, 2.0], [1.0])


def test_metrics_of_a_perfect_and_a_constant_predictor():
    labels = torch.tensor([0.0, 1.0, 0.0, 1.0])
    metrics = AcceptanceMetrics("val/", 1.0, 1.0, constant=0.5)
    metrics.update(torch.tensor([-30.0, 30.0, -30.0, 30.0]), labels, labels)
    values = metrics.compute()
    assert float(values["val/auroc"]) == pytest.approx(1.0)
    assert float(values["val/binary_kl"]) < 1e-6 and float(values["val/ece"]) < 1e-6
    assert float(values["val/binary_kl_constant"]) == pytest.approx(math.log(2), rel=1e-5)


def test_auroc_with_one_outcome_class_is_undefined_not_zero():
    metrics = AcceptanceMetrics("val/", 1.0, 1.0)
    metrics.update(torch.tensor([-1.0, 0.5, 2.0]), torch.ones(3), torch.ones(3))  # every draft accepted
    assert math.isnan(float(metrics.compute()["val/auroc"]))
    metrics.update(torch.tensor([-3.0]), torch.zeros(1), torch.zeros(1))  # one rejection: defined again
    assert float(metrics.compute()["val/auroc"]) == pytest.approx(1.0)


def test_token_mixing_is_seeded_and_keeps_about_r_target_tokens():
    r = 0.15
    first = mixing_mask(20000, r, seed=3, split="train", epoch=0, row=7)
    assert np.array_equal(first, mixing_mask(20000, r, seed=3, split="train", epoch=0, row=7))
    assert not np.array_equal(first, mixing_mask(20000, r, seed=3, split="train", epoch=1, row=7))
    assert not np.array_equal(first, mixing_mask(20000, r, seed=3, split="train", epoch=0, row=8))
    assert first.mean() == pytest.approx(1 - r, abs=0.01)


def test_mix_batch_puts_candidates_exactly_at_loss_positions():
    items = [
        SequenceItem(row=row, prompt=np.array([1, 2, 3][: row + 1]), response=np.arange(100, 100 + n),
                 candidate=np.arange(200, 200 + n), label=np.full(n, 0.5, dtype=np.float32),
                 outcome=np.ones(n, dtype=np.float32), companion=None, request=np.full(n, 0.5, dtype=np.float32))
        for row, n in ((0, 50), (1, 30))
    ]
    batch = mix_batch(collate_sequences(items), r=0.3, seed=0, split="dev", epoch=0)
    mask, ids = batch["loss_mask"], batch["input_ids"]
    assert not (mask & ~batch["is_response"]).any()
    assert (ids[mask] >= 200).all() and (ids[batch["is_response"] & ~mask] < 200).all()
    again = mix_batch(collate_sequences(items), r=0.3, seed=0, split="dev", epoch=0)
    assert torch.equal(again["input_ids"], ids)
    assert mask.sum() == sum(mixing_mask(n, 0.3, 0, "dev", 0, row).sum() for row, n in ((0, 50), (1, 30)))
    pre = mix_batch(collate_sequences(items), r=0.3, seed=0, split="dev", epoch=0, every_position=True)
    assert torch.equal(pre["input_ids"], ids)  # the same mixed prefix ...
    assert torch.equal(pre["loss_mask"], batch["is_response"])  # ... with the loss at every response position
    assert loss_everywhere("pre") and not loss_everywhere("post")


def test_positions_read_the_companion_columns_of_their_rule(tmp_path):
    columns = {"label_speculative": [0.5, 1.0], "draft_token": [7, 8], "label_greedy": [1.0, 0.0],
               "draft_argmax": [7, 9], "sv_x_speculative": [0.1, 0.2], "sv_y_speculative": [0.3, 0.4]}
    rows = [{"prompt_id": "a", "prompt_ids": [1, 2], "response_ids": [3, 4], "finished": False, **columns}]
    write_shard(tmp_path, "dev", 0, rows, features_for(list(columns)))
    table = load_positions(tmp_path, "dev", rules.Speculative(), seed=0, with_companion=True)
    np.testing.assert_allclose(table.companion, [[0.1, 0.3], [0.2, 0.4]], rtol=1e-6)
    with pytest.raises(ConfigError, match=r"sv_x_greedy / sv_y_greedy .*'greedy' in rules.names"):
        load_positions(tmp_path, "dev", rules.Greedy(), seed=0, with_companion=True)
    assert load_positions(tmp_path, "dev", rules.Greedy(), seed=0, with_companion=False).companion is None


def test_head_blocks_have_independent_parameters(make_config):
    config = make_config("head.depth=3")
    head = AcceptanceHead(head_architecture(config.head, hidden_size=16))
    weights = [block.weight for block in head.blocks]
    assert len(weights) == 3
    assert len({w.data_ptr() for w in weights}) == 3
    assert not torch.equal(weights[0], weights[1]) and not torch.equal(weights[1], weights[2])


def test_warmup_then_cosine_schedule():
    assert warmup_cosine(0, 4, 20, 0.0) == pytest.approx(0.25)
    assert warmup_cosine(4, 4, 20, 0.0) == pytest.approx(1.0)
    assert warmup_cosine(20, 4, 20, 0.1) == pytest.approx(0.1)


def _joint(x: torch.Tensor, a: torch.Tensor, bins: int = 10) -> torch.Tensor:
    metric = BinnedAcceptance(torch.linspace(0, 1, bins + 1, dtype=torch.float64), torch.tensor([0.0, 1.0]), bins)
    metric.update(x, torch.zeros_like(x), a)
    return metric.compute()["joint"]


def test_information_gain_is_h_a_when_x_determines_a_and_zero_when_independent():
    generator = torch.Generator().manual_seed(0)
    centres = (torch.randint(0, 10, (50000,), generator=generator).double() + 0.5) / 10
    determined = information_gain(_joint(centres, centres))
    assert determined.h_a == pytest.approx(math.log2(10), abs=0.01)
    assert determined.gain_plugin == pytest.approx(determined.h_a, abs=1e-9)
    assert determined.gain == pytest.approx(determined.h_a, abs=0.005)  # less the null's ~0.001 bits
    assert determined.gain_fraction == pytest.approx(1.0, abs=0.002)
    independent = information_gain(_joint(centres, torch.rand(50000, generator=generator, dtype=torch.float64)))
    assert independent.gain == pytest.approx(0.0, abs=0.01)


def test_equal_frequency_edges_merge_point_masses():
    values = np.concatenate([np.linspace(0, 0.9, 500), np.ones(500)])
    edges = equal_frequency_edges(values, 10)
    assert edges[0] == 0 and edges[-1] == 1
    assert len(edges) - 1 < 10  # the repeated quantile 1.0 collapses into one bin
    assert torch.all(edges[1:] >= edges[:-1])


def test_sparse_bins_back_off_to_their_row_mean():
    sums = torch.tensor([[9.0, 0.5], [0.0, 0.0]], dtype=torch.float64)
    counts = torch.tensor([[10.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    table = backed_off_table(sums, counts, min_count=5)
    assert table[0, 0] == pytest.approx(0.9)
    assert table[0, 1] == pytest.approx(9.5 / 11)
    assert table[1, 0] == pytest.approx(9.5 / 11)  # empty row: the global mean


@pytest.mark.skipif(any(importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")),
                    reason="tensorboard is installed")
def test_tensorboard_without_the_package_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        make_logger(LoggerConfig(kind="tensorboard"), tmp_path, "x")


def test_wandb_logger_runs_offline_by_default_and_keeps_its_metrics_locally(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="wandb is a project dependency; some GPU images lack it")
    monkeypatch.delenv("WANDB_MODE")  # the configured default (offline), not the tests' "disabled"
    logger = make_logger(LoggerConfig(kind="wandb"), tmp_path, "unit")
    logger.log_metrics({"val/binary_kl": 0.1}, step=0)
    logger.experiment.finish()
    wandb.teardown()  # finish() may return before wandb's service process has flushed the run file
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and b"val/binary_kl" in runs[0].read_bytes()


def test_pre_head_features_read_q_over_the_shared_vocabulary_as_the_decoder_does():
    """A draft whose output layer is padded past the shared vocabulary (as Qwen2.5 checkpoints are): training reads
    ``log q``, entropy and top probability from the sliced logits, as :class:`decode.loops.runner.ModelRunner`
    gives them at decode time, not from the full output layer (the padding rows here carry most of the mass)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from accept_heads.training.features import DraftFeatures
    from decode.head import PRE_FEATURES, HeadConfig, head_features
    from decode.sampling import Sampling

    shared, padded = 40, 64
    torch.manual_seed(0)
    draft = LlamaForCausalLM(LlamaConfig(vocab_size=padded, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    with torch.no_grad():
        draft.get_output_embeddings().weight[shared:] *= 40  # padding rows with large logits
    ids = torch.randint(0, shared, (2, 9))
    loss_mask = torch.zeros(2, 9, dtype=torch.bool)
    loss_mask[:, 3:] = True
    sampling = Sampling(temperature=0.8)
    encoder = DraftFeatures(draft, HeadConfig(16, timing="pre", features=PRE_FEATURES), sampling, shared)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask, "candidate": ids}
    _, features = encoder(batch)
    with torch.no_grad():
        logits = draft(input_ids=ids).logits.float()
    rows, positions = loss_mask.nonzero(as_tuple=True)
    at_decode = logits[rows, positions - 1, :shared]  # what ModelRunner.feed returns: sliced to the shared vocabulary
    expected = head_features(sampling.feature_probs(at_decode), ids[rows, positions], PRE_FEATURES)
    torch.testing.assert_close(features, expected, atol=1e-5, rtol=1e-5)
    full = head_features(sampling.feature_probs(logits[rows, positions - 1]), ids[rows, positions], PRE_FEATURES)
    assert not torch.allclose(full, expected, atol=1e-2), "negative control: the padding rows must change the features"


def _profile_joint(n: int, dependence: float, seed: int) -> torch.Tensor:
    """Counts ``[200 cells, 10 A-bins]`` (the SV profile's default 20 × 10 bins): A = (1 − d)·U + d·cell position."""
    generator = torch.Generator().manual_seed(seed)
    cell = torch.randint(0, 200, (n,), generator=generator)
    a = (1 - dependence) * torch.rand(n, generator=generator, dtype=torch.float64) + dependence * cell.double() / 200
    joint = torch.zeros(200, 10, dtype=torch.float64)
    joint.index_put_((cell, (a * 10).long().clamp(max=9)), torch.ones(n, dtype=torch.float64), accumulate=True)
    return joint


def test_information_gain_is_corrected_for_the_plug_in_bias():
    """With A independent of (X, Y), 2,000 positions in 200 cells give a plug-in gain of ~20 % of H(A); the
    shuffle-corrected gain is within 3 sd of its null spread (~0.65 % of H(A)) of zero. With dependence it keeps
    most of the true gain (19.6 % of H(A), from 200,000 positions) at the demo's dev size."""
    independent = information_gain(_profile_joint(2000, 0.0, seed=1))
    assert independent.gain_plugin / independent.h_a > 0.15  # the bias being corrected
    assert abs(independent.gain_fraction) < 0.02
    assert independent.h_a_given_xy == pytest.approx(independent.h_a - independent.gain)
    large = information_gain(_profile_joint(200_000, 0.5, seed=2))
    truth = large.gain_plugin / large.h_a
    dependent = information_gain(_profile_joint(10_600, 0.5, seed=3))
    assert truth == pytest.approx(0.196, abs=0.01)
    assert 0.8 * truth < dependent.gain_fraction < dependent.gain_plugin / dependent.h_a


def test_the_request_rate_counts_only_earlier_positions_of_the_same_row():
    """Causal: a position's rate reads the accepted depth-1 outcomes before it in its row, never its own or a later
    one's, nor another row's; (a + 1) / (t + 2) as the decoder counts its rounds."""
    outcomes = np.array([1, 1, 0, 1, 0, 0, 1], dtype=np.float32)
    offsets = np.array([0, 4, 7])
    rates = request_rates(outcomes, offsets)
    assert rates.tolist() == pytest.approx([1 / 2, 2 / 3, 3 / 4, 3 / 5, 1 / 2, 1 / 3, 1 / 4])
    flipped = outcomes.copy()
    flipped[2:4] = 1 - flipped[2:4]  # the first row's last two verdicts: nothing at or before position 2 moves
    assert request_rates(flipped, offsets)[:3].tolist() == rates[:3].tolist()
    assert request_rates(flipped, offsets)[4:].tolist() == rates[4:].tolist()
