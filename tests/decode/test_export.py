"""Head architecture, head / profile files and their validation."""

from __future__ import annotations

import warnings

import pytest
import torch
from safetensors.torch import save_file

from decode import (
    AcceptanceHead, HeadConfig, Sampling, SpeculativeDecoder, SVProfile, load_head, load_profile, policies, rules,
    save_head, save_profile,
)
from decode.head import PRE_FEATURES, head_features
from decode.hub import tokenizer_hash


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
        SpeculativeDecoder(wide["target"], wide["draft"], rule=rules.Speculative(), policy=policies.Head(load_head(path)))


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
