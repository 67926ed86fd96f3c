"""Compiled graphs kept once per machine: :class:`GraphStore` (docs/design.md, "Compiled forwards: the rules").

Inductor writes what it compiles (each graph's generated code and its built library) to its cache folder, and with
the weights frozen as plain tensors a later process finds them there and compiles nothing. The store gives each model
and cache length a folder of its own under ``$ACCEPT_HEADS_COMPILED_DIR`` (default ``~/.cache/accept-heads/compiled``),
named by what the graphs depend on (:class:`GraphKey`), with a manifest of its files' sha256 written once the graphs
are built. A folder whose files disagree with its manifest is refused and rebuilt, and a key that changed (other
weights, torch version, CPU capability, dtype, threads or settings) builds anew beside the old one (another process
may still use it), each with one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from weakref import WeakKeyDictionary

import torch
from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
from transformers import PreTrainedModel

from decode.digests import tensors_sha256
from decode.timing import device_name

STORE_ENV = "ACCEPT_HEADS_COMPILED_DIR"
MANIFEST = "manifest.json"
GRAPHS = "inductor"  # the folder inductor compiles into


class CompiledStoreNotice(UserWarning):
    """A one-line notice of the graph store: graphs built (minutes, once per machine), rebuilt, or refused."""


def default_store_dir() -> Path:
    """``$ACCEPT_HEADS_COMPILED_DIR``, else ``~/.cache/accept-heads/compiled``."""
    override = os.environ.get(STORE_ENV)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "accept-heads" / "compiled"


@dataclass(frozen=True)
class GraphKey:
    """What one model's compiled graphs for one cache length depend on: a changed field builds them anew."""

    model: str  # the model's class and where it was loaded from
    weights: str  # sha256 of its parameters and buffers (names, dtypes, shapes, bytes)
    torch: str
    device: str  # the CPU's (or GPU's) name
    capability: str  # the SIMD path torch computes with (AVX512, AVX2, ...) or the GPU's compute capability
    dtype: str
    threads: int
    cache_length: int
    settings: str  # the inductor options the graphs were compiled with
    rows: int = 1  # the batch's rows (BatchSteps); 1 for a decoder's forwards

    def folder(self) -> str:
        """The key's folder name: the model's class, the cache length and a digest of every field."""
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]
        name = re.sub(r"[^A-Za-z0-9]+", "-", self.model.split(" ")[0])
        return f"{name}-{self.cache_length}-{digest}"

    def changes(self, stored: GraphKey) -> list[str]:
        """What differs from ``stored`` (one phrase per field), the weights' digest shortened."""
        def shown(key: GraphKey, name: str) -> str:
            value = getattr(key, name)
            return value[:12] if name == "weights" else str(value)
        return [f"{name} {shown(stored, name)} -> {shown(self, name)}" for name in (f.name for f in fields(self))
                if getattr(self, name) != getattr(stored, name)]


_WEIGHTS: WeakKeyDictionary[PreTrainedModel, str] = WeakKeyDictionary()


def weights_digest(model: PreTrainedModel) -> str:
    """sha256 of ``model``'s parameters and buffers, computed once per model and process."""
    if model not in _WEIGHTS:
        _WEIGHTS[model] = tensors_sha256((*model.named_parameters(), *model.named_buffers()))
    return _WEIGHTS[model]


def graph_key(model: PreTrainedModel, cache_length: int, settings: dict[str, object], rows: int = 1) -> GraphKey:
    """The :class:`GraphKey` of ``model``'s graphs on caches of ``rows`` x ``cache_length`` compiled with
    ``settings``."""
    device = model.device
    capability = (".".join(map(str, torch.cuda.get_device_capability(device))) if device.type == "cuda"
                  else torch.backends.cpu.get_cpu_capability())
    source = getattr(model.config, "_name_or_path", "") or "in memory"
    return GraphKey(model=f"{type(model).__name__} ({source})", weights=weights_digest(model),
                    torch=torch.__version__, device=device_name(), capability=capability,
                    dtype=str(model.dtype).removeprefix("torch."), threads=torch.get_num_threads(),
                    cache_length=cache_length, settings=json.dumps(settings, sort_keys=True, default=str), rows=rows)


