"""Head architecture, head / profile files and their validation."""

from __future__ import annotations

import warnings

import pytest
import torch
from safetensors.torch import save_file

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
from decode.artifacts.hub import tokenizer_hash
from decode.head import PRE_FEATURES, head_features


def metadata(tokenizer, rule=None, sampling=None) -> dict:
    return {
        "draft": "micro-draft",
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "rule": (rule or rules.Speculative()).spec(),
        "sampling": (sampling or Sampling()).to_dict(),
    }


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
    save_head(head, path, metadata(tokenizer))
    loaded = load_head(path, draft=wide["draft"], tokenizer=tokenizer, sampling=Sampling(), rule=rules.Speculative())
    assert loaded.config == head.config
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name])
    assert loaded.metadata["rule"] == {"name": "speculative", "params": {}}
    assert loaded.metadata["format_version"] == 1 and "code_version" in loaded.metadata


def test_head_mismatches(tmp_path, wide, make_tokenizer):
    tokenizer = make_tokenizer(96)
    head = AcceptanceHead(HeadConfig(hidden_size=12, depth=1))
    path = tmp_path / "head.safetensors"
    save_head(head, path, metadata(tokenizer, rule=rules.Fuzzy("js", 0.3), sampling=Sampling(temperature=0.7)))
    with pytest.raises(ValueError, match="hidden size 12"):
        load_head(path, draft=wide["draft"])
    with pytest.raises(ValueError, match="tokenizer hash"):
        load_head(path, tokenizer=make_tokenizer(95))
    with pytest.raises(ValueError, match=r"rule .*fuzzy.* but the decoder uses .*speculative"):
        load_head(path, rule=rules.Speculative())
    with pytest.warns(UserWarning, match="sampled under"):
        load_head(path, sampling=Sampling())
    greedy_data = tmp_path / "greedy.safetensors"  # a greedy-rule head fitted on greedily generated data ...
    save_head(head, greedy_data, metadata(tokenizer, rule=rules.Greedy(), sampling=Sampling(temperature=0.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_head(greedy_data, sampling=Sampling(temperature=1.0))  # ... matches greedy decoding at any T
    sampled_data = tmp_path / "sampled.safetensors"  # ... but one fitted on T = 1 responses does not
    save_head(head, sampled_data, metadata(tokenizer, rule=rules.Greedy(), sampling=Sampling(temperature=1.0)))
    with pytest.warns(UserWarning, match="sampled under"):
        load_head(sampled_data, sampling=Sampling(temperature=1.0))
    with pytest.raises(ValueError, match="lacks"):
        save_head(head, tmp_path / "bad.safetensors", {"draft": "x"})
    right = AcceptanceHead(HeadConfig(hidden_size=wide["draft"].config.hidden_size))
    save_head(right, path, metadata(tokenizer, rule=rules.Fuzzy("js", 0.3)))
    with pytest.raises(ValueError, match="rule"):
        SpeculativeDecoder(wide["target"], wide["draft"], rule=rules.Speculative(),
                           policy=policies.Head(load_head(path), threshold=0.5))


def test_every_door_checks_a_head_against_the_draft_it_reads(tmp_path, wide, make_tokenizer):
    path = tmp_path / "head.safetensors"
    save_head(AcceptanceHead(HeadConfig(hidden_size=16)), path, metadata(make_tokenizer(96)))  # the draft's 16
    policy = policies.Head(load_head(path), threshold=0.5)
    SpeculativeDecoder(wide["target"], wide["draft"], rule=rules.Speculative(), policy=policy)
    refused = r"expects draft hidden size 16 \(draft 'micro-draft'\) but the given draft has 32"
    with pytest.raises(ValueError, match=refused):
        load_head(path, draft=wide["target"])
    with pytest.raises(ValueError, match=refused):
        SpeculativeDecoder(wide["draft"], wide["target"], rule=rules.Speculative(), policy=policy)
    ensemble = tmp_path / "ensemble.safetensors"
    save_head(AcceptanceHead(HeadConfig(hidden_size=16)), ensemble,
              metadata(make_tokenizer(96), rule=rules.Ensemble("weighted", weight=0.5)))
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
    save_profile(profile, path, {**metadata(tokenizer), "companion": "micro-companion"})
    loaded = load_profile(path, tokenizer=tokenizer, rule=rules.Speculative())
    for name, tensor in profile.tensors().items():
        assert torch.equal(tensor, loaded.tensors()[name])
    assert loaded.metadata["companion"] == "micro-companion" and loaded.metadata["bins"] == [2, 3]
    with pytest.raises(ValueError, match="holds a 'sv_profile' artifact"):
        load_head(path)
    with pytest.raises(ValueError, match="rule"):
        load_profile(path, rule=rules.Greedy())


# --- model cards and hub ids --------------------------------------------------------------------------------


def trained_metadata(tokenizer, draft: str = "micro-org/micro-draft") -> dict:
    """Metadata shaped like accept_heads.export.head_metadata's: models, data, dev metrics, calibration."""
    return {
        **metadata(tokenizer, rule=rules.Fuzzy("js", 0.3), sampling=Sampling(temperature=0.7)),
        "draft": draft, "draft_revision": None, "target": "micro-org/micro-target", "companion": None,
        "training_data": {"manifest_sha256": "ab" * 32, "data_dir": "/runs/tiny/data", "exp_name": "tiny",
                          "positions": {"train": 900, "dev": 120}},
        "seed": 7,
        "dev_metrics": {"val/binary_kl": 0.4123, "val/auroc": 0.7311, "val/ece": 0.021},
        "threshold": 0.3, "k_min": 1, "k_max": 8,
        "calibration": {"cost": {"t_draft": 0.0236, "t_target": 0.112}, "prompts": 4, "max_new_tokens": 32,
                        "table": [{"threshold": 0.1, "generated": 128, "throughput": 40.5},
                                  {"threshold": 0.3, "generated": 128, "throughput": 52.25}]},
    }


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
    save_head(head, export / "head.safetensors", trained_metadata(tokenizer))
    assert sorted(p.name for p in export.iterdir()) == ["README.md", "head.safetensors"]  # a hub repo, nothing stray
    card = (export / "README.md").read_text()
    meta = front_matter(card)
    assert meta["library_name"] == "accept-heads" and meta["base_model"] == "micro-org/micro-draft"
    assert {"speculative-decoding", "acceptance-head", "rule-fuzzy"} <= set(meta["tags"])
    assert "SpecDec++ acceptance head, pre-verification timing" in card
    assert "`fuzzy` (divergence='js', threshold=0.3)" in card
    assert "Sampling(temperature=0.7, top_k=None, top_p=None)" in card
    assert "**h = 0.3**" in card and "| **0.3** | **128** | **52.25** |" in card and "| 0.1 | 128 | 40.5 |" in card
    assert "`micro-org/micro-target`" in card and "ab" * 32 in card and "dev 120, train 900" in card
    assert "| `val/auroc` | 0.7311 |" in card and "no 95 % interval" in card
    assert 'decode.load_head("<org>/<name>", draft=draft, tokenizer=tokenizer)' in card
    assert "policy = decode.policies.Head(head)  # at the h = 0.3 it records, 1 to 8 candidates" in card

    profile = SVProfile(x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 1.0]),
                        table=torch.rand(2, 1), counts=torch.ones(2, 1), latency=torch.tensor([1.0, 1.2]))
    save_profile(profile, export / "profile.safetensors",
                 {**metadata(tokenizer), "information": {"dev": {"h_a": 0.9, "gain": 0.1}}, "k_max": 2})
    card = (export / "README.md").read_text()
    assert "## `head.safetensors`" in card and "## `profile.safetensors`: SV profile" in card
    assert "policies.SV(profile, k=2)" in card and "rule-speculative" in front_matter(card)["tags"]
    assert front_matter(card)["base_model"] == "micro-org/micro-draft"  # "micro-draft" is no hub id


def test_card_without_hub_draft_and_hand_written_readme(tmp_path, make_tokenizer):
    tokenizer = make_tokenizer(10)
    save_head(random_head(HeadConfig(hidden_size=8), seed=1), tmp_path / "head.safetensors", metadata(tokenizer))
    card = (tmp_path / "README.md").read_text()
    assert "base_model" not in front_matter(card) and "No threshold was chosen" in card
    assert "Head(head, threshold=0.5)  # no h recorded: choose it on your prompts" in card
    (tmp_path / "README.md").write_text("# my own notes\n")
    with pytest.warns(UserWarning, match="not generated by decode.artifacts.serialization"):
        save_head(random_head(HeadConfig(hidden_size=8), seed=2), tmp_path / "head.safetensors", metadata(tokenizer))
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
    save_head(saved, export / "head.safetensors", trained_metadata(tokenizer))
    profile = SVProfile(x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 1.0]),
                        table=torch.tensor([[0.2], [0.8]]), counts=torch.ones(2, 1), latency=torch.tensor([1.0]))
    save_profile(profile, export / "profile.safetensors", metadata(tokenizer))
    commit = hub_cache(offline_cache, "micro-org/micro-head",
                       {name: export / name for name in ("head.safetensors", "profile.safetensors", "README.md")})

    loaded = load_head("micro-org/micro-head", tokenizer=tokenizer, sampling=Sampling(temperature=0.7),
                       rule=rules.Fuzzy("js", 0.3))
    pinned = load_head("micro-org/micro-head", revision=commit)
    hidden, features = torch.randn(16, 8), torch.randn(16, 3)
    expected = saved.predict(hidden, features)
    assert torch.equal(loaded.predict(hidden, features), expected)
    assert torch.equal(pinned.predict(hidden, features), expected)
    assert not torch.equal(random_head(config, seed=4).predict(hidden, features), expected)  # the check can fail
    assert loaded.metadata["threshold"] == 0.3
    assert torch.equal(load_profile("micro-org/micro-head").table, profile.table)
    assert torch.equal(load_head(export).predict(hidden, features), expected)  # the local directory form


def test_a_head_policy_stops_at_the_h_and_k_range_its_head_records_unless_given_others(tmp_path, make_tokenizer):
    tokenizer = make_tokenizer(10)
    saved = random_head(HeadConfig(hidden_size=8), seed=1)
    save_head(saved, tmp_path / "head.safetensors", trained_metadata(tokenizer))
    head = load_head(tmp_path)
    recorded = policies.Head(head)
    assert (recorded.threshold, recorded.k_min, recorded.k_max) == (0.3, 1, 8)
    told = policies.Head(head, threshold=0.7, k_max=4)
    assert (told.threshold, told.k_min, told.k_max) == (0.7, 1, 4)
    bare = AcceptanceHead(HeadConfig(hidden_size=8))  # nothing recorded: h must be given, the range is 1..20
    with pytest.raises(ValueError, match=r"records no stop threshold h .*: pass Head\(head, threshold=h\)"):
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
