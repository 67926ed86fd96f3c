"""Model loading goes through from_pretrained; unreachable ids give one readable line."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from decode.artifacts.hub import ModelLoadError, load_causal_lm, load_tokenizer, resolve_dtype


def test_unreachable_hub_id_gives_one_line_naming_the_model():
    with pytest.raises(ModelLoadError) as excinfo:
        load_causal_lm("no-such-org/no-such-model-7b")
    message = str(excinfo.value)
    assert "\n" not in message
    assert "no-such-org/no-such-model-7b" in message and "local directory" in message


def test_unreachable_tokenizer_gives_one_line():
    with pytest.raises(ModelLoadError, match="no-such-org/tok"):
        load_tokenizer("no-such-org/tok")


def test_local_directory_loads_through_from_pretrained(tmp_path):
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "m")
    model = load_causal_lm(str(tmp_path / "m"), dtype="float32")
    assert not model.training
    assert model.config.vocab_size == 32


def test_corrupt_local_directory_is_reported(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not a valid model checkpoint"):
        load_causal_lm(str(tmp_path))


def test_dtype_names():
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("auto") == "auto"
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int3")


def test_cli_with_unreachable_hub_id_exits_nonzero_with_one_line(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "data_gen.collect", "models.target.id=no-such-org/no-such-model",
         f"paths.root={tmp_path}"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: cannot load model 'no-such-org/no-such-model'")
    assert "Traceback" not in result.stderr
