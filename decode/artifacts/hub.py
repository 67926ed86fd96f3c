"""Loading models and tokenizers through ``from_pretrained``, with one-line errors.

Any model spec (a hub id, a local directory written by ``save_pretrained``, or a ``.gguf`` file,
converted once by :mod:`decode.artifacts.gguf`) goes through ``AutoModelForCausalLM.from_pretrained``
/ ``AutoTokenizer.from_pretrained``. When the model cannot be found (offline, typo, gated repo) or
read, the caller gets a :class:`ModelLoadError` whose message is one readable line naming the model
and the fix. A directory this project built (a feature draft, with its :data:`BUILD_RECORD`) is checked against the
sha256 its record lists for every file before it loads (``verify=False``: not; ``model.loaded`` records which).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import decode.subset_vocab  # noqa: F401  (registers the reduced-vocabulary draft with the Auto classes)
from decode.artifacts.gguf import GGUFError, converted_dir, file_sha256, is_gguf
from decode.digests import Loaded
from decode.drafts.feature_model import BUILD_RECORD  # importing it registers the feature draft with the Auto classes

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message says which and how to fix it."""


NATIVE_BF16 = "bfloat16-native"  # bfloat16 where the machine computes it natively, else float32


def native_bf16(device: str = "cpu") -> bool:
    """Whether ``device`` (cpu or cuda) computes bfloat16 natively: a CUDA device that supports it, or a CPU with
    AVX-512 BF16 or AMX (elsewhere bf16 on the CPU is emulated, and slower than float32)."""
    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    probes = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    return any(probe is not None and probe() for probe in probes)


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str:
    """Map a config string (``auto``, ``bf16``, ``float32``, ``bfloat16-native`` …) to a ``from_pretrained`` dtype."""
    if dtype is None or dtype == "auto":
        return "auto"
    if dtype == NATIVE_BF16:  # on the device the models run on: the GPU where there is one
        return torch.bfloat16 if native_bf16("cuda" if torch.cuda.is_available() else "cpu") else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        choices = ", ".join(_DTYPES)
        raise ValueError(f"unknown dtype {dtype!r}; choose auto, {NATIVE_BF16} or one of {choices}") from None


def _load_error(kind: str, name_or_path: str, revision: str | None, error: Exception) -> ModelLoadError:
    where = f"{name_or_path}@{revision}" if revision else name_or_path
    if Path(name_or_path).exists():
        hint = f"the directory exists but is not a valid {kind} checkpoint ({type(error).__name__}: {error})"
    else:
        hint = (
            "not a local directory and not reachable on the model hub (offline or unknown id); "
            "download it where there is network (`hf download "
            f"{name_or_path}`) and pass the local directory instead"
        )
    first_line = hint.splitlines()[0] if hint else ""
    return ModelLoadError(f"cannot load {kind} '{where}': {first_line}")


def _local_checkpoint(name_or_path: str) -> str:
    """``name_or_path`` itself, or for a ``.gguf`` file the ``from_pretrained`` directory it converts to."""
    if not is_gguf(name_or_path):
        return name_or_path
    try:
        return str(converted_dir(name_or_path))
    except GGUFError as error:
        raise ModelLoadError(str(error)) from None


def check_recorded_files(directory: Path) -> None:
    """Refuse, in one line, a directory whose files disagree with the sha256 its :data:`BUILD_RECORD` lists."""
    record = directory / BUILD_RECORD
    fix = "build it again, or load it with verify=False to use it as it is"
    try:
        files = json.loads(record.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(f"{record} is unreadable ({type(error).__name__}): {fix}") from None
    for name, digest in sorted(files.items()):
        path = directory / name
        if not path.is_file():
            raise ModelLoadError(f"{path} is missing (listed in {record.name}): {fix}")
        if (actual := file_sha256(path)) != digest:
            raise ModelLoadError(f"{path} is corrupt or was edited: it hashes to {actual[:12]}…, {record.name} "
                                 f"records {digest[:12]}…; {fix}")


def load_causal_lm(
    name_or_path: str,
    *,
    revision: str | None = None,
    dtype: str | torch.dtype | None = "auto",
    device_map: str | dict[str, Any] | None = None,
    verify: bool = True,
) -> PreTrainedModel:
    """Load a causal LM in eval mode via ``AutoModelForCausalLM.from_pretrained``; a directory this project built is
    checked first (:func:`check_recorded_files`; ``verify=False``: not, recorded in ``model.loaded``)."""
    kwargs: dict[str, Any] = {"revision": revision, "dtype": resolve_dtype(dtype)}
    if device_map is not None:
        kwargs["device_map"] = device_map
    path = _local_checkpoint(str(name_or_path))
    directory = Path(path)
    recorded = (directory / BUILD_RECORD).is_file()  # built by this project; a checkpoint from elsewhere has none
    if recorded and verify:
        check_recorded_files(directory)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as error:
        raise _load_error("model", str(name_or_path), revision, error) from error
    if recorded:
        model.loaded = Loaded(str(directory), verify)
    return model.eval()


def load_tokenizer(name_or_path: str, *, revision: str | None = None) -> PreTrainedTokenizerBase:
    """Load a tokenizer via ``AutoTokenizer.from_pretrained``."""
    path = _local_checkpoint(str(name_or_path))
    try:
        return AutoTokenizer.from_pretrained(path, revision=revision)
    except (OSError, ValueError) as error:
        raise _load_error("tokenizer", str(name_or_path), revision, error) from error


def is_hub_id(name: str) -> bool:
    """Whether ``name`` reads as a hub repo id ``org/name`` rather than a local path (an existing path never does)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name.count("/") != 1 or name.endswith(".safetensors") or Path(name).exists():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def hub_file(repo_id: str, filename: str, *, kind: str, revision: str | None = None) -> Path:
    """Local path of ``filename`` from hub repo ``repo_id`` via ``hf_hub_download`` (the HF cache, which is all
    it reads under ``HF_HUB_OFFLINE=1``); a :class:`ModelLoadError` of one line when it cannot be had."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, RemoteEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision))
    except RemoteEntryNotFoundError as error:
        where = f"{repo_id}@{revision}" if revision else repo_id
        raise ModelLoadError(f"cannot load {kind} '{where}': the hub repo has no file {filename}") from error
    except (OSError, ValueError, EntryNotFoundError) as error:
        raise _load_error(kind, repo_id, revision, error) from error


def quiet_hub_logs() -> None:
    """Silence the hub client's retry warnings: command-line tools report one line of their own."""
    from huggingface_hub.utils import logging as hub_logging

    hub_logging.set_verbosity_error()


def tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """SHA-256 of a tokenizer's vocabulary and special tokens: equal hashes, equal token ids."""
    payload = {
        "vocab": sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]),
        "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
    }
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode()).hexdigest()
