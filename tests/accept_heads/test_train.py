"""accept_heads.train end to end on micro models: export round trip (no h: the evaluation chooses it), resume, feature
cache, SV profile."""

from __future__ import annotations

import itertools
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from accept_heads.evaluation.reliability import head_predictions
from accept_heads.train import head_architecture, load_head_weights, prepare_head_run, train
from accept_heads.training.metrics import prior_shift
from accept_heads.training.module import HeadModule
from accept_heads.training.profile_fit import equal_frequency_edges
from accept_heads.training.training_data import (
    SequenceDataset,
    collate_sequences,
    epoch_order,
    labelled_positions,
    loss_everywhere,
    mix_batch,
    request_rates,
)
from ahconf.schema import ConfigError, HeadTrainConfig
from data_gen.collect import collect
from data_gen.shards import load_split
from decode import SpeculativeDecoder, policies
from decode.artifacts.gguf import file_sha256
from decode.artifacts.hub import load_causal_lm, load_tokenizer
from decode.artifacts.serialization import load_head, load_profile, write_card
from decode.head import dspark_tensors
from decode.head_config import (
    DEPTH_FEATURE,
    PRE_FEATURES,
    PREVIOUS_TOKEN,
    REQUEST_FEATURE,
    ROUND_FEATURE,
    TOP_K_FEATURES,
)
from runtime.models import load_trio
from tests.helpers.config import DATA_OVERRIDES, TRAIN_OVERRIDES, model_overrides


@pytest.fixture(scope="module")
def trained(make_config, train_overrides, tmp_path_factory):
    """One trained + exported head (its own paths.root, sharing the collected data)."""
    root = tmp_path_factory.mktemp("trained")
    data_dir = Path(train_overrides[-1].split("=", 1)[1]) / "tiny" / "data"
    config = make_config(*train_overrides, f"paths.root={root}", f"paths.data_dir={data_dir}", "loss.w_rej=3")
    return config, train(config.train_job())


def test_export_loads_and_predicts_exactly_like_the_trained_module(trained, micro_trio):
    config, result = trained
    assert result.dev_metrics["val/binary_kl_constant"] > 0
    draft = load_causal_lm(str(micro_trio["draft"]), dtype="float32")
    head = load_head(result.head_path, draft=draft, tokenizer=load_tokenizer(str(micro_trio["draft"])))
    meta = head.metadata
    assert meta.rule == {"name": "speculative", "params": {}}
    assert head.threshold is None and not list(Path(result.head_path).parent.glob("*.json"))  # training chose no h
    assert meta.head_config.hidden_size == 32 and len(meta.training_data.manifest_sha256) == 64
    assert meta.dev_metrics["val/auroc"] == pytest.approx(result.dev_metrics["val/auroc"])

    run = prepare_head_run(config.train_job())  # a fresh module, weights from the best checkpoint
    load_head_weights(run.head, result.best_checkpoint)
    run.module.eval()
    batch = mix_batch(collate_sequences([SequenceDataset(run.datamodule.table("dev"))[i] for i in range(2)]),
                      config.head.mixing_r, config.seed, "dev", 0, every_position=loss_everywhere(config.head.timing))
    with torch.no_grad():
        logits, _ = run.module(batch)
        hidden, features = run.encoder(batch)
        exported = head(hidden, features)
    assert logits.numel() > 0
    # trained with w_rej = 3: the export adds the prior shift log 3, so it predicts acceptance probabilities
    assert "log(w_rej / w_acc) = 1.0986" in meta.probability
    torch.testing.assert_close(torch.sigmoid(exported), torch.sigmoid(logits + math.log(3)), atol=1e-6, rtol=0)


