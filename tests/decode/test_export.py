"""Head architecture, head / profile files and their validation."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import safe_open, save_file

from decode import (
    AcceptanceHead,
    EnsembleDecoder,
    HeadConfig,
    Sampling,
    SpeculativeDecoder,
    SVProfile,
    load_head,
    load_profile,
    policies,
    rules,
    save_head,
    save_profile,
)
from decode.artifacts.gguf import file_sha256
from decode.artifacts.hub import tokenizer_hash
from decode.artifacts.model_card import render_card
from decode.artifacts.serialization import TENSORS_KEY, save_threshold_choice
from decode.artifacts.threshold_choice import ThresholdChoice
from decode.artifacts.version import code_version
from decode.digests import Loaded, unverified_files
from decode.head import PRE_FEATURES, head_features
from decode.metadata import (
    HeadMetadata,
    InformationGain,
    ProfileMetadata,
    TrainingData,
)


def metadata(tokenizer, artifact: AcceptanceHead | SVProfile, rule=None, sampling=None,
             **fields) -> HeadMetadata | ProfileMetadata:
    """The fields every artifact must record, for ``artifact`` (its head config or bins), and ``fields``."""
    required = dict(draft="micro-draft", tokenizer_hash=tokenizer_hash(tokenizer),
                    rule=(rule or rules.Speculative()).spec(), sampling=sampling or Sampling())
    if isinstance(artifact, AcceptanceHead):
        return HeadMetadata(**required, head_config=artifact.config, **fields)
    return ProfileMetadata(**required, bins=artifact.bins, **fields)


def test_blocks_have_distinct_parameters():
    head = AcceptanceHead(HeadConfig(hidden_size=8, depth=4))
    weights = [block.weight for block in head.blocks]
    assert len({w.data_ptr() for w in weights}) == 4
    assert all(not torch.equal(weights[0], w) for w in weights[1:])
    assert len(list(head.parameters())) == 2 * 4 + 2


def test_pre_head_input_size_and_features():
    config = HeadConfig(hidden_size=8, timing="pre", features=PRE_FEATURES, companion_features=True)
    assert config.input_size == 8 + 5
    head = AcceptanceHead(config)
    q = torch.tensor([[0.5, 0.25, 0.25]])
    features = head_features(q, torch.tensor([1]), PRE_FEATURES, (torch.tensor([0.7]), torch.tensor([0.4])))
    assert features[0, :3].tolist() == pytest.approx([torch.tensor(0.25).log().item(), 1.0397, 0.5], abs=1e-4)
    assert head(torch.zeros(1, 8), features).shape == (1,)
    with pytest.raises(ValueError):
        HeadConfig(hidden_size=8, timing="post", features=PRE_FEATURES)


def test_head_round_trip(tmp_path, wide, make_tokenizer):
    tokenizer = make_tokenizer(96)
    head = AcceptanceHead(HeadConfig(hidden_size=wide["draft"].config.hidden_size, depth=3))
    path = tmp_path / "head.safetensors"
    save_head(head, path, metadata(tokenizer, head))
    loaded = load_head(path, draft=wide["draft"], tokenizer=tokenizer, sampling=Sampling(), rule=rules.Speculative())
    assert loaded.config == head.config
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name])
    assert loaded.metadata.rule == {"name": "speculative", "params": {}}
    assert loaded.metadata.code_version == code_version()


def test_head_mismatches(tmp_path, wide, make_tokenizer):
    tokenizer = make_tokenizer(96)
    head = AcceptanceHead(HeadConfig(hidden_size=12, depth=1))
    path = tmp_path / "head.safetensors"
    save_head(head, path, metadata(tokenizer, head, rule=rules.Fuzzy("js", 0.3), sampling=Sampling(temperature=0.7)))
    with pytest.raises(ValueError, match="hidden size 12"):
        load_head(path, draft=wide["draft"])
    with pytest.raises(ValueError, match="tokenizer hash"):
        load_head(path, tokenizer=make_tokenizer(95))
    with pytest.raises(ValueError, match=r"rule .*fuzzy.* but the decoder uses .*speculative"):
        load_head(path, rule=rules.Speculative())
    with pytest.warns(UserWarning, match="sampled under"):
        load_head(path, sampling=Sampling())
    greedy_data = tmp_path / "greedy.safetensors"  # a greedy-rule head fitted on greedily generated data ...
    save_head(head, greedy_data, metadata(tokenizer, head, rule=rules.Greedy(), sampling=Sampling(temperature=0.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_head(greedy_data, sampling=Sampling(temperature=1.0))  # ... matches greedy decoding at any T
    sampled_data = tmp_path / "sampled.safetensors"  # ... but one fitted on T = 1 responses does not
    save_head(head, sampled_data, metadata(tokenizer, head, rule=rules.Greedy(), sampling=Sampling(temperature=1.0)))
    with pytest.warns(UserWarning, match="sampled under"):
        load_head(sampled_data, sampling=Sampling(temperature=1.0))
    other = AcceptanceHead(HeadConfig(hidden_size=12, depth=2))
    with pytest.raises(ValueError, match="describes a head"):
        save_head(head, tmp_path / "bad.safetensors", metadata(tokenizer, other))
    right = AcceptanceHead(HeadConfig(hidden_size=wide["draft"].config.hidden_size))
    save_head(right, path, metadata(tokenizer, right, rule=rules.Fuzzy("js", 0.3)))
    with pytest.raises(ValueError, match="rule"):
        SpeculativeDecoder(wide["target"], wide["draft"], rule=rules.Speculative(),
                           policy=policies.Head(load_head(path), threshold=0.5))


def test_every_door_checks_a_head_against_the_draft_it_reads(tmp_path, wide, make_tokenizer):
    path = tmp_path / "head.safetensors"
    head = AcceptanceHead(HeadConfig(hidden_size=16))  # the draft's 16
    save_head(head, path, metadata(make_tokenizer(96), head))
    policy = policies.Head(load_head(path), threshold=0.5)
    SpeculativeDecoder(wide["target"], wide["draft"], rule=rules.Speculative(), policy=policy)
    refused = r"expects draft hidden size 16 \(draft 'micro-draft'\) but the given draft has 32"
    with pytest.raises(ValueError, match=refused):
        load_head(path, draft=wide["target"])
    with pytest.raises(ValueError, match=refused):
        SpeculativeDecoder(wide["draft"], wide["target"], rule=rules.Speculative(), policy=policy)
    ensemble = tmp_path / "ensemble.safetensors"
    save_head(head, ensemble, metadata(make_tokenizer(96), head, rule=rules.Ensemble("weighted", weight=0.5)))
    sd = policies.Head(load_head(ensemble), threshold=0.5)
    EnsembleDecoder([wide["draft"], wide["target"]], mode="sd", policy=sd)  # the proposer is the draft
    with pytest.raises(ValueError, match=refused):
        EnsembleDecoder([wide["target"], wide["draft"]], mode="sd", policy=sd)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_head(tmp_path / "nope.safetensors")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00\x01not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        load_head(garbage)
    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(1)}, str(plain))
    with pytest.raises(ValueError, match="no 'accept_heads' metadata"):
        load_profile(plain)


def test_profile_round_trip(tmp_path, make_tokenizer):
    tokenizer = make_tokenizer(10)
    profile = SVProfile(
        x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 0.2, 0.6, 1.0]),
        table=torch.rand(2, 3), counts=torch.randint(1, 9, (2, 3)).float(), latency=torch.tensor([1.0, 1.1]),
    )
    path = tmp_path / "profile.safetensors"
    save_profile(profile, path, metadata(tokenizer, profile, companion="micro-companion"))
    loaded = load_profile(path, tokenizer=tokenizer, rule=rules.Speculative())
    for name, tensor in profile.tensors().items():
        assert torch.equal(tensor, loaded.tensors()[name])
    assert loaded.metadata.companion == "micro-companion" and loaded.metadata.bins == (2, 3)
    with pytest.raises(ValueError, match="describes a profile of"):
        save_profile(profile, path, replace(loaded.metadata, bins=(3, 2)))
    with pytest.raises(ValueError, match="holds a 'sv_profile' artifact"):
        load_head(path)
    with pytest.raises(ValueError, match="rule"):
        load_profile(path, rule=rules.Greedy())


# --- model cards and hub ids --------------------------------------------------------------------------------


def trained_metadata(tokenizer, head: AcceptanceHead, draft: str = "micro-org/micro-draft") -> HeadMetadata:
    """Metadata shaped like accept_heads.training.export.head_metadata's: models, data, dev metrics, K range."""
    return replace(
        metadata(tokenizer, head, rule=rules.Fuzzy("js", 0.3), sampling=Sampling(temperature=0.7)),
        draft=draft, draft_revision=None, target="micro-org/micro-target", companion=None,
        training_data=TrainingData(manifest_sha256="ab" * 32, data_dir="/runs/tiny/data", exp_name="tiny",
                                   positions={"train": 900, "dev": 120}),
        seed=7,
        dev_metrics={"val/binary_kl": 0.4123, "val/auroc": 0.7311, "val/ece": 0.021},
        k_min=1, k_max=8,
    )


