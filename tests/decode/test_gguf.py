"""GGUF files as a model source: a micro Llama written with the ``gguf`` package's writer loads to the same logits,
converts once, and every failure is one line."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from decode.artifacts import gguf as gguf_source
from decode.artifacts.hub import ModelLoadError, load_causal_lm, load_tokenizer
from tests.helpers.gguf_files import write_gguf

pytest.importorskip("gguf")


@pytest.fixture
def micro_gguf(micro_trio: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(gguf_source.ENV_VAR, str(tmp_path / "gguf-cache"))
    model = LlamaForCausalLM.from_pretrained(micro_trio["target"])
    return write_gguf(model, micro_trio["target"], tmp_path / "micro.gguf")


def test_a_gguf_file_loads_to_the_logits_of_the_model_it_was_written_from(micro_trio, micro_gguf):
    original = LlamaForCausalLM.from_pretrained(micro_trio["target"]).eval()
    loaded = load_causal_lm(str(micro_gguf), dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 40, 77, 200, 3]])
    with torch.no_grad():
        expected, got = original(ids).logits, loaded(ids).logits
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
    converted, written = load_tokenizer(str(micro_gguf)), load_tokenizer(str(micro_trio["target"]))
    assert converted(text)["input_ids"] == written(text)["input_ids"]


def test_the_conversion_is_cached_by_sha256_and_reused(micro_gguf, tmp_path, monkeypatch):
    first = gguf_source.converted_dir(micro_gguf)
    assert first.name == gguf_source.file_sha256(micro_gguf)
    assert gguf_source.conversion_record(first)["source"] == "micro.gguf"
    renamed = shutil.copy(micro_gguf, tmp_path / "same-bytes.gguf")

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_source, "_convert", no_conversion)
    assert gguf_source.converted_dir(renamed) == first  # the same bytes under another name
    load_causal_lm(str(micro_gguf))  # a plain from_pretrained of the cached directory


def test_a_conversion_without_the_gguf_package_is_one_line(micro_gguf, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    with pytest.raises(ModelLoadError) as error:
        load_causal_lm(str(micro_gguf))
    assert str(error.value) == (f"cannot load model '{micro_gguf}': reading GGUF files needs the `gguf` package; "
                                "install it with `pip install 'gguf>=0.10'`")


@pytest.mark.parametrize("keep", [0.3, 0.9])
def test_a_truncated_gguf_file_is_one_line(micro_gguf, tmp_path, keep):
    data = micro_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError) as error:
        load_causal_lm(str(cut))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"cannot load model '{cut}': not a complete GGUF file, its ")
    assert message.endswith(": the file is corrupt or truncated; download it again")
    assert not (gguf_source.default_cache_dir() / gguf_source.file_sha256(cut)).exists()  # nothing looks converted


def test_a_file_that_is_not_gguf_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_source.ENV_VAR, str(tmp_path / "gguf-cache"))
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(ModelLoadError) as error:
        load_causal_lm(str(bogus))
    assert str(error.value) == (f"cannot load model '{bogus}': not a complete GGUF file, it does not start with the "
                                "GGUF magic bytes: the file is corrupt or truncated; download it again")


def test_an_architecture_transformers_cannot_dequantize_is_one_line(micro_trio, tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_source.ENV_VAR, str(tmp_path / "gguf-cache"))
    model = LlamaForCausalLM.from_pretrained(micro_trio["target"])
    path = write_gguf(model, micro_trio["target"], tmp_path / "rwkv.gguf", architecture="rwkv6")
    with pytest.raises(ModelLoadError) as error:
        load_causal_lm(str(path))
    message = str(error.value)
    assert message.startswith(f"cannot load model '{path}': transformers cannot de-quantize GGUF architecture 'rwkv6' "
                              "(it reads ")
    assert message.endswith("); convert the original checkpoint with its own tools, or use a safetensors checkpoint of "
                            "the model")
    assert "llama" in message and "\n" not in message


def test_a_missing_gguf_file_is_one_line(tmp_path):
    with pytest.raises(ModelLoadError) as error:
        load_causal_lm(str(tmp_path / "absent.gguf"))
    assert str(error.value) == f"cannot load model '{tmp_path / 'absent.gguf'}': no such GGUF file; check the path"