def test_a_post_head_trains_on_draft_token_positions_and_round_trips(make_config, train_overrides, micro_trio,
                                                                     tmp_path):
    data_dir = Path(train_overrides[-1].split("=", 1)[1]) / "tiny" / "data"
    config = make_config(*train_overrides, f"paths.root={tmp_path}", f"paths.data_dir={data_dir}",
                         "head.timing=post", "head.mixing_r=0.5", "trainer.max_epochs=1")
    result = train(config.train_job())
    draft = load_causal_lm(str(micro_trio["draft"]), dtype="float32")
    head = load_head(result.head_path, draft=draft, tokenizer=load_tokenizer(str(micro_trio["draft"])))
    assert head.config.timing == "post" and head.metadata.mixing_r == 0.5
    run = prepare_head_run(config.train_job())
    load_head_weights(run.head, result.best_checkpoint)
    batch = mix_batch(collate_sequences([SequenceDataset(run.datamodule.table("dev"))[i] for i in range(2)]),
                      0.5, config.seed, "dev", 0, every_position=loss_everywhere("post"))
    mask = batch["loss_mask"]
    assert 0 < mask.sum() < batch["is_response"].sum()  # only the draft-token positions ...
    assert torch.equal(batch["input_ids"][mask], batch["candidate"][mask])  # ... whose input is y_t
    with torch.no_grad():
        logits, _ = run.module.eval()(batch)
        exported = head(*run.encoder(batch))
    torch.testing.assert_close(torch.sigmoid(exported), torch.sigmoid(logits), atol=1e-6, rtol=0)


def test_a_mismatched_draft_or_tokenizer_is_refused(trained, micro_trio, tmp_path):
    _, result = trained
    other = load_causal_lm(str(micro_trio["companion"]), dtype="float32")  # hidden size 24, not 32
    with pytest.raises(ValueError, match="hidden size 32"):
        load_head(result.head_path, draft=other)
    tokenizer = load_tokenizer(str(micro_trio["draft"]))
    tokenizer.add_tokens(["<not-in-the-training-vocabulary>"])
    with pytest.raises(ValueError, match="tokenizer hash"):
        load_head(result.head_path, tokenizer=tokenizer)


