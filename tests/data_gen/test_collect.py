"""data_gen.collect on micro models: labels vs brute force, decode-time SV indicators, vocabulary alignment,
kept target logits, resume, torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import Qwen2Config, Qwen2ForCausalLM

from accept_heads import train as head_training
from ahconf.entry import CONF_DIR, to_config
from ahconf.schema import ConfigError, RulesConfig
from data_gen import labels
from data_gen.collect import collect
from data_gen.generation import generate_responses, teacher_forced_logits
from data_gen.manifest import CollectionManifest, read_manifest
from data_gen.shards import MANIFEST_FILE, CollectionDirError, load_split
from decode import rules
from decode.artifacts.hub import load_causal_lm, load_tokenizer
from decode.artifacts.serialization import load_head
from decode.divergence import DIVERGENCES, divergences
from decode.loops.runner import ModelRunner, vocab_size
from decode.profile import companion_indicators
from decode.sampling import Sampling
from decode.threads import torch_threads
from tests.helpers.config import DATA_OVERRIDES, TRAIN_OVERRIDES, compose_config, model_overrides
from tests.helpers.micro_models import incremental_round_logits

LAMBDA, MU = 0.3, 0.2


def _overrides(micro_trio: dict[str, Path], root: Path, *extra: str) -> list[str]:
    return [
        f"models.target.id={micro_trio['target']}",
        f"models.draft.id={micro_trio['draft']}",
        f"models.companion.id={micro_trio['companion']}",
        f"paths.root={root}",
        "prompts.sizes={train: 10, dev: 4}",
        "prompts.max_prompt_tokens=120",
        "prompts.truncation=left",
        "collect.max_new_tokens=12",
        "collect.batch_size=4",
        "collect.shard_size=4",
        f"rules.params.ensemble.weight={LAMBDA}",
        f"rules.params.ensemble.mu={MU}",
        *extra,
    ]


def _config(micro_trio, root, *extra):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_config(compose(config_name="config", overrides=_overrides(micro_trio, root, *extra)))


def _prompt_ids(data_dir: Path, split: str) -> list[str]:
    return list(load_split(data_dir, split)["prompt_id"])


@pytest.fixture(scope="module")
def collected(micro_trio, tmp_path_factory):
    root = tmp_path_factory.mktemp("collect")
    config = _config(micro_trio, root, "sampling.temperature=0.8", "sampling.top_k=100")
    manifest = collect(config.collect_job())
    return config, manifest, Path(config.paths.data_dir)


def _brute_force_logits(model, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    return logits[len(prompt_ids) - 1 : len(prompt_ids) + len(response_ids) - 1]


def test_every_label_column_equals_a_brute_force_recomputation(collected, micro_trio):
    _, _, data_dir = collected
    sampling = Sampling(temperature=0.8, top_k=100)
    models = {role: load_causal_lm(str(path), dtype="float32") for role, path in micro_trio.items()}
    table = load_split(data_dir, "train")
    assert len({len(r) for r in table["prompt_ids"]}) > 1, "batches must mix prompt lengths (left padding)"
    checked = 0
    for row in table:
        logits = {role: _brute_force_logits(m, row["prompt_ids"], row["response_ids"]) for role, m in models.items()}
        p, q = (sampling.probs(logits[r]) for r in ("target", "draft"))
        y = torch.tensor(row["draft_token"])
        py, qy = (d.gather(-1, y[:, None]).squeeze(-1) for d in (p, q))
        r_weighted = LAMBDA * q + (1 - LAMBDA) * p
        r_contrastive = sampling.probs(logits["target"] - MU * logits["draft"])
        m = 0.5 * (p + q)
        kl = lambda a, b: (a * (a / b).log()).nan_to_num(0.0).sum(-1)  # 0 log 0 = 0
        expected = {
            "draft_prob": qy,
            "target_prob": py,
            "label_speculative": (py / qy).clamp(max=1),
            "label_greedy": (logits["target"].argmax(-1) == logits["draft"].argmax(-1)).float(),
            "label_ensemble_weighted": (r_weighted.gather(-1, y[:, None]).squeeze(-1) / qy).clamp(max=1),
            "label_ensemble_contrastive": (r_contrastive.gather(-1, y[:, None]).squeeze(-1) / qy).clamp(max=1),
            "tv": 0.5 * (p - q).abs().sum(-1),
            "js": 0.5 * kl(p, m) + 0.5 * kl(q, m),
        }
        for column, values in expected.items():
            torch.testing.assert_close(torch.tensor(row[column]), values.float(), atol=1e-5, rtol=1e-5,
                                       msg=f"column {column}")
        assert torch.equal(torch.tensor(row["target_argmax"]), logits["target"].argmax(-1))
        assert bool((qy > 0).all()), "draft candidates are samples of the transformed q"
        checked += 1
    assert checked == len(table) >= 8


TRANSFORMS = [Sampling(), Sampling(temperature=0.7, top_k=20), Sampling(temperature=1.3, top_p=0.8),
              Sampling(temperature=0.0)]
EVERY_RULE = [rules.Speculative(), rules.Greedy(), rules.Ensemble("weighted", weight=LAMBDA),
              rules.Ensemble("contrastive", mu=MU)]


def _logits(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("sampling", TRANSFORMS, ids=str)
def test_shared_pass_columns_equal_each_definition_computed_alone(sampling):
    """One softmax per model and transform, shared by every column, changes no value: each column equals
    its own definition computed from the logits alone (``rule.label``, the divergences, ``companion_indicators``)."""
    p_logits, q_logits, c_logits = (_logits(40, 64, seed=seed) for seed in (1, 2, 3))
    y = rules.Speculative().propose(q_logits, sampling, torch.Generator().manual_seed(4))
    response = rules.Speculative().propose(p_logits, sampling, torch.Generator().manual_seed(5))
    label_columns = {rule.label_column: rule for rule in EVERY_RULE}
    columns = labels.position_columns(p_logits, q_logits, c_logits, y, response, sampling=sampling,
                                      label_columns=label_columns, companion_rules=EVERY_RULE)
    for column, rule in label_columns.items():
        assert torch.equal(columns[column], rule.label(p_logits, q_logits, y, sampling)), column
    p, q, features = sampling.probs(p_logits), sampling.probs(q_logits), sampling.feature_probs(q_logits)
    for name, fn in DIVERGENCES.items():
        assert torch.equal(columns[name], fn(p, q)), name
    assert torch.equal(columns["draft_entropy"], -torch.xlogy(features, features).sum(-1))
    assert torch.equal(columns["draft_top_prob"], features.max(-1).values)
    assert torch.equal(columns["draft_prob"], q.gather(-1, y[:, None]).squeeze(-1))
    target_features = sampling.feature_probs(p_logits)
    assert torch.equal(columns["response_logprob"], target_features.gather(-1, response[:, None]).squeeze(-1).log())
    assert torch.equal(columns["target_entropy"], -torch.xlogy(target_features, target_features).sum(-1))
    for rule in EVERY_RULE:
        transform = rule.transform(sampling)
        candidates = labels.rule_candidates(rule, q_logits.argmax(-1), y, sampling)
        seen = companion_indicators(transform, q_logits, c_logits, candidates)
        for field, column in labels.companion_columns(rule).items():
            assert torch.equal(columns[column], getattr(seen, field)), column
    if not sampling.greedy:
        assert 0 < float(columns["label_speculative"].mean()) < 1  # soft labels: the ratio path ran
        assert not torch.equal(columns["label_ensemble_weighted"], columns["label_ensemble_contrastive"])


@pytest.mark.parametrize("sampling", TRANSFORMS[:2], ids=str)
def test_batch_columns_in_chunks_equal_one_pass_over_the_valid_positions(sampling, monkeypatch):
    rows, steps, vocab = 3, 11, 64
    p_logits, q_logits, c_logits = (_logits(rows, steps, vocab, seed=seed) for seed in (5, 6, 7))
    valid = torch.ones(rows, steps, dtype=torch.bool)
    valid[0, 4:] = valid[2, 9:] = False  # responses that stopped early: padding between valid positions
    y = rules.Speculative().propose(q_logits[valid], sampling, torch.Generator().manual_seed(8))
    response = rules.Speculative().propose(p_logits[valid], sampling, torch.Generator().manual_seed(9))
    options = {"sampling": sampling, "label_columns": labels.label_rules(RulesConfig()), "companion_rules": EVERY_RULE}
    whole = labels.position_columns(p_logits[valid], q_logits[valid], c_logits[valid], y, response, **options)
    monkeypatch.setattr(labels, "CPU_CHUNK_ELEMENTS", 1)  # 16 positions per chunk: 2 chunks, the last one partial
    assert labels.chunk_positions(torch.device("cpu"), vocab) == 16 < int(valid.sum())
    chunked = labels.batch_columns(p_logits, q_logits, c_logits, y, response, valid, **options)
    assert list(chunked) == list(whole)
    for name, values in whole.items():
        assert torch.equal(chunked[name], values), name


@pytest.mark.parametrize("sampling", TRANSFORMS[:2], ids=str)
def test_draft_candidates_on_threads_are_each_rows_own_draws(sampling):
    """Rows drawn on two threads: each row's candidates are what its own generator gives it alone."""
    q_logits, lengths = _logits(5, 12, 64, seed=11), [12, 3, 7, 12, 1]
    alone = [rules.Speculative().propose(q_logits[row, :n], sampling, torch.Generator().manual_seed(row))
             for row, n in enumerate(lengths)]
    with torch_threads(2):
        generators = [torch.Generator().manual_seed(row) for row in range(5)]
        drawn = labels.draft_candidates(q_logits, lengths, sampling, generators)
        assert torch.get_num_threads() == 2
    assert torch.equal(drawn, torch.cat(alone))
    assert len(set(drawn.tolist())) > 5  # samples, not one repeated token