def choose(head_file: Path, h: float = 0.3) -> Path:
    """Record ``h`` for ``head_file`` as an evaluation does (two grid points, ``h`` among them); the record's path."""
    rows = tuple({"h": value, "generated": 128, "draft_calls": calls, "target_calls": 30 + calls // 10,
                  "discarded": calls // 5, "modelled_s": 2.45 if value == h else 3.16,
                  "throughput": 52.25 if value == h else 40.5, "generations": []}
                 for value, calls in ((0.1, 70), (h, 90)))
    return save_threshold_choice(ThresholdChoice(file_sha256(head_file), "cd" * 32, {"max_new_tokens": 32},
                                                 {"t_draft": 0.0236, "t_target": 0.112}, {"count": 4}, h, rows),
                                 head_file)


def random_head(config: HeadConfig, seed: int) -> AcceptanceHead:
    """A head with every parameter drawn at random (a fresh head's output layer may be constant)."""
    torch.manual_seed(seed)
    head = AcceptanceHead(config)
    for parameter in head.parameters():
        torch.nn.init.normal_(parameter, std=0.5)
    return head.eval()


def front_matter(card: str) -> dict:
    yaml = pytest.importorskip("yaml")
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_export_writes_a_model_card(tmp_path, make_tokenizer):
    tokenizer = make_tokenizer(10)
    export = tmp_path / "export"
    export.mkdir()
    head = random_head(HeadConfig(hidden_size=8, depth=2, timing="pre", features=PRE_FEATURES), seed=0)
    save_head(head, export / "head.safetensors", trained_metadata(tokenizer, head))
    assert sorted(p.name for p in export.iterdir()) == ["README.md", "head.safetensors"]  # a hub repo, nothing stray
    assert "none is recorded for it yet" in (export / "README.md").read_text()
    choose(export / "head.safetensors")  # the evaluation's choice rewrites the card
    card = (export / "README.md").read_text()
    meta = front_matter(card)
    assert meta["library_name"] == "accept-heads" and meta["base_model"] == "micro-org/micro-draft"
    assert {"speculative-decoding", "acceptance-head", "rule-fuzzy"} <= set(meta["tags"])
    assert "SpecDec++ acceptance head, pre-verification timing" in card
    assert "`fuzzy` (divergence='js', threshold=0.3)" in card
    assert "Sampling(temperature=0.7, top_k=None, top_p=None)" in card
    assert "**h = 0.3**, chosen by `python -m accept_heads.evaluate` (`head.h_choice.json`)" in card
    assert "| h | generated | draft_calls | target_calls | discarded | modelled_s | throughput |" in card
    assert "| **0.3** | **128** | **90** | **39** | **18** | **2.45** | **52.25** |" in card
    assert "| 0.1 | 128 | 70 | 37 | 14 | 3.16 | 40.5 |" in card
    assert "`micro-org/micro-target`" in card and "ab" * 32 in card and "dev 120, train 900" in card
    assert "| `val/auroc` | 0.7311 |" in card and "no 95 % interval" in card
    assert 'decode.load_head("<org>/<name>", draft=draft, tokenizer=tokenizer)' in card
    assert "policy = decode.policies.Head(head)  # at the h = 0.3 chosen on dev, 1 to 8 candidates" in card

    profile = SVProfile(x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 1.0]),
                        table=torch.rand(2, 1), counts=torch.ones(2, 1), latency=torch.tensor([1.0, 1.2]))
    save_profile(profile, export / "profile.safetensors",
                 metadata(tokenizer, profile, k_max=2, information={
                     "dev": InformationGain(h_a=0.9, h_a_given_xy=0.8, gain=0.1, gain_fraction=0.11)}))
    card = (export / "README.md").read_text()
    assert "## `head.safetensors`" in card and "## `profile.safetensors`: SV profile" in card
    assert "policies.SV(profile, k=2)" in card and "rule-speculative" in front_matter(card)["tags"]
    assert front_matter(card)["base_model"] == "micro-org/micro-draft"  # "micro-draft" is no hub id


