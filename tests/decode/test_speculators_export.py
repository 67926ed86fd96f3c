"""A feature draft with EAGLE-3's first layer goes to a speculators checkpoint (what vLLM's eagle3 method reads) and
back: the config keys and tensor names and shapes vLLM reads, the vocabulary map inverting the subset, the same
logits once read back (float32), and one line refusing a draft or checkpoint that disagrees with its target."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from decode.artifacts import export_draft
from decode.artifacts.speculators import (
    SpeculatorsError,
    check_exportable,
    export_speculators,
    load_speculators,
)
from decode.digests import Loaded, loaded
from decode.drafts.feature_model import feature_reads, target_features
from tests.helpers.micro_models import micro_feature_draft, micro_lm

SUBSET = [0, 3, 5, 8, 13, 21, 34, 55, 89, 90, 91, 95]  # draft id i scores target id SUBSET[i]


@pytest.fixture(scope="module")
def target():
    return micro_lm(96, seed=31, hidden=24, layers=4).eval()


def eagle3_draft(target, **kwargs):
    """An EAGLE-3 draft reading the target's layers 1 and 3 over SUBSET, its embeddings the target's."""
    draft = micro_feature_draft(target, seed=32, hidden=24, feature_layers=(1, 3), subset=SUBSET, init=0.3,
                                first_layer="eagle3", **kwargs)
    draft.model.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight)
    return draft


def logits_on_target_features(draft, target, ids: torch.Tensor) -> torch.Tensor:
    """The draft's logits over its subset ``[L - 1, S]`` along ``ids``, each position reading the target's feature of
    the position before it (the first position, which has none, left out)."""
    with torch.no_grad():
        hidden = target(input_ids=ids, output_hidden_states=True).hidden_states
        reads = feature_reads(draft.fuse_features(target_features(hidden, draft.feature_layers)), torch.ones_like(ids))
        return draft(input_ids=ids, features=reads).logits[0, 1:, draft.lm_head.token_ids]


def test_the_checkpoint_has_the_config_vllm_reads(target, tmp_path):
    draft = eagle3_draft(target)
    out = export_speculators(draft, tmp_path / "spec", target=target, k=2, verifier="org/target")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["draft_vocab_size"] == len(SUBSET) and config["target_hidden_size"] == 24
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3]
    assert (config["norm_before_residual"], config["norm_before_fc"], config["fc_norm"], config["norm_output"]) == (
        False, False, False, False)
    layers = config["transformer_layer_config"]
    assert layers["model_type"] == "llama" and layers["num_hidden_layers"] == 1 and layers["hidden_size"] == 24
    assert layers["vocab_size"] == 96 and layers["num_key_value_heads"] == 1 and not layers["tie_word_embeddings"]
    method = config["speculators_config"]["proposal_methods"][0]
    assert method["speculative_tokens"] == 2
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/target"
    assert config["accept_heads"]["weights_sha256"] == export_draft.file_sha256(out / "model.safetensors")


def test_the_tensors_have_speculators_names_and_shapes_and_the_map_inverts_the_subset(target, tmp_path):
    draft = eagle3_draft(target, decoder_layers=2)
    tensors = load_file(str(export_speculators(draft, tmp_path / "spec", target=target) / "model.safetensors"))
    shapes = {name: tuple(value.shape) for name, value in tensors.items()}
    heads = 2 * 12  # attention heads × head width
    assert shapes["fc.weight"] == (24, 2 * 24)
    assert shapes["layers.0.self_attn.q_proj.weight"] == (heads, 2 * 24)  # EAGLE-3's first layer reads 2H
    assert shapes["layers.0.self_attn.k_proj.weight"] == (12, 2 * 24)
    assert shapes["layers.1.self_attn.q_proj.weight"] == (heads, 24)
    assert shapes["layers.0.hidden_norm.weight"] == (24,) and "layers.1.hidden_norm.weight" not in shapes
    assert shapes["norm.weight"] == (24,) and shapes["lm_head.weight"] == (len(SUBSET), 24)
    assert "embed_tokens.weight" not in shapes  # shared with the target
    assert not [name for name in shapes if name.startswith(("model.", "fuse.", "feature_norms."))]
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and t2d.shape == (96,)
    assert (torch.arange(len(SUBSET)) + d2t).tolist() == SUBSET  # vLLM: target id = draft id + d2t[draft id]
    assert t2d.nonzero().flatten().tolist() == SUBSET


@pytest.mark.parametrize("variant", [
    {},
    {"head_rank": 6, "feature_norm": True},
    {"norm_before_residual": True},
    {"norm_output": True, "decoder_layers": 2},
])
def test_a_checkpoint_read_back_gives_the_same_logits(target, tmp_path, variant):
    draft = eagle3_draft(target, **variant)
    out = export_speculators(draft, tmp_path / "spec", target=target)
    back = load_speculators(out, target, dtype=torch.float32)
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(0))
    ours, theirs = logits_on_target_features(draft, target, ids), logits_on_target_features(back, target, ids)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    assert torch.equal(back.lm_head.token_ids, draft.lm_head.token_ids)
    # negative control: another draft's checkpoint does not give these logits
    other = load_speculators(export_speculators(micro_feature_draft(
        target, seed=99, hidden=24, feature_layers=(1, 3), subset=SUBSET, first_layer="eagle3", **variant),
        tmp_path / "other", target=target), target, dtype=torch.float32)
    assert not torch.allclose(ours, logits_on_target_features(other, target, ids), atol=1e-3)


def test_embeddings_unlike_the_targets_travel_with_the_checkpoint(target, tmp_path):
    draft = eagle3_draft(target)
    with torch.no_grad():
        draft.model.embed_tokens.weight.mul_(2)
    out = export_speculators(draft, tmp_path / "spec", target=target)
    assert "embed_tokens.weight" in load_file(str(out / "model.safetensors"))
    back = load_speculators(out, target, dtype=torch.float32)
    assert torch.equal(back.model.embed_tokens.weight, draft.model.embed_tokens.weight)


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_draft_or_checkpoint_disagreeing_with_the_target_is_refused_with_one_line(target, tmp_path):
    draft = eagle3_draft(target)
    shallow = micro_lm(96, seed=33, hidden=24, layers=2)
    with pytest.raises(SpeculatorsError) as error:
        export_speculators(draft, tmp_path / "spec", target=shallow)
    assert "[3]" in one_line(error) and not (tmp_path / "spec").exists()  # nothing half-written
    out = export_speculators(draft, tmp_path / "spec", target=target)
    with pytest.raises(SpeculatorsError) as error:
        load_speculators(out, shallow)
    assert "layers [3]" in one_line(error)
    with pytest.raises(SpeculatorsError) as error:
        load_speculators(out, micro_lm(80, seed=34, hidden=24, layers=4))
    assert "80" in one_line(error) and "96" in str(error.value)
    with pytest.raises(SpeculatorsError) as error:
        load_speculators(out, micro_lm(96, seed=35, hidden=16, layers=4))
    assert "width" in one_line(error)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [3, 1]}))
    with pytest.raises(SpeculatorsError) as error:
        load_speculators(out, target)
    assert "increasing order" in one_line(error)


def test_a_draft_reading_the_final_norms_output_is_refused(target, tmp_path):
    draft = micro_feature_draft(target, seed=36, hidden=24, feature_layers=(2, 4), subset=SUBSET,
                                first_layer="eagle3")
    with pytest.raises(SpeculatorsError) as error:
        export_speculators(draft, tmp_path / "spec", target=target)
    assert "hidden_states[4] is after the final norm" in one_line(error)


def test_this_projects_fc_draft_is_refused_naming_what_to_train(target):
    with pytest.raises(SpeculatorsError) as error:
        check_exportable(micro_feature_draft(target, seed=37, hidden=24, subset=SUBSET))
    assert "--first-layer eagle3" in one_line(error)
    with pytest.raises(SpeculatorsError) as error:
        check_exportable(target)
    assert "not a feature draft" in one_line(error)


def test_a_checkpoint_with_an_unsupported_variant_is_refused(target, tmp_path):
    out = export_speculators(eagle3_draft(target), tmp_path / "spec", target=target)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "norm_before_fc": True}))
    with pytest.raises(SpeculatorsError) as error:
        load_speculators(out, target)
    assert "norm_before_fc" in one_line(error)
    (out / "config.json").write_text(json.dumps({**config, "speculators_model_type": "dflash"}))
    with pytest.raises(SpeculatorsError) as error:
        load_speculators(out, target)
    assert "dflash" in one_line(error)


def test_the_command_exports_checks_the_round_trip_and_refuses_in_one_line(target, tmp_path, capsys):
    target_dir, draft_dir = tmp_path / "target", tmp_path / "draft"
    target.save_pretrained(target_dir)
    eagle3_draft(target).save_pretrained(draft_dir)
    assert export_draft.main([str(draft_dir), "--target", str(target_dir), "--out", str(tmp_path / "spec")]) == 0
    printed = capsys.readouterr().out
    difference = float(printed.split("largest logit difference ")[1].split()[0])
    assert difference < 1e-5
    micro_feature_draft(target, seed=38, hidden=24, subset=SUBSET).save_pretrained(tmp_path / "fc")
    assert export_draft.main([str(tmp_path / "fc"), "--target", str(target_dir), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "--first-layer eagle3" in err[-1] and "Traceback" not in "".join(err)


def test_a_missing_tensor_is_refused(target, tmp_path):
    out = export_speculators(eagle3_draft(target), tmp_path / "spec", target=target)
    tensors = load_file(str(out / "model.safetensors"))
    del tensors["layers.0.hidden_norm.weight"]
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(SpeculatorsError) as error:
        load_speculators(out, target, verify=False)  # edited on purpose: past the weights' sha256
    assert "hidden_norm" in one_line(error)


def test_weights_unlike_those_exported_are_refused_unless_verify_is_off_or_the_checkpoint_records_none(target,
                                                                                                        tmp_path):
    out = export_speculators(eagle3_draft(target), tmp_path / "spec", target=target)
    weights = out / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01  # one bit of the last tensor's bytes
    weights.write_bytes(bytes(data))
    with pytest.raises(SpeculatorsError) as error:
        load_speculators(out, target)
    assert "is corrupt or was edited" in one_line(error) and "verify=False" in str(error.value)
    assert load_speculators(out, target, verify=False).loaded == Loaded(str(weights), False)
    config = json.loads((out / "config.json").read_text())
    del config["accept_heads"]  # as a checkpoint exported elsewhere: nothing recorded to check against
    (out / "config.json").write_text(json.dumps(config))
    assert loaded(load_speculators(out, target)) is None
