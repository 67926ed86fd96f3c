"""data_gen.collect on micro models: labels vs brute force, kept target logits, resume, torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from accept_heads.cli import CONF_DIR, to_config
from data_gen.collect import collect
from data_gen.generation import generate_responses, teacher_forced_logits
from data_gen.shards import MANIFEST_FILE, CollectionDirError, load_split
from decode.hub import load_causal_lm
from decode.sampling import Sampling

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
        f"rules.ensemble_weight={LAMBDA}",
        f"rules.ensemble_mu={MU}",
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
    manifest = collect(config)
    return config, manifest, Path(config.paths.data_dir)


def _brute_force_logits(model, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    return logits[len(prompt_ids) - 1 : len(prompt_ids) + len(response_ids) - 1]


def test_every_label_column_equals_a_brute_force_recomputation(collected, micro_trio):
    config, _, data_dir = collected
    sampling = Sampling(temperature=0.8, top_k=100)
    models = {role: load_causal_lm(str(path), dtype="float32") for role, path in micro_trio.items()}
    table = load_split(data_dir, "train")
    assert len({len(r) for r in table["prompt_ids"]}) > 1, "batches must mix prompt lengths (left padding)"
    checked = 0
    for row in table:
        logits = {role: _brute_force_logits(m, row["prompt_ids"], row["response_ids"]) for role, m in models.items()}
        p, q, c = (sampling.probs(logits[r]) for r in ("target", "draft", "companion"))
        y = torch.tensor(row["draft_token"])
        py, qy, cy = (d.gather(-1, y[:, None]).squeeze(-1) for d in (p, q, c))
        r_weighted = LAMBDA * q + (1 - LAMBDA) * p
        r_contrastive = sampling.probs(logits["target"] - MU * logits["draft"])
        m = 0.5 * (p + q)
        kl = lambda a, b: (a * (a / b).log()).nan_to_num(0.0).sum(-1)  # noqa: E731 — 0 log 0 = 0
        expected = {
            "draft_prob": qy,
            "target_prob": py,
            "label_speculative": (py / qy).clamp(max=1),
            "label_greedy": (logits["target"].argmax(-1) == logits["draft"].argmax(-1)).float(),
            "label_ensemble_weighted": (r_weighted.gather(-1, y[:, None]).squeeze(-1) / qy).clamp(max=1),
            "label_ensemble_contrastive": (r_contrastive.gather(-1, y[:, None]).squeeze(-1) / qy).clamp(max=1),
            "tv": 0.5 * (p - q).abs().sum(-1),
            "js": 0.5 * kl(p, m) + 0.5 * kl(q, m),
            "sv_x": torch.minimum(q, c).sum(-1),
            "sv_y": (cy / qy).clamp(max=1),
        }
        for column, values in expected.items():
            torch.testing.assert_close(torch.tensor(row[column]), values.float(), atol=1e-5, rtol=1e-5,
                                       msg=f"column {column}")
        assert torch.equal(torch.tensor(row["target_argmax"]), logits["target"].argmax(-1))
        assert bool((qy > 0).all()), "draft candidates are samples of the transformed q"
        checked += 1
    assert checked == len(table) >= 8


def test_kept_target_logits_equal_teacher_forced_distribution(micro_trio):
    target = load_causal_lm(str(micro_trio["target"]), dtype="float32")
    prompts = [[5, 9, 33, 47, 80, 12], [7, 7], [100, 101, 102, 103]]  # different lengths: left padding
    generators = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
    batch = generate_responses(target, prompts, sampling=Sampling(), max_new_tokens=10, eos_token_id=None,
                               pad_token_id=0, generators=generators)
    forced = teacher_forced_logits(target, batch)
    torch.testing.assert_close(batch.target_logits, forced, atol=1e-4, rtol=1e-4)
    for row, prompt in enumerate(prompts):
        alone = _brute_force_logits(target, prompt, batch.response_ids(row).tolist())
        torch.testing.assert_close(batch.target_logits[row], alone, atol=1e-4, rtol=1e-4)


def test_manifest_describes_the_run(collected):
    _, manifest, data_dir = collected
    on_disk = json.loads((data_dir / MANIFEST_FILE).read_text())
    assert on_disk["tokenizer_hash"] == manifest["tokenizer_hash"]
    assert on_disk["sampling"] == {"temperature": 0.8, "top_k": 100, "top_p": None}
    assert on_disk["rules"]["label_ensemble_weighted"]["params"]["weight"] == pytest.approx(LAMBDA)
    train = on_disk["splits"]["train"]
    assert train["responses"] == len(load_split(data_dir, "train"))
    assert train["labelled_positions"] == sum(len(r) for r in load_split(data_dir, "train")["response_ids"])
    assert 0 <= train["mean_label"]["label_speculative"] <= 1


def test_rerun_is_a_no_op_and_a_different_config_is_refused(collected, micro_trio):
    config, _, data_dir = collected
    before = _prompt_ids(data_dir, "train")
    collect(config)
    assert _prompt_ids(data_dir, "train") == before
    other = _config(micro_trio, Path(config.paths.root), "collect.max_new_tokens=8")
    with pytest.raises(CollectionDirError, match="overwrite"):
        collect(other)


def test_long_prompts_are_skipped_or_left_truncated(micro_trio, tmp_path):
    skip = collect(_config(micro_trio, tmp_path / "skip", "prompts.max_prompt_tokens=20", "prompts.truncation=skip",
                           "collect.splits=[dev]"))
    left = collect(_config(micro_trio, tmp_path / "left", "prompts.max_prompt_tokens=20",
                           "collect.splits=[dev]"))
    assert skip["splits"]["dev"]["prompts_skipped"].get("too_long", 0) > 0
    assert left["splits"]["dev"]["prompts_skipped"] == {}
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
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((tmp_path / "tiny" / "data" / MANIFEST_FILE).read_text())
    assert manifest["world_size"] == 2
    for split, expected in reference_ids.items():
        ids = _prompt_ids(tmp_path / "tiny" / "data", split)
        assert sorted(ids) == sorted(expected)
        assert len(ids) == len(set(ids))