def test_checkpoints_hold_only_the_head_and_load_with_weights_only(trained):
    _, result = trained
    checkpoint = torch.load(Path(result.checkpoint_dir) / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["state_dict"] and all(k.startswith("head.") for k in checkpoint["state_dict"])


def test_a_dspark_head_learns_the_expected_acceptance_from_the_previous_token_and_decodes(
        make_config, train_overrides, micro_trio, tmp_path):
    """head=dspark: a linear head on the draft's state ⊕ a Markov embedding of the token that produced q, trained on
    1 − TV(p, q); it exports, loads, predicts as the trained module, maps onto DSpark's tensor names and decodes."""
    data_dir = Path(train_overrides[-1].split("=", 1)[1]) / "tiny" / "data"
    config = make_config(*train_overrides, f"paths.root={tmp_path}", f"paths.data_dir={data_dir}", "head=dspark",
                         "head.markov_rank=8", "trainer.max_epochs=2")
    result = train(config.train_job())
    draft = load_causal_lm(str(micro_trio["draft"]), dtype="float32")
    head = load_head(result.head_path, draft=draft, tokenizer=load_tokenizer(str(micro_trio["draft"])))
    vocab = head.config.vocab_size
    assert head.config.features == (PREVIOUS_TOKEN,) and head.config.depth == 0 and len(head.blocks) == 0
    assert head.markov.weight.shape == (vocab, 8)
    tensors = dspark_tensors(head)
    assert tensors["confidence_head.proj.weight"].shape == (1, 32 + 8)
    assert tensors["markov_head.weight"].shape == (vocab, 8)

    run = prepare_head_run(config.train_job())
    dev = load_split(data_dir, "dev")
    assert vocab > int(np.concatenate([np.asarray(r) for r in dev["response_ids"]]).max())
    tv = np.concatenate([np.asarray(t, dtype=np.float32) for t in dev["tv"]])
    np.testing.assert_allclose(run.datamodule.table("dev").label, 1 - tv, atol=1e-6)  # the soft target
    load_head_weights(run.head, result.best_checkpoint)
    batch = mix_batch(collate_sequences([SequenceDataset(run.datamodule.table("dev"))[i] for i in range(2)]),
                      1.0, config.seed, "dev", 0, every_position=True)
    hidden, features = run.encoder(batch)
    rows, positions = batch["loss_mask"].nonzero(as_tuple=True)
    assert torch.equal(features[:, 0].long(), batch["input_ids"][rows, positions - 1])  # the token before t
    with torch.no_grad():
        logits, _ = run.module.eval()(batch)
        exported = head(hidden, features)
        swapped = head(hidden, torch.roll(features, 1, dims=0))
    shift = prior_shift(config.loss.w_acc, config.loss.w_rej)
    torch.testing.assert_close(exported, logits + shift, atol=1e-5, rtol=0)
    assert not torch.allclose(exported, swapped)  # the previous token moves the estimate

    target = load_causal_lm(str(micro_trio["target"]), dtype="float32")
    decoder = SpeculativeDecoder(target, draft, policy=policies.Head(head, threshold=0.5))
    prompt = torch.tensor([[1, 2, 3]])
    out = decoder.generate(prompt, max_new_tokens=12, seed=0)
    assert out.stats.generated == 12 and out.stats.rounds < 12 and len(out.stats.estimates) > 0

    # as make demo trains it: from a feature cache (the previous token stored with the hidden state);
    # on a copy of the shared data, whose folder other tests read without caches
    shutil.copytree(data_dir, tmp_path / "data")
    cached = make_config(*train_overrides, f"paths.root={tmp_path / 'cached'}", f"paths.data_dir={tmp_path / 'data'}",
                         "head=dspark", "head.markov_rank=8", "trainer.max_epochs=1", "trainer.feature_cache=true")
    outcome = train(cached.train_job())
    assert load_head(outcome.head_path, draft=draft).config == head.config


def test_a_run_stopped_mid_epoch_resumes_from_last_ckpt(make_config, train_overrides, tmp_path):
    data_dir = Path(train_overrides[-1].split("=", 1)[1]) / "tiny" / "data"
    common = [*train_overrides, f"paths.root={tmp_path}", f"paths.data_dir={data_dir}",
              "trainer.checkpoint_every_n_steps=1"]
    stopped = train(make_config(*common, "trainer.max_steps=3").train_job())  # 4 batches per epoch: stops mid-epoch
    assert stopped.global_step == 3
    last = Path(stopped.checkpoint_dir) / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 3
    resumed = train(make_config(*common, "ckpt_path=last").train_job())
    assert resumed.global_step == 8  # 4 batches x 2 epochs, as without the interruption
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == resumed.global_step


def test_feature_cache_matches_the_live_draft(make_config, train_overrides, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(Path(train_overrides[-1].split("=", 1)[1]) / "tiny" / "data", data_dir)
    config = make_config(*train_overrides, f"paths.root={tmp_path}", f"paths.data_dir={data_dir}",
                         "trainer.feature_cache=true", "trainer.max_epochs=1",
                         "loss.goodput_weight=1", "loss.goodput_k=3")
    result = train(config.train_job())  # with the goodput objective beside the BCE
    caches = list((data_dir / "feature_cache").glob("*/dev.safetensors"))
    assert len(caches) == 1 and result.dev_metrics["val/binary_kl"] > 0
    run = prepare_head_run(config.train_job())
    first = next(iter(run.datamodule.val_dataloader()))
    run.datamodule.cache_description = None  # the same datamodule, reading the data without the cache
    live = mix_batch(next(iter(run.datamodule.val_dataloader())), config.head.mixing_r, config.seed, "dev", 0,
                     every_position=loss_everywhere(config.head.timing))
    hidden, features = run.encoder(live)
    torch.testing.assert_close(first["hidden"], hidden)
    torch.testing.assert_close(first["features"], features)
    torch.testing.assert_close(first["label"], live["label"][live["loss_mask"]])
    # the goodput objective sees the same rounds in the cache's entries as in the live batch's positions
    module = HeadModule(run.head, run.encoder, config.loss, config.optim, constant=0.5)
    losses = []
    for batch in (first, live):
        logits, inputs = module(batch)
        losses.append(module.goodput(torch.sigmoid(logits), inputs.labels, inputs.rows, inputs.positions))
    assert losses[0] is not None and losses[0] < 0
    torch.testing.assert_close(losses[0], losses[1])


def test_the_head_records_its_data_by_sha256_and_a_run_relative_path_and_its_card_prints_no_path(trained):
    config, result = trained
    head_path = Path(result.head_path)
    data = load_head(head_path).metadata.training_data
    data_dir = Path(config.paths.data_dir)
    assert data.manifest_sha256 == file_sha256(data_dir / "manifest.json")
    assert not Path(data.data_dir).is_absolute()
    assert (Path(config.paths.run_dir) / data.data_dir).resolve() == data_dir.resolve()
    card = write_card(head_path.parent).read_text()
    assert data.manifest_sha256 in card
    assert str(data_dir) not in card and str(data_dir.resolve()) not in card and f"`{data.data_dir}`" not in card


def test_sv_profile_fits_exports_and_round_trips(make_config, train_overrides, tmp_path, monkeypatch):
    data_dir = Path(train_overrides[-1].split("=", 1)[1]) / "tiny" / "data"
    monkeypatch.chdir(data_dir.parent)  # a data_dir relative to the working directory is recorded relative to the run
    config = make_config(*train_overrides, f"paths.root={tmp_path}", "paths.data_dir=data", "head=sv_profile",
                         "head.x_bins=4", "head.y_bins=3", "head.min_bin_count=4", "head.k_max=3",
                         "head.latency_repeats=2", "head.latency_batches=[2,1]")
    result = train(config.train_job())
    profile = load_profile(result.profile_path)
    assert tuple(profile.table.shape) == tuple(result.bins) and profile.latency.numel() == 3
    # t_t(B, T) measured with it: B = 1, 2 rows x 1..k_max + 1 tokens, non-decreasing in both
    assert profile.batch_sizes.tolist() == [1, 2] and tuple(profile.batch_latency_table.shape) == (2, 4)
    assert (profile.batch_latency_table.diff(dim=1) >= 0).all() and (profile.batch_latency_table.diff(dim=0) >= 0).all()
    assert profile.metadata.latency_batches == (2, 1) and profile.metadata.bins == result.bins
    recorded = profile.metadata.training_data.data_dir
    assert not Path(recorded).is_absolute() and (Path(config.paths.run_dir) / recorded).resolve() == data_dir.resolve()
    assert profile.counts.sum() == profile.metadata.training_data.positions["train"]
    dev = result.information["dev"]
    assert dev.h_a > 0 and 0 <= dev.h_a_given_xy <= dev.h_a + 1e-9
    assert profile.metadata.information["dev"] == dev
    assert 1 <= profile.verification_length(torch.tensor([0.9, 0.9, 0.1]), torch.tensor([1.0, 1.0, 0.1])) <= 3


def test_sv_profile_for_the_greedy_rule_bins_the_greedy_indicators(make_config, train_overrides, tmp_path):
    data_dir = Path(train_overrides[-1].split("=", 1)[1]) / "tiny" / "data"
    config = make_config(*train_overrides, f"paths.root={tmp_path}", f"paths.data_dir={data_dir}", "head=sv_profile",
                         "head.rule=greedy", "head.x_bins=4", "head.y_bins=3", "head.min_bin_count=4", "head.k_max=2",
                         "head.latency_repeats=1")
    profile = load_profile(train(config.train_job()).profile_path)
    assert profile.metadata.rule == {"name": "greedy", "params": {}}
    table = load_split(data_dir, "train")

    def edges(column: str, bins: int) -> torch.Tensor:
        return equal_frequency_edges(np.concatenate([np.asarray(v, dtype=np.float32) for v in table[column]]),
                                     bins).float()

    torch.testing.assert_close(profile.x_edges, edges("sv_x_greedy", 4))
    torch.testing.assert_close(profile.y_edges, edges("sv_y_greedy", 3))
    assert not torch.equal(profile.y_edges, edges("sv_y_speculative", 3)), "the rules' Y must differ on this data"


def test_draft_features_are_the_lm_head_input_and_its_logits(make_config, train_overrides, micro_trio):
    """The head sees exactly what decode.loops.runner.ModelRunner captures: the LM head's input."""
    config = make_config(*train_overrides)
    run = prepare_head_run(config.train_job())
    batch = mix_batch(collate_sequences([SequenceDataset(run.datamodule.table("dev"))[0]]), 0.15, 0, "dev", 0)
    captured = {}
    hook = run.draft.get_output_embeddings().register_forward_hook(lambda m, a, o: captured.update(x=a[0][0], y=o[0]))
    with torch.no_grad():
        run.draft(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    hook.remove()
    hidden, features = run.encoder(batch)
    positions = batch["loss_mask"][0].nonzero().squeeze(-1) - 1  # pre: the state that produced q_t
    torch.testing.assert_close(hidden, captured["x"][positions])
    q = captured["y"][positions].float().softmax(-1)
    y = batch["input_ids"][0, positions + 1]
    torch.testing.assert_close(features[:, 0], q.gather(-1, y[:, None]).squeeze(-1).log())
    torch.testing.assert_close(features[:, 2], q.max(-1).values)


def test_a_feature_drafts_head_reads_every_depth_of_a_round(make_config, micro_trio, micro_feature_draft, tmp_path):
    overrides = [*model_overrides(micro_trio), f"models.draft.id={micro_feature_draft}", *DATA_OVERRIDES,
                 "collect.depths=3", *TRAIN_OVERRIDES, f"paths.root={tmp_path}", "head.mixing_r=1",
                 "trainer.feature_cache=true", "trainer.max_epochs=1"]
    config = make_config(*overrides)
    collect(config.collect_job())
    result = train(config.train_job())
    draft = load_causal_lm(str(micro_feature_draft), dtype="float32")
    head = load_head(result.head_path, draft=draft, tokenizer=load_tokenizer(str(micro_feature_draft)))
    assert head.config.features == (*PRE_FEATURES, DEPTH_FEATURE) and head.config.depths == 3

    run = prepare_head_run(config.train_job())
    cached = next(iter(run.datamodule.val_dataloader()))
    run.datamodule.cache_description = None  # the same rows, through the live target and draft
    live = mix_batch(next(iter(run.datamodule.val_dataloader())), 1.0, config.seed, "dev", 0, every_position=True)
    hidden, features = run.encoder(live)
    assert hidden.shape[1] == 3 and features[..., -1].unique().tolist() == [1.0, 2.0, 3.0]
    torch.testing.assert_close(cached["hidden"], hidden)
    torch.testing.assert_close(cached["features"], features)
    _, _, labels, _ = labelled_positions(hidden, features, live["label"][live["loss_mask"]],
                                         live["outcome"][live["loss_mask"]])
    unreached = int(live["label"][live["loss_mask"]].isnan().sum())
    assert unreached > 0 and labels.numel() == hidden.shape[0] * 3 - unreached  # rounds never start in the prompt
    frame = head_predictions(head, load_trio(config.models, with_companion=False), config.paths.data_dir, 2, 1.0,
                             config.seed)
    assert len(frame) > 0 and not frame["label"].isna().any()

    # a DSpark head's previous token at depth d: the target's token before t at d = 1, the round's own candidate at
    # t − 1 (its (d−1)-th) deeper
    dspark = prepare_head_run(make_config(*overrides, "head=dspark", "head.markov_rank=4").train_job())
    assert dspark.head.config.features == (DEPTH_FEATURE, PREVIOUS_TOKEN)
    _, features = dspark.encoder(live)
    rows, positions = live["loss_mask"].nonzero(as_tuple=True)
    previous = features[..., 1].long()
    assert torch.equal(previous[:, 0], live["input_ids"][rows, positions - 1])
    assert torch.equal(previous[:, 1:], live["candidate"][rows, positions - 1][:, :-1])

    # the request so far, read at each round's start t − d + 1 for all of its depths (as the decoder holds it)
    request = prepare_head_run(make_config(*overrides, "head.request_feature=true").train_job())
    assert request.head.config.features == (*PRE_FEATURES, DEPTH_FEATURE, REQUEST_FEATURE)
    _, features = request.encoder(live)
    for depth in range(3):
        assert torch.equal(features[:, depth, -1], live["request"][rows, positions - depth])
    reached = ~live["label"][rows, positions].isnan()  # rounds that start in the response
    assert (features[..., -1][reached] > 0).all() and (features[..., -1][reached] < 1).all()

    # the draft's next-largest probabilities and the round so far: its earlier candidates' summed log q
    reads = prepare_head_run(make_config(*overrides, "head.top_k_features=true", "head.round_feature=true").train_job())
    assert reads.head.config.features == (*PRE_FEATURES, DEPTH_FEATURE, *TOP_K_FEATURES, ROUND_FEATURE)
    hidden, features = reads.encoder(live)
    assert (features[..., 2] >= features[..., 4]).all() and (features[..., 4] >= features[..., 5]).all()
    log_q = features[..., 0]
    at = {(r, p): m for m, (r, p) in enumerate(zip(rows.tolist(), positions.tolist()))}
    row, start = 0, int(positions[rows == 0][0]) + 2  # a round that starts two tokens into row 0's response
    for depth in range(3):
        earlier = sum(float(log_q[at[row, start + j], j]) for j in range(depth))
        assert float(features[at[row, start + depth], depth, -1]) == pytest.approx(earlier, abs=1e-5)
    # causal: the verdicts of this round and of later ones, and the candidates it has not drawn yet, change nothing
    for depth in range(3):
        changed = {key: value.clone() for key, value in live.items()}
        changed["outcome"][row, start:] = 1 - changed["outcome"][row, start:]
        changed["label"][row, start:] = changed["label"][row, start:].flip(0)
        for j in range(3):  # the round's deeper candidates, then those of every later round (start + 1 on)
            later = changed["candidate"][row, start + max(j, depth + 1) :, j] if j > depth else \
                changed["candidate"][row, start + j + 1 :, j]
            later.copy_((later + 1) % 7)
        hidden_changed, features_changed = reads.encoder(changed)
        m = at[row, start + depth]
        assert torch.equal(features_changed[m, depth], features[m, depth])
        assert torch.equal(hidden_changed[m, depth], hidden[m, depth])
        assert not torch.equal(changed["candidate"], live["candidate"])
    # the request so far, from the same flips: its rate at the round's start reads only earlier rounds
    first = live["outcome"][row, :, 0].numpy()
    flipped = first.copy()
    flipped[start:] = 1 - flipped[start:]
    offsets = np.array([0, len(first)])
    assert request_rates(flipped, offsets)[: start + 1].tolist() == request_rates(first, offsets)[: start + 1].tolist()
    with pytest.raises(ConfigError, match="round_feature"):  # a plain draft's data has no rounds to read
        head_architecture(HeadTrainConfig(round_feature=True), hidden_size=8, depths=1)

    with pytest.raises(ConfigError, match="mixing_r=1"):
        prepare_head_run(make_config(*overrides, "head.mixing_r=0.15").train_job())


def test_each_epochs_order_is_the_one_a_seeded_shuffling_loader_gives_an_uninterrupted_run():
    """Resuming is exact because an epoch's order is a function of (seed, epoch); it is the order the shuffling
    loader heads trained with before gave each epoch as Lightning reads it (the loader's length in batches), so a head
    trained uninterrupted is the same as before: with a short last batch, a full one, and worker processes."""
    for size, batch, workers in ((11, 3, 0), (12, 3, 0), (12, 3, 1)):
        loader = torch.utils.data.DataLoader(list(range(size)), batch_size=batch, shuffle=True, num_workers=workers,
                                             generator=torch.Generator().manual_seed(7))
        for epoch in range(3):
            served = [int(x) for b in itertools.islice(loader, len(loader)) for x in b]
            assert served == epoch_order(size, 7, epoch, batch, workers), (size, batch, workers, epoch)
    # negative control: a loader whose iterator runs out draws one permutation more than one that stops at its length
    assert epoch_order(12, 7, 1, 3, workers=1) != epoch_order(12, 7, 1, 3, workers=0)
