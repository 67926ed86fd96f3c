"""Sharing an export: the card from the training metadata, and the upload (hub client monkeypatched, no network)."""

from __future__ import annotations

from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi
from transformers import LlamaConfig, LlamaForCausalLM

from accept_heads.push_head import main
from accept_heads.training.export import common_metadata, head_metadata
from data_gen.manifest import MANIFEST_VERSION, CollectionManifest
from decode import AcceptanceHead, HeadConfig, Sampling, SpeculativeDecoder, load_head, policies, rules, save_head
from decode.artifacts.gguf import file_sha256
from decode.artifacts.model_card import MARKER
from decode.artifacts.serialization import save_threshold_choice
from decode.artifacts.threshold_choice import ThresholdChoice

SENT = ["README.md", "custom_generate/generate.py", "custom_generate/requirements.txt", "head.h_choice.json",
        "head.safetensors"]


def micro_lm(hidden: int, seed: int) -> LlamaForCausalLM:
    """A random Llama over 32 tokens (the export's head reads a hidden size of 8)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def micro_manifest(**changes) -> CollectionManifest:
    """A collection manifest naming hub-style models (only what an export reads is meaningful)."""
    manifest = CollectionManifest(
        manifest_version=MANIFEST_VERSION, exp_name="tiny",
        models={"draft": {"id": "micro-org/draft", "revision": None}, "target": {"id": "micro-org/target"}},
        tokenizer_hash="f" * 64, sampling={}, rules={}, fuzzy="", companion_indicators={}, prompts={},
        max_new_tokens=8, seed=0, code_version="test", python="3", world_size=1, wall_seconds=0.0,
        splits={"train": {"labelled_positions": 900}, "dev": {"labelled_positions": 120}}, responses=None,
    )
    return replace(manifest, **changes)


@pytest.fixture
def export_dir(tmp_path, make_config) -> Path:
    """A head exported with the metadata a training run writes and the h an evaluation chose for it, plus a stray
    file beside it."""
    config = make_config()
    manifest = micro_manifest()
    common = common_metadata(config.train_job(), manifest, "c" * 64, rules.Greedy(), Sampling(temperature=0.0))
    head = AcceptanceHead(HeadConfig(hidden_size=8, depth=1))
    meta = head_metadata(common, config.train_job(), head.config, {"val/binary_kl": 0.25, "val/auroc": 0.8})
    directory = tmp_path / "export"
    directory.mkdir()
    save_head(head, directory / "head.safetensors", meta)
    rows = tuple({"h": h, "generated": 64, "draft_calls": calls, "target_calls": 28, "discarded": 8, "modelled_s": 2.0,
                  "throughput": 32.0, "generations": []} for h, calls in ((0.2, 40), (0.4, 48)))
    save_threshold_choice(ThresholdChoice(file_sha256(directory / "head.safetensors"), "p" * 64, {"max_new_tokens": 8},
                                          {"source": "configured"}, {"count": 2, "prompt_ids": ["a", "b"]}, 0.4, rows),
                          directory / "head.safetensors")  # the h an evaluation chose for it
    (directory / "notes.txt").write_text("local only\n")
    return directory


@pytest.fixture
def hub_calls(monkeypatch) -> list[tuple[str, dict]]:
    """Record HfApi.create_repo / create_branch / upload_folder instead of calling the hub."""
    calls: list[tuple[str, dict]] = []

    def recorder(name: str):
        def record(self, *args, **kwargs):
            calls.append((name, {"args": args, **kwargs}))
        return record

    for name in ("create_repo", "create_branch", "upload_folder"):
        monkeypatch.setattr(HfApi, name, recorder(name))
    return calls


def test_card_from_training_metadata(export_dir):
    card = (export_dir / "README.md").read_text()
    assert 'base_model: "micro-org/draft"' in card and "- rule-greedy" in card
    assert "`greedy`" in card and "Sampling(temperature=0.0, top_k=None, top_p=None)" in card
    assert "**h = 0.4**" in card and "on 2 dev prompts (8 new tokens each)" in card
    assert "c" * 64 in card and "| `val/auroc` | 0.8 |" in card
    assert '"lr"' in card  # the training recipe (train_config) is part of the card


def test_push_sends_the_artifacts_and_the_card(export_dir, hub_calls, capsys):
    main([str(export_dir), "micro-org/shared-head", "--private", "--revision", "v1"])
    names = [name for name, _ in hub_calls]
    assert names == ["create_repo", "create_branch", "upload_folder"]
    assert hub_calls[0][1]["args"] == ("micro-org/shared-head",) and hub_calls[0][1]["private"] is True
    assert hub_calls[1][1]["branch"] == "v1"
    upload = hub_calls[2][1]
    assert upload["repo_id"] == "micro-org/shared-head" and upload["revision"] == "v1"
    assert Path(upload["folder_path"]) == export_dir
    assert upload["allow_patterns"] == SENT  # notes.txt stays local
    card = (export_dir / "README.md").read_text()
    assert 'decode.load_head("micro-org/shared-head", draft=draft' in card and MARKER in card
    out = capsys.readouterr().out
    assert "uploaded to micro-org/shared-head@v1" in out and "left out (not part of the export): notes.txt" in out


def test_dry_run_uploads_nothing_and_keeps_the_card(export_dir, hub_calls, capsys):
    before = (export_dir / "README.md").read_text()
    main([str(export_dir), "micro-org/shared-head", "--dry-run"])
    assert hub_calls == []
    assert (export_dir / "README.md").read_text() == before
    out = capsys.readouterr().out
    assert "would upload to micro-org/shared-head@main" in out
    assert ("  README.md\n  custom_generate/generate.py (generated)\n  custom_generate/requirements.txt (generated)\n"
            "  head.h_choice.json\n  head.safetensors\n") in out


def test_hand_written_card_is_sent_unchanged(export_dir, hub_calls):
    (export_dir / "README.md").write_text("---\nlibrary_name: accept-heads\n---\n# my words\n")
    main([str(export_dir), "micro-org/shared-head"])
    assert (export_dir / "README.md").read_text().endswith("# my words\n")
    assert hub_calls[-1][1]["allow_patterns"] == SENT


def test_refusals_are_one_line(tmp_path, hub_calls, capsys):
    with pytest.raises(SystemExit) as excinfo:
        main([str(tmp_path), "micro-org/x"])
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no head or SV profile" in err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "not a repo id!"])
    assert "invalid repo id" in capsys.readouterr().err
    assert hub_calls == []


def test_upload_error_is_one_line(export_dir, monkeypatch, capsys):
    def refuse(self, *args, **kwargs):
        raise OSError("401 Client Error: Unauthorized\nmore detail")

    monkeypatch.setattr(HfApi, "create_repo", refuse)
    with pytest.raises(SystemExit):
        main([str(export_dir), "micro-org/shared-head"])
    err = capsys.readouterr().err
    assert err == f"error: cannot push {export_dir} to 'micro-org/shared-head@main': 401 Client Error: Unauthorized\n"


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["--help"])
    assert excinfo.value.code == 0
    out = capsys.readouterr().out
    assert "REPO_ID" in out and "--dry-run" in out and "--revision" in out and "upload_folder" in out


def test_an_undefined_dev_auroc_reads_undefined_in_the_card(tmp_path, make_config):
    config = make_config()
    manifest = micro_manifest(splits={})
    common = common_metadata(config.train_job(), manifest, "c" * 64, rules.Greedy(), Sampling(temperature=0.0))
    head = AcceptanceHead(HeadConfig(hidden_size=8, depth=1))
    meta = head_metadata(common, config.train_job(), head.config, {"val/binary_kl": 0.0, "val/auroc": None})
    save_head(head, tmp_path / "head.safetensors", meta)
    card = (tmp_path / "README.md").read_text()
    assert "| `val/auroc` | undefined (one class) |" in card and "| `val/auroc` | 0" not in card


def test_a_head_pushed_to_a_folder_decodes_through_generate(export_dir, tmp_path, capsys):
    """``custom_generate=<folder>`` runs the folder's generate.py: our decoder with the folder's head at its recorded
    threshold, the draft given as ``assistant_model`` and the streamer as ``generate`` takes them."""
    try:
        metadata.distribution("accept-heads")
    except metadata.PackageNotFoundError:
        pytest.skip("transformers checks the folder's requirements.txt: accept-heads must be pip-installed "
                    "(a checkout on PYTHONPATH is not)")
    folder = tmp_path / "shared-head"
    main([str(export_dir), str(folder), "--local"])
    assert "written to" in capsys.readouterr().out
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == SENT
    assert str(folder.resolve()) in (folder / "custom_generate" / "generate.py").read_text()
    target, draft = micro_lm(16, seed=1), micro_lm(8, seed=2)
    ids = torch.tensor([[3, 9, 27, 4]])
    streamed = []

    class Recorder:
        def put(self, value):
            streamed.append(value.flatten())

        def end(self):
            streamed.append(None)

    got = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                          custom_generate=str(folder), trust_remote_code=True, streamer=Recorder(), do_sample=False,
                          max_new_tokens=12, pad_token_id=0)
    head = load_head(folder)
    recorded = head.metadata
    assert head.threshold == 0.4  # its threshold choice travelled with it
    policy = policies.Head(head)  # at its chosen h and the K range it records, as the generate door decodes it
    assert (policy.threshold, policy.k_min, policy.k_max) == (0.4, recorded.k_min, recorded.k_max)
    expected = SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policy, sampling=Sampling(temperature=0.0),
                                  eos_token_id=None).generate(ids, max_new_tokens=12).sequences
    assert torch.equal(got, expected)
    assert torch.equal(streamed[0], ids[0]) and streamed[-1] is None
    assert torch.equal(torch.cat(streamed[1:-1]), got[0, ids.shape[1] :])
    with pytest.raises(ValueError, match="assistant_model=draft"):
        target.generate(ids, custom_generate=str(folder), trust_remote_code=True, max_new_tokens=4)