def test_card_without_hub_draft_and_hand_written_readme(tmp_path, make_tokenizer):
    tokenizer = make_tokenizer(10)
    head = random_head(HeadConfig(hidden_size=8), seed=1)
    save_head(head, tmp_path / "head.safetensors", metadata(tokenizer, head))
    card = (tmp_path / "README.md").read_text()
    assert "base_model" not in front_matter(card) and "none is recorded for it yet" in card
    assert "Head(head, threshold=0.5)  # no h chosen yet: choose it on your prompts" in card
    (tmp_path / "README.md").write_text("# my own notes\n")
    with pytest.warns(UserWarning, match="not generated by decode.artifacts.serialization"):
        save_head(random_head(HeadConfig(hidden_size=8), seed=2), tmp_path / "head.safetensors",
                  metadata(tokenizer, head))
    assert (tmp_path / "README.md").read_text() == "# my own notes\n"


def hub_cache(root, repo_id: str, files: dict, commit: str = "0123456789abcdef0123456789abcdef01234567"):
    """The HF cache layout of one model repo: ``models--org--name/{refs/main, snapshots/<commit>/...}``."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, source in files.items():
        (snapshot / name).write_bytes(source.read_bytes())
    return commit


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty HF hub cache in offline mode (the constants are read at import, so they are patched too)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_load_head_and_profile_by_hub_id_from_the_offline_cache(tmp_path, offline_cache, make_tokenizer):
    tokenizer = make_tokenizer(10)
    export = tmp_path / "export"
    export.mkdir()
    config = HeadConfig(hidden_size=8, depth=2, timing="pre", features=PRE_FEATURES)
    saved = random_head(config, seed=3)
    save_head(saved, export / "head.safetensors", trained_metadata(tokenizer, saved))
    choose(export / "head.safetensors")
    profile = SVProfile(x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 1.0]),
                        table=torch.tensor([[0.2], [0.8]]), counts=torch.ones(2, 1), latency=torch.tensor([1.0]))
    save_profile(profile, export / "profile.safetensors", metadata(tokenizer, profile))
    files = ("head.safetensors", "head.h_choice.json", "profile.safetensors", "README.md")
    commit = hub_cache(offline_cache, "micro-org/micro-head", {name: export / name for name in files})

    loaded = load_head("micro-org/micro-head", tokenizer=tokenizer, sampling=Sampling(temperature=0.7),
                       rule=rules.Fuzzy("js", 0.3))
    pinned = load_head("micro-org/micro-head", revision=commit)
    hidden, features = torch.randn(16, 8), torch.randn(16, 3)
    expected = saved.predict(hidden, features)
    assert torch.equal(loaded.predict(hidden, features), expected)
    assert torch.equal(pinned.predict(hidden, features), expected)
    assert not torch.equal(random_head(config, seed=4).predict(hidden, features), expected)  # the check can fail
    assert loaded.threshold == 0.3 and pinned.threshold == 0.3  # the h chosen for it, fetched beside it
    assert torch.equal(load_profile("micro-org/micro-head").table, profile.table)
    assert torch.equal(load_head(export).predict(hidden, features), expected)  # the local directory form


def test_a_head_policy_stops_at_its_chosen_h_and_recorded_k_range_unless_given_others(tmp_path, make_tokenizer):
    tokenizer = make_tokenizer(10)
    saved = random_head(HeadConfig(hidden_size=8), seed=1)
    save_head(saved, tmp_path / "head.safetensors", trained_metadata(tokenizer, saved))
    assert load_head(tmp_path).threshold is None  # no evaluation has chosen its h
    choose(tmp_path / "head.safetensors")
    head = load_head(tmp_path)
    recorded = policies.Head(head)
    assert (recorded.threshold, recorded.k_min, recorded.k_max) == (0.3, 1, 8)
    told = policies.Head(head, threshold=0.7, k_max=4)
    assert (told.threshold, told.k_min, told.k_max) == (0.7, 1, 4)
    bare = AcceptanceHead(HeadConfig(hidden_size=8))  # nothing recorded: h must be given, the range is 1..20
    with pytest.raises(ValueError, match=r"no stop threshold h: run python -m accept_heads.evaluate .* or pass "
                                         r"Head\(head, threshold=h\)"):
        policies.Head(bare)
    assert (policies.Head(bare, threshold=0.5).k_min, policies.Head(bare, threshold=0.5).k_max) == (1, 20)


def test_unreachable_hub_id_fails_with_one_line(tmp_path, offline_cache):
    from decode.artifacts.hub import ModelLoadError

    with pytest.raises(ModelLoadError) as excinfo:
        load_head("no-such-org/no-such-head")
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith("cannot load head 'no-such-org/no-such-head': not a local directory")
    with pytest.raises(ModelLoadError, match=r"^cannot load SV profile 'no-such-org/p@v2': [^\n]*$"):
        load_profile("no-such-org/p", revision="v2")
    with pytest.raises(FileNotFoundError, match="not found"):
        load_head(str(tmp_path / "missing" / "head.safetensors"))  # a path is never taken for a hub id
    with pytest.raises(ValueError, match="applies to hub ids"):
        load_head(tmp_path, revision="main")


# --- the typed metadata: every field round-trips, and files written before it load unchanged --------------------


def every_field(tokenizer, artifact: AcceptanceHead | SVProfile) -> HeadMetadata | ProfileMetadata:
    """A record with every field set to something other than its default."""
    shared = dict(draft_revision="r1", target="micro-target", companion="micro-companion", seed=3, k_max=6,
                  training_data=TrainingData(manifest_sha256="ab" * 32, data_dir="/data", exp_name="tiny",
                                             positions={"dev": 12, "train": 90}))
    sampling = Sampling(temperature=0.7, top_k=5, top_p=0.9)
    if isinstance(artifact, AcceptanceHead):
        return metadata(tokenizer, artifact, rule=rules.Fuzzy("js", 0.3), sampling=sampling, **shared,
                        k_min=2, dev_metrics={"val/auroc": 0.8, "val/ece": None},
                        train_config={"head": {"mixing_r": 0.25}}, probability="acceptance")
    gain = InformationGain(h_a=1.0, h_a_given_xy=0.7, gain=0.3, gain_fraction=0.3, gain_plugin=0.35)
    return metadata(tokenizer, artifact, sampling=sampling, **shared, requested_bins=(4, 4), min_bin_count=5, a_bins=10,
                    information={"dev": gain}, latency_device="cpu", latency_batches=(1, 8))


def test_the_typed_metadata_round_trips_every_field_of_a_head_and_a_profile(tmp_path, make_tokenizer):
    tokenizer = make_tokenizer(10)
    head = random_head(HeadConfig(hidden_size=8, timing="pre", features=PRE_FEATURES, companion_features=True), 0)
    profile = SVProfile(x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 0.2, 0.6, 1.0]),
                        table=torch.rand(2, 3), counts=torch.ones(2, 3), latency=torch.tensor([1.0, 1.1]))
    for artifact, save, load in ((head, save_head, load_head), (profile, save_profile, load_profile)):
        written = every_field(tokenizer, artifact)
        unset = [f.name for f in fields(written) if getattr(written, f.name) in (None, {}) and f.name != "code_version"]
        assert unset == []  # the check covers every field
        path = tmp_path / f"{written.kind}.safetensors"
        save(artifact, path, written)
        assert load(path).metadata == replace(written, code_version=code_version())
    assert load_head(tmp_path / "head.safetensors").metadata.mixing_r == 0.25


#: Header documents as the shipped code wrote them (the tiny demo of 2026-11-26 at 3277262, its sweep cut to two
#: rows): before the sweep recorded its prompt set.
OLD_HEAD = (
    '{"calibration": {"cost": {"t_companion": 0.0276, "t_draft": 0.0236, "t_target": 0.112, "t_target_alone": 0.108}, '
    '"max_new_tokens": 32, "prompts": 8, "table": [{"discarded": 85, "draft_calls": 240, "generated": 256, '
    '"modelled_time": 16.976, "target_calls": 101, "threshold": 0.5, "throughput": 15.080113100848257}, '
    '{"discarded": 146, "draft_calls": 299, "generated": 256, "modelled_time": 18.592399999999998, '
    '"target_calls": 103, "threshold": 0.6, "throughput": 13.769066930573784}]}, '
    '"code_version": "0.1.0+g327726288882", "companion": "zoo:companion", "dev_metrics": '
    '{"val/auroc": 0.7926725745201111, "val/binary_kl": 0.2435159981250763, "val/binary_kl_constant": '
    '0.3693752586841583, "val/ece": 0.009852674789726734, "val/mean_label": 0.7016351222991943, "val/mean_pred": '
    '0.7039863467216492, "val/weighted_bce": 0.48364707827568054}, '
    '"draft": "zoo:draft", "draft_revision": null, "format_version": 1, "head_config": {"companion_features": false, '
    '"depth": 3, "features": ["log_q", "entropy", "top_prob"], "hidden_size": 128, "timing": "pre"}, '
    '"hidden_size": 128, "k_max": 20, "k_min": 1, "kind": "head", "probability": "acceptance: the weighted loss\'s '
    'prior shift log(w_rej / w_acc) = 0.0000 is folded into the output bias", "rule": {"name": "speculative", '
    '"params": {}}, "sampling": {"temperature": 1.0, "top_k": null, "top_p": null}, "seed": 0, "target": "zoo:target", '
    '"threshold": 0.5, "tokenizer_hash": "314c1b1f50a14d8be6f11547e6cf8c60ba29d79341c1b7c161860a5b003fa60e", '
    '"train_config": {"head": {"a_bins": 10, "calibration_prompts": 8, "calibration_tokens": 32, "depth": 3, '
    '"k_max": 20, "k_min": 1, "kind": "specdecpp", "latency_batches": [1, 8, 32], "latency_repeats": 5, '
    '"min_bin_count": 20, "mixing_r": 1.0, "name": "speculative-pre", "rule": "speculative", "thresholds": [0.5, 0.6], '
    '"timing": "pre", "use_companion": false, "x_bins": 20, "y_bins": 10}, "loss": {"w_acc": 1.0, "w_rej": 1.0}, '
    '"optim": {"batch_size": 32, "lr": 0.003, "min_lr_ratio": 0.0, "warmup_steps": 20, "weight_decay": 0.01}}, '
    '"training_data": {"data_dir": "/tmp/before/runs/tiny/data", "exp_name": "tiny", "manifest_sha256": '
    '"c04a7b7c33cdb859f4d306c6b3346327269647958269462c2099699e6ef99f90", "positions": {"dev": 10561, "train": 142233}}}'
)
OLD_PROFILE = (
    '{"a_bins": 10, "bins": [20, 7], "code_version": "0.1.0+g327726288882", "companion": "zoo:companion", '
    '"draft": "zoo:draft", "draft_revision": null, "format_version": 1, "information": {"dev": {"gain": '
    '0.29739631226459706, "gain_fraction": 0.11985185805082411, "gain_plugin": 0.3864425862324281, "h_a": '
    '2.48136588869973, "h_a_given_xy": 2.183969576435133}, "train": {"gain": 0.3136019783640686, "gain_fraction": '
    '0.12720851980452472, "gain_plugin": 0.3201193310984358, "h_a": 2.4652592361420904, "h_a_given_xy": '
    '2.1516572577780217}}, "k_max": 6, "kind": "sv_profile", "latency_batches": [1, 8, 32], "latency_device": '
    '"cpu, prompt of 51 tokens", "min_bin_count": 20, "requested_bins": [20, 10], "rule": {"name": "speculative", '
    '"params": {}}, "sampling": {"temperature": 1.0, "top_k": null, "top_p": null}, "seed": 0, "target": "zoo:target", '
    '"tokenizer_hash": "314c1b1f50a14d8be6f11547e6cf8c60ba29d79341c1b7c161860a5b003fa60e", "training_data": '
    '{"data_dir": "/tmp/before/runs/tiny/data", "exp_name": "tiny", "manifest_sha256": '
    '"c04a7b7c33cdb859f4d306c6b3346327269647958269462c2099699e6ef99f90", "positions": {"dev": 10561, "train": 142233}}}'
)


def test_files_written_by_the_shipped_code_load_unchanged(tmp_path):
    """Every field is read, and written back the document is the one in the file, byte for byte, but for the ``h``
    training used to record (chosen by the evaluation now, beside the head: not read); a profile from before the
    plug-in gain was recorded loads without it. Such files record no sha256 of their tensors, so they load with
    ``verify=False`` (by default they are refused, as the test of a file that records no sha256 shows)."""
    head_path, profile_path = tmp_path / "head.safetensors", tmp_path / "profile.safetensors"
    head = random_head(HeadConfig(hidden_size=128, depth=3, timing="pre", features=PRE_FEATURES), seed=0)
    save_file(head.state_dict(), str(head_path), metadata={"accept_heads": OLD_HEAD})
    profile = SVProfile(x_edges=torch.linspace(0, 1, 21), y_edges=torch.linspace(0, 1, 8), table=torch.rand(20, 7),
                        counts=torch.ones(20, 7), latency=torch.ones(6), batch_sizes=torch.tensor([1, 8, 32]),
                        batch_latency_table=torch.ones(3, 7))
    save_file(profile.tensors(), str(profile_path), metadata={"accept_heads": OLD_PROFILE})

    loaded = load_head(head_path, sampling=Sampling(), rule=rules.Speculative(), verify=False)
    recorded = loaded.metadata
    assert torch.equal(loaded.predict(torch.ones(1, 128), torch.ones(1, 3)), head.predict(torch.ones(1, 128),
                                                                                         torch.ones(1, 3)))
    assert (loaded.threshold, recorded.k_range(9, 9), recorded.mixing_r, recorded.seed) == (None, (1, 20), 1.0, 0)
    assert recorded.build_rule() == rules.Speculative() and recorded.sampling == Sampling()
    assert recorded.head_config == head.config and recorded.draft == "zoo:draft" and recorded.draft_revision is None
    assert recorded.training_data.positions == {"dev": 10561, "train": 142233}
    assert recorded.dev_metrics["val/auroc"] == 0.7926725745201111
    unread = {k: v for k, v in json.loads(OLD_HEAD).items() if k not in ("threshold", "calibration")}
    assert json.dumps(recorded.to_json(), sort_keys=True) == json.dumps(unread, sort_keys=True)

    recorded = load_profile(profile_path, verify=False).metadata
    assert (recorded.bins, recorded.requested_bins, recorded.latency_batches, recorded.k_max) == ((20, 7), (20, 10),
                                                                                                  (1, 8, 32), 6)
    assert recorded.information["dev"].gain_plugin == 0.3864425862324281 and recorded.latency_device.startswith("cpu")
    assert json.dumps(recorded.to_json(), sort_keys=True) == OLD_PROFILE
    older = re.sub(r'"gain_plugin": [0-9.]+, ', "", OLD_PROFILE)
    save_file(profile.tensors(), str(profile_path), metadata={"accept_heads": older})
    recorded = load_profile(profile_path, verify=False).metadata
    train = recorded.information["train"]
    assert train.gain_plugin is None and train.gain == 0.3136019783640686
    assert json.dumps(recorded.to_json(), sort_keys=True) == older
    assert "| dev | 2.481 | 2.184 | 0.2974 | 0.1199 | — |" in render_card({"profile.safetensors": recorded})


def _flip_a_weight_byte(path: Path) -> None:
    """Flip one byte of the tensor data (after the 8-byte length and the JSON header), as a bad disk or copy would."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start + (len(data) - start) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_head_or_profile_with_one_flipped_byte_is_refused_naming_the_file_unless_verify_is_off(tmp_path,
                                                                                                  make_tokenizer):
    tokenizer = make_tokenizer(10)
    head = AcceptanceHead(HeadConfig(hidden_size=8, depth=1))
    path = tmp_path / "head.safetensors"
    save_head(head, path, metadata(tokenizer, head))
    assert load_head(path).loaded == Loaded(str(path), True)  # negative control: the file as written loads, checked
    _flip_a_weight_byte(path)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is corrupt or was edited.*verify=False"):
        load_head(path)
    edited = load_head(path, verify=False)
    assert edited.loaded == Loaded(str(path), False)
    assert not all(torch.equal(a, b) for a, b in zip(edited.state_dict().values(), head.state_dict().values()))

    profile = SVProfile(x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 0.5, 1.0]),
                        table=torch.rand(2, 2), counts=torch.ones(2, 2), latency=torch.tensor([1.0, 1.1]))
    profile_path = tmp_path / "profile.safetensors"
    save_profile(profile, profile_path, metadata(tokenizer, profile))
    load_profile(profile_path)
    _flip_a_weight_byte(profile_path)
    with pytest.raises(ValueError, match="is corrupt or was edited"):
        load_profile(profile_path)
    edited_profile = load_profile(profile_path, verify=False)
    assert edited_profile.bins == (2, 2) and edited_profile.loaded == Loaded(str(profile_path), False)
    assert unverified_files(edited, head, edited_profile, None) == [str(path), str(profile_path)]


def test_a_head_file_that_records_no_sha256_is_refused_with_what_to_do(tmp_path, make_tokenizer):
    head = AcceptanceHead(HeadConfig(hidden_size=8, depth=1))
    path = tmp_path / "head.safetensors"
    save_head(head, path, metadata(make_tokenizer(10), head))
    with safe_open(str(path), framework="pt") as handle:
        header = {key: value for key, value in handle.metadata().items() if key != TENSORS_KEY}
    save_file(head.state_dict(), str(path), metadata=header)  # the document alone, as files written before
    with pytest.raises(ValueError, match="records no sha256 of its tensors.*export the head again"):
        load_head(path)
    assert torch.equal(load_head(path, verify=False).out.weight, head.out.weight)