def test_divergences_together_equal_each_alone_and_the_xlogy_forms():
    p = Sampling(top_k=5).probs(_logits(30, 4096, seed=9))  # zeros in p where q > 0: 0 log 0 = 0, kl finite
    q = Sampling(temperature=0.5).probs(_logits(30, 4096, seed=10))
    together = divergences(p, q)
    assert list(together) == list(DIVERGENCES)
    for name, fn in DIVERGENCES.items():
        assert torch.equal(together[name], fn(p, q)), name
    assert bool(torch.isfinite(together["kl"]).all()) and float(together["js"].min()) >= 0
    xlogy_kl = lambda a, b: (torch.xlogy(a, a) - torch.xlogy(a, b)).sum(-1)  # the former definitions
    m = 0.5 * (p + q)
    torch.testing.assert_close(together["kl"], xlogy_kl(p, q), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(together["js"], 0.5 * xlogy_kl(p, m) + 0.5 * xlogy_kl(q, m), rtol=1e-6, atol=1e-6)
    assert torch.isinf(divergences(q, p)["kl"]).all()  # q > 0 = p somewhere in every row


def _runner_logits(model, vocab: int, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    """Logits predicting each response token, from decode's own ModelRunner (sliced to ``vocab``)."""
    tokens = torch.tensor([prompt_ids + response_ids])
    with torch.inference_mode():
        return ModelRunner(model, vocab).feed(tokens, len(prompt_ids) + len(response_ids) - 1, keep=len(response_ids))


def test_stored_companion_indicators_are_what_each_rule_sees_at_decode_time(collected, micro_trio):
    config, manifest, data_dir = collected
    sampling = Sampling(**asdict(config.sampling))
    draft, companion = (load_causal_lm(str(micro_trio[r]), dtype="float32") for r in ("draft", "companion"))
    vocab = min(vocab_size(m) for m in (draft, companion))
    table = load_split(data_dir, "train")
    assert set(manifest.companion_indicators) == set(config.rules.names) == {"speculative", "greedy", "fuzzy",
                                                                                 "ensemble"}
    assert not {"sv_x", "sv_y"} & set(table.column_names)
    greedy_candidate_differs = 0
    for row in table:
        q_logits = _runner_logits(draft, vocab, row["prompt_ids"], row["response_ids"])
        c_logits = _runner_logits(companion, vocab, row["prompt_ids"], row["response_ids"])
        sample = torch.tensor(row["draft_token"])
        for name in config.rules.names:
            rule = rules.from_spec(name)
            transform = rule.transform(sampling)
            candidates = q_logits.argmax(-1) if transform.greedy else sample  # Rule.propose, same draw as collection
            seen = companion_indicators(transform, q_logits, c_logits, candidates)
            for field in ("x", "y", "log_ratio"):
                column = f"sv_{field}_{name}"
                assert manifest.companion_indicators[name]["columns"][field] == column
                torch.testing.assert_close(torch.tensor(row[column]), getattr(seen, field), atol=1e-6, rtol=1e-6,
                                           msg=f"column {column}")
        greedy_candidate_differs += int((q_logits.argmax(-1) != sample).sum())
    assert greedy_candidate_differs > 0, "the greedy rule's candidate must differ from the sample somewhere"


@pytest.mark.parametrize("padding, temperature", [("copies", 0.8), ("zeros", 0.0)])
def test_collection_aligns_a_target_with_a_padded_vocabulary(micro_trio, tmp_path, padding, temperature):
    """A target with extra (padding) output rows, as Qwen2.5-72B has over 0.5B: sliced like the decoder slices it.

    ``copies``: padding rows as likely as real tokens, so sampling over the full vocabulary would
    draw them; ``zeros``: never the argmax, so only the logits' shapes disagree.
    """
    tokenizer = load_tokenizer(str(micro_trio["target"]))
    target = load_causal_lm(str(micro_trio["target"]), dtype="float32")
    vocab = vocab_size(target)
    target.resize_token_embeddings(vocab + 8)
    with torch.no_grad():
        rows = target.get_output_embeddings().weight
        rows[vocab:] = rows[:8] if padding == "copies" else 0.0
    padded = tmp_path / "padded_target"
    target.save_pretrained(padded)
    tokenizer.save_pretrained(padded)
    config = _config({**micro_trio, "target": padded}, tmp_path, "collect.splits=[dev]",
                     f"sampling.temperature={temperature}")
    manifest = collect(config.collect_job())
    assert manifest.models["vocab_size"] == vocab == len(tokenizer)
    table = load_split(config.paths.data_dir, "dev")
    sampling = Sampling(temperature=temperature)
    draft = load_causal_lm(str(micro_trio["draft"]), dtype="float32")
    responses = 0
    for row in table:
        assert max(row["response_ids"]) < vocab
        p = sampling.probs(_brute_force_logits(target, row["prompt_ids"], row["response_ids"])[:, :vocab])
        q = sampling.probs(_brute_force_logits(draft, row["prompt_ids"], row["response_ids"]))
        y = torch.tensor(row["draft_token"])
        ratio = (p.gather(-1, y[:, None]) / q.gather(-1, y[:, None])).squeeze(-1).clamp(max=1)
        torch.testing.assert_close(torch.tensor(row["label_speculative"]), ratio, atol=1e-5, rtol=1e-5)
        responses += len(row["response_ids"])
    assert responses > 0


def test_kept_target_logits_equal_teacher_forced_distribution(micro_trio):
    target = load_causal_lm(str(micro_trio["target"]), dtype="float32")
    prompts = [[5, 9, 33, 47, 80, 12], [7, 7], [100, 101, 102, 103]]  # different lengths: left padding
    generators = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
    batch = generate_responses(target, prompts, sampling=Sampling(), max_new_tokens=10, eos_token_id=None,
                               pad_token_id=0, generators=generators, vocab=vocab_size(target))
    forced = teacher_forced_logits(target, batch, vocab_size(target))
    torch.testing.assert_close(batch.target_logits, forced, atol=1e-4, rtol=1e-4)
    for row, prompt in enumerate(prompts):
        alone = _brute_force_logits(target, prompt, batch.response_ids(row).tolist())
        torch.testing.assert_close(batch.target_logits[row], alone, atol=1e-4, rtol=1e-4)


def test_manifest_describes_the_run(collected):
    _, manifest, data_dir = collected
    on_disk = json.loads((data_dir / MANIFEST_FILE).read_text())
    assert on_disk["tokenizer_hash"] == manifest.tokenizer_hash
    assert read_manifest(data_dir)[0] == manifest  # built once, read back as the same record
    stale = {k: v for k, v in on_disk.items() if k != "splits"}
    with pytest.raises(ConfigError, match=r"lacks splits; collect the data again"):
        CollectionManifest.from_dict(stale)
    assert on_disk["sampling"] == {"temperature": 0.8, "top_k": 100, "top_p": None}
    assert on_disk["rules"]["label_ensemble_weighted"]["params"]["weight"] == pytest.approx(LAMBDA)
    train = on_disk["splits"]["train"]
    assert train["responses"] == len(load_split(data_dir, "train"))
    assert train["labelled_positions"] == sum(len(r) for r in load_split(data_dir, "train")["response_ids"])
    assert 0 <= train["mean_label"]["label_speculative"] <= 1
    assert train["sampling_check"]["passed"], "the target's own samples pass the sampling check (|z| <= 4)"
    assert on_disk["responses"] is None, "generated in the job"


@pytest.fixture(scope="module")
def feature_collected(micro_trio, micro_feature_draft, tmp_path_factory):
    """Micro data labelled for a feature draft at depths 1-3 of a round (T = 1, the default transform)."""
    root = tmp_path_factory.mktemp("collect_feature")
    config = _config(micro_trio, root, f"models.draft.id={micro_feature_draft}", "collect.depths=3",
                     "prompts.sizes={train: 6, dev: 2}")
    return config, collect(config.collect_job()), Path(config.paths.data_dir)


def test_a_feature_draft_is_labelled_at_each_depth_of_a_round_as_decoding_drafts_it(feature_collected, micro_trio,
                                                                                     micro_feature_draft):
    _, manifest, data_dir = feature_collected
    target = load_causal_lm(str(micro_trio["target"]), dtype="float32")
    draft = load_causal_lm(str(micro_feature_draft), dtype="float32")
    checked = 0
    for row in load_split(data_dir, "train"):
        prompt, response = row["prompt_ids"], row["response_ids"]
        p = Sampling().probs(_brute_force_logits(target, prompt, response))
        rounds = incremental_round_logits(target, draft, prompt + response, 3)
        for depth in (1, 2, 3):
            column = labels.depth_column("label_speculative", depth)
            stored, y = torch.tensor(row[column]), torch.tensor(row[labels.depth_column("draft_token", depth)])
            reached = torch.arange(len(response)) >= depth - 1  # rounds start at the response's first token or later
            assert bool(stored[~reached].isnan().all()) and not bool(stored[reached].isnan().any())
            q = torch.stack([Sampling().probs(rounds[depth - 1][len(prompt) - 1 + t]) for t in range(len(response))])
            expected = (p.gather(-1, y[:, None]) / q.gather(-1, y[:, None])).squeeze(-1).clamp(max=1)
            torch.testing.assert_close(stored[reached], expected[reached], atol=1e-5, rtol=1e-5, msg=column)
            checked += int(reached.sum())
        deeper = torch.tensor(row["tv@d2"])[1:]
        assert (deeper - torch.tensor(row["tv"])[1:]).abs().max() > 1e-4  # negative control: depth matters
    assert checked > 0
    by_depth = manifest.splits["train"]["mean_label_by_depth"]["label_speculative"]
    mean = manifest.splits["train"]["mean_label"]["label_speculative"]
    assert len(by_depth) == 3 and by_depth[0] == pytest.approx(mean)
    config, _, _ = feature_collected
    other = _config(micro_trio, Path(config.paths.root), f"models.draft.id={micro_feature_draft}", "collect.depths=2",
                    "prompts.sizes={train: 6, dev: 2}")
    with pytest.raises(CollectionDirError, match="overwrite"):  # labels of other depths never mix into the data
        collect(other.collect_job())


def test_rerun_is_a_no_op_and_a_different_config_is_refused(collected, micro_trio):
    config, _, data_dir = collected
    before = _prompt_ids(data_dir, "train")
    collect(config.collect_job())
    assert _prompt_ids(data_dir, "train") == before
    other = _config(micro_trio, Path(config.paths.root), "collect.max_new_tokens=8")
    with pytest.raises(CollectionDirError, match="overwrite"):
        collect(other.collect_job())


def test_long_prompts_are_skipped_or_left_truncated(micro_trio, tmp_path):
    skip = collect(_config(micro_trio, tmp_path / "skip", "prompts.max_prompt_tokens=20", "prompts.truncation=skip",
                           "collect.splits=[dev]").collect_job())
    left = collect(_config(micro_trio, tmp_path / "left", "prompts.max_prompt_tokens=20",
                           "collect.splits=[dev]").collect_job())
    assert skip.splits["dev"]["prompts_skipped"].get("too_long", 0) > 0
    assert left.splits["dev"]["prompts_skipped"] == {}
    lengths = [len(r) for r in load_split(tmp_path / "left" / "tiny" / "data", "dev")["prompt_ids"]]
    assert max(lengths) <= 20


def _command(micro_trio, root, *extra) -> list[str]:
    return [sys.executable, "-m", "data_gen.collect", *_overrides(micro_trio, root, "prompts.sizes={train: 24, dev: 4}",
                                                                    "collect.shard_size=2", "collect.batch_size=2",
                                                                    *extra)]


@pytest.fixture(scope="module")
def reference_ids(micro_trio, tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    subprocess.run(_command(micro_trio, root), check=True, capture_output=True, timeout=600)
    return {split: _prompt_ids(root / "tiny" / "data", split) for split in ("train", "dev")}


def test_sigkill_mid_run_then_rerun_loses_and_duplicates_nothing(micro_trio, reference_ids, tmp_path):
    data_dir = tmp_path / "tiny" / "data"
    process = subprocess.Popen(_command(micro_trio, tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and len(list((data_dir / "train").glob("shard_*"))) < 2:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    written = len(list((data_dir / "train").glob("shard_*")))
    assert 2 <= written < 12, "the kill must land mid-run"
    assert not (data_dir / MANIFEST_FILE).exists()
    subprocess.run(_command(micro_trio, tmp_path), check=True, capture_output=True, timeout=600)
    for split, expected in reference_ids.items():
        ids = _prompt_ids(data_dir, split)
        assert ids == expected
        assert len(ids) == len(set(ids))


def test_two_process_torchrun_collects_the_same_prompts(micro_trio, reference_ids, tmp_path):
    command = _command(micro_trio, tmp_path)
    command[1:3] = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517", "-m",
                    "data_gen.collect"]
    cpu_only = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # two ranks on gloo: also on a one-GPU machine
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600, env=cpu_only)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((tmp_path / "tiny" / "data" / MANIFEST_FILE).read_text())
    assert manifest["world_size"] == 2
    for split, expected in reference_ids.items():
        ids = _prompt_ids(tmp_path / "tiny" / "data", split)
        assert sorted(ids) == sorted(expected)
        assert len(ids) == len(set(ids))


QWEN2_SHAPES = {"target": (2, 48, 1), "draft": (1, 32, 2), "companion": (1, 24, 3)}  # role: (layers, hidden, seed)


def test_a_qwen2_trio_collects_and_trains_a_head(micro_trio, tmp_path):
    """A non-Llama family end to end: collection with Qwen2 models, then a head trained for the Qwen2 draft."""
    tokenizer = load_tokenizer(str(micro_trio["target"]))
    # Padded like real Qwen2 checkpoints; beside a Qwen2 config the tokenizer loads as Qwen2Tokenizer, one token longer.
    vocab = 64 * (len(tokenizer) // 64 + 1)
    paths = {}
    for role, (layers, hidden, seed) in QWEN2_SHAPES.items():
        torch.manual_seed(seed)
        config = Qwen2Config(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=192,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        paths[role] = tmp_path / "models" / role
        Qwen2ForCausalLM(config).save_pretrained(paths[role])
        tokenizer.save_pretrained(paths[role])
    config = compose_config(*model_overrides(paths), *DATA_OVERRIDES, *TRAIN_OVERRIDES, f"paths.root={tmp_path}")
    manifest = collect(config.collect_job())
    train = manifest.splits["train"]
    assert train["labelled_positions"] > 0 and 0 < train["mean_label"]["label_speculative"] < 1
    result = head_training.train(config.train_job())
    assert result.dev_metrics["val/binary_kl_constant"] > 0
    draft = load_causal_lm(str(paths["draft"]), dtype="float32")
    assert isinstance(draft, Qwen2ForCausalLM)
    head = load_head(result.head_path, draft=draft, tokenizer=load_tokenizer(str(paths["draft"])))
    assert head.metadata.head_config.hidden_size == 32