def file_digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` by its relative path (inductor's lock files left out)."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and "locks" not in path.relative_to(folder).parts}


class GraphStore:
    """The folders one process compiles models' graphs into and loads them from (see the module docstring)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = default_store_dir() if root is None else root
        self._checked: set[str] = set()  # folders verified (or started afresh) in this process

    def folder(self, key: GraphKey) -> Path:
        """Where ``key``'s graphs live."""
        return self.root / key.folder()

    @contextmanager
    def building(self, key: GraphKey) -> Iterator[None]:
        """Compile inside ``key``'s folder: its stored graphs are checked first (refused and removed, with one line,
        when a file disagrees with the manifest) and a missing key says, in one line, that it is built now and why."""
        folder = self.folder(key)
        if folder.name not in self._checked:
            self._checked.add(folder.name)
            self._check(key, folder)
        (folder / GRAPHS).mkdir(parents=True, exist_ok=True)
        with temporary_cache_dir(str(folder / GRAPHS)):
            yield

    def commit(self, key: GraphKey) -> Path:
        """Write the manifest of ``key``'s folder (its key, each file's sha256, when), atomically; returns its path."""
        folder = self.folder(key)
        (folder / GRAPHS).mkdir(parents=True, exist_ok=True)
        manifest = {"key": asdict(key), "files": file_digests(folder / GRAPHS),
                    "written": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        handle, scratch = tempfile.mkstemp(dir=folder, prefix=".manifest-")
        with os.fdopen(handle, "w") as out:
            json.dump(manifest, out, indent=1)
        os.replace(scratch, folder / MANIFEST)
        return folder / MANIFEST

    def _check(self, key: GraphKey, folder: Path) -> None:
        what = f"{key.model}: compiled graphs for {key.cache_length}-token caches"
        manifest = folder / MANIFEST
        if manifest.exists():
            problem = self._problem(manifest, folder)
            if problem is None:
                return
            shutil.rmtree(folder)
            warnings.warn(f"{what} in {folder} refused ({problem}); rebuilding them",
                          CompiledStoreNotice, stacklevel=5)
            return
        stale = self._stale(key)
        if stale is not None:  # kept: another process here may still use them (other threads, say)
            old, changes = stale
            warnings.warn(f"{what}: the stored ones ({old.parent.name}) differ in {'; '.join(changes)}; building "
                          f"these in {folder} (minutes, once per machine)", CompiledStoreNotice, stacklevel=5)
        else:
            warnings.warn(f"{what}: building them in {folder} (once per machine; later processes load them)",
                          CompiledStoreNotice, stacklevel=5)
        shutil.rmtree(folder, ignore_errors=True)  # files an interrupted build left without a manifest

    @staticmethod
    def _problem(manifest: Path, folder: Path) -> str | None:
        """What is wrong with a stored folder (a file missing or differing from its manifest), or None."""
        try:
            files = json.loads(manifest.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            return f"its manifest is unreadable: {type(error).__name__}"
        for name, digest in files.items():
            path = folder / GRAPHS / name
            if not path.is_file():
                return f"{name} is missing"
            if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
                return f"{name} differs from its sha256 in the manifest"
        return None

    def _stale(self, key: GraphKey) -> tuple[Path, list[str]] | None:
        """The stored manifest of the same model (loaded from the same place), cache length and rows under the key
        nearest to ``key`` (fewest fields changed), and what changed; None for a model built in memory."""
        if key.model.endswith("(in memory)"):
            return None
        found = []
        for manifest in sorted(self.root.glob(f"*/{MANIFEST}")):
            try:
                stored = GraphKey(**json.loads(manifest.read_text())["key"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if (stored.model, stored.cache_length, stored.rows) == (key.model, key.cache_length, key.rows) and stored != key:
                found.append((manifest, key.changes(stored)))
        return min(found, key=lambda pair: len(pair[1]), default=None)
