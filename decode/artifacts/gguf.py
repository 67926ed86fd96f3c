"""GGUF files as a model source: converted once into a ``from_pretrained`` directory keyed by the file's sha256.

transformers reads a GGUF checkpoint (``from_pretrained(..., gguf_file=...)``) by de-quantizing every
tensor, which takes seconds to minutes, and the model it returns refuses ``save_pretrained``. So the
first load of a ``.gguf`` file de-quantizes it into a plain safetensors checkpoint (config without
the GGUF quantization record, tokenizer with its chat template) under
``$ACCEPT_HEADS_GGUF_DIR`` (default ``~/.cache/accept-heads/gguf``) in a directory named by the
file's sha256; every later load of the same bytes, under any name, is a plain ``from_pretrained``
of that directory. The conversion is written to a staging directory and renamed into place, so a
killed conversion leaves nothing that looks complete.

Three failures get one line naming the fix (:class:`GGUFError`): the ``gguf`` package missing, a file
that is not a complete GGUF (corrupt or truncated), and an architecture transformers cannot
de-quantize.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

SUFFIX = ".gguf"
ENV_VAR = "ACCEPT_HEADS_GGUF_DIR"
RECORD_FILE = "gguf.json"  # written last: a directory without it holds no complete conversion
MAGIC = b"GGUF"


class GGUFError(RuntimeError):
    """A GGUF file cannot be converted; the message is one line naming the problem and the fix."""


def is_gguf(name_or_path: str | os.PathLike[str]) -> bool:
    """Whether a model spec names a GGUF file (by its suffix)."""
    return str(name_or_path).lower().endswith(SUFFIX)


def default_cache_dir() -> Path:
    """``$ACCEPT_HEADS_GGUF_DIR`` if set, else ``~/.cache/accept-heads/gguf``."""
    override = os.environ.get(ENV_VAR)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "accept-heads" / "gguf"


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def converted_dir(path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The ``from_pretrained`` directory of the GGUF file ``path``, converting it on first use.

    Raises :class:`GGUFError` (one line) when the file is missing, not a complete GGUF file, of an
    architecture transformers cannot de-quantize, or when the ``gguf`` package is not installed.
    """
    source = Path(path).expanduser()
    if not source.is_file():
        raise GGUFError(f"cannot load model '{source}': no such GGUF file; check the path")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    digest = file_sha256(source)
    target = root / digest
    if (target / RECORD_FILE).is_file():
        return target
    _check_readable(source)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}.tmp-", dir=root))
    try:
        started = time.perf_counter()
        architecture = _convert(source, staging)
        record = {"source": source.name, "sha256": digest, "bytes": source.stat().st_size,
                  "architecture": architecture, "seconds": round(time.perf_counter() - started, 1)}
        (staging / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / RECORD_FILE).is_file():  # not a concurrent conversion that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def conversion_record(directory: Path) -> dict[str, object]:
    """What :func:`converted_dir` recorded about a conversion (source name, sha256, architecture, seconds)."""
    return json.loads((directory / RECORD_FILE).read_text())


def _check_readable(source: Path) -> None:
    """One-line errors for a missing ``gguf`` package, a file that is not a whole GGUF, an unsupported architecture."""
    if importlib.util.find_spec("gguf") is None:
        raise GGUFError(f"cannot load model '{source}': reading GGUF files needs the `gguf` package; "
                        "install it with `pip install 'gguf>=0.10'`")
    with open(source, "rb") as handle:
        if handle.read(len(MAGIC)) != MAGIC:
            raise GGUFError(_corrupt(source, "it does not start with the GGUF magic bytes"))
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES, load_gguf_checkpoint

    try:
        load_gguf_checkpoint(str(source), return_tensors=False)
    except ValueError as error:
        message = str(error)
        if "architecture" in message and "not supported" in message:
            architecture = message.split("architecture", 1)[1].split("is not supported", 1)[0].strip()
            raise GGUFError(
                f"cannot load model '{source}': transformers cannot de-quantize GGUF architecture '{architecture}' "
                f"(it reads {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); convert the original checkpoint "
                "with its own tools, or use a safetensors checkpoint of the model"
            ) from None
        raise GGUFError(_corrupt(source, f"its tensors cannot be read ({message.splitlines()[0]})")) from None
    except (OSError, IndexError, KeyError, EOFError) as error:
        raise GGUFError(_corrupt(source, f"its header cannot be read ({type(error).__name__})")) from None


def _corrupt(source: Path, why: str) -> str:
    return (f"cannot load model '{source}': not a complete GGUF file, {why}: the file is corrupt or truncated; "
            "download it again")


def _convert(source: Path, staging: Path) -> str:
    """De-quantize ``source`` into a plain float32 checkpoint with its tokenizer in ``staging``; its model type."""
    loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the tensors are de-quantized: the checkpoint is a plain one
    with torch.device("meta"):
        plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(staging)
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    tokenizer.save_pretrained(staging)
    return str(config.model_type)
