"""Compiled graphs kept once per machine: :class:`GraphStore` (docs/design.md, "Compiled forwards: the rules").

Inductor writes what it compiles (each graph's generated code and its built library) to its cache folder, and with
the weights frozen as plain tensors a later process finds them there and compiles nothing. The store gives each model
and cache length a folder of its own under ``$ACCEPT_HEADS_COMPILED_DIR`` (default ``~/.cache/accept-heads/compiled``),
named by what the graphs depend on (:class:`GraphKey`), with a manifest of its files' sha256 written once the graphs
are built. A folder whose files disagree with its manifest is refused and rebuilt, and a key that changed (other
weights, torch version, CPU capability, dtype, threads or settings) builds anew beside the old one (another process
may still use it), each with one line.

A process that finds no valid manifest builds under the key's lock, ``<folder>.lock`` beside the folder, created
atomically and naming its pid, host and start; it holds it until :meth:`GraphStore.commit` has written the manifest
(or the build fails, or the process exits). Another process that finds the key locked by a live process waits (one
line), then loads what was committed or, the lock gone without a manifest, builds it itself; a lock whose process is
gone is taken over (one line) by exactly one of the waiters, which alone removes what the build left. So nothing
removes a folder a live process builds. Once a key is committed, the model's older folders for the same cache length
and rows beyond the newest :data:`KEEP` are removed (one line), those being built skipped; ``python -m
decode.compile`` lists the store, ``--prune`` applies that rule to every model and ``--clear`` empties it. The lock
itself is :mod:`decode.compile.key_lock`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
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

from decode.compile.key_lock import HELD, LockOwner, try_lock, unlock
from decode.digests import tensors_sha256
from decode.timing import device_name

STORE_ENV = "ACCEPT_HEADS_COMPILED_DIR"
MANIFEST = "manifest.json"
GRAPHS = "inductor"  # the folder inductor compiles into
LOCK = ".lock"  # a key's lock file: its folder's name and this, beside the folder
POLL_SECONDS = 0.25  # between looks at a key another process is building
KEEP = 3  # folders kept per model, cache length and rows (the newest manifests)
IN_MEMORY = "(in memory)"  # a model's source when it was not loaded from a path: no two are known to be the same
COMMAND = "python -m decode.compile"  # lists the store, prunes or clears it (decode/compile/__main__.py)


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


def _notice(text: str, stacklevel: int) -> None:
    warnings.warn(text, CompiledStoreNotice, stacklevel=stacklevel + 1)


def _what(key: GraphKey) -> str:
    return f"{key.model}: compiled graphs for {key.cache_length}-token caches"


def lineage(key: GraphKey | None) -> tuple[str, int, int] | None:
    """The model (loaded from one place), cache length and rows whose folders are compared (a changed key's line,
    pruning); None without a key or for a model built in memory."""
    if key is None or key.model.endswith(IN_MEMORY):
        return None
    return key.model, key.cache_length, key.rows


@dataclass(frozen=True)
class Stored:
    """One folder of a store, as its manifest says (``key`` None: no readable manifest)."""

    folder: Path
    key: GraphKey | None
    written: str
    mtime: float  # the manifest's (0 without one)


class GraphStore:
    """The folders one process compiles models' graphs into and loads them from (see the module docstring)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = default_store_dir() if root is None else root
        self._loaded: set[str] = set()  # folders verified (or committed) in this process

    def folder(self, key: GraphKey) -> Path:
        """Where ``key``'s graphs live."""
        return self.root / key.folder()

    def lock_file(self, folder: str) -> Path:
        """The lock file of the folder named ``folder``, beside it (one spelling of it per process: resolved)."""
        return (self.root / f"{folder}{LOCK}").resolve()

    @contextmanager
    def building(self, key: GraphKey) -> Iterator[None]:
        """Compile inside ``key``'s folder: its stored graphs are checked first (refused and removed, with one line,
        when a file disagrees with the manifest), a missing key takes the key's lock and says, in one line, that it is
        built now and why, and a key another live process builds is waited for. Leaving with an error releases it."""
        folder = self.folder(key)
        if folder.name not in self._loaded and self.lock_file(folder.name) not in HELD:
            self._claim(key, folder)
        (folder / GRAPHS).mkdir(parents=True, exist_ok=True)
        try:
            with temporary_cache_dir(str(folder / GRAPHS)):
                yield
        except BaseException:
            self.release(key)  # the build is abandoned: another process may take it up
            raise

    def commit(self, key: GraphKey) -> Path:
        """Write the manifest of ``key``'s folder (its key, each file's sha256, when), atomically, release the key's
        lock and prune the model's older folders; returns the manifest's path."""
        folder = self.folder(key)
        (folder / GRAPHS).mkdir(parents=True, exist_ok=True)
        manifest = {"key": asdict(key), "files": file_digests(folder / GRAPHS),
                    "written": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        handle, scratch = tempfile.mkstemp(dir=folder, prefix=".manifest-")
        with os.fdopen(handle, "w") as out:
            json.dump(manifest, out, indent=1)
        os.replace(scratch, folder / MANIFEST)
        self.release(key)
        self._loaded.add(folder.name)
        removed = self.prune(lineage(key)) if lineage(key) is not None else 0
        if removed:
            _notice(f"{key.model}: removed {removed} older folders of compiled graphs for {key.cache_length}-token "
                    f"caches (the newest {KEEP} kept; {COMMAND} lists and clears the store)", 2)
        return folder / MANIFEST

    def release(self, key: GraphKey) -> None:
        """Give up ``key``'s lock where this process holds it (a build abandoned; :meth:`commit` releases it too)."""
        unlock(self.lock_file(key.folder()))

    def stored(self) -> list[Stored]:
        """Every folder of the store (and every lock without one), by name."""
        if not self.root.is_dir():
            return []
        names = {path.name for path in self.root.iterdir() if path.is_dir()}
        names |= {path.name.removesuffix(LOCK) for path in self.root.glob(f"*{LOCK}")}
        return [self._read(self.root / name) for name in sorted(names)]

    def remove(self, folder: Path) -> bool:
        """Remove ``folder`` (its manifest first, so nobody loads it half removed) and its lock file, under its lock;
        False for a folder a live process (this one too) builds, left alone."""
        lock = self.lock_file(folder.name)
        if lock in HELD or not try_lock(lock)[0]:
            return False
        (folder / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
        unlock(lock)
        self._loaded.discard(folder.name)
        return True

    def prune(self, of: tuple[str, int, int] | None = None) -> int:
        """Remove the folders of one :func:`lineage` ``of`` (every one where None) beyond the newest
        :data:`KEEP` manifests, skipping those a live process builds; returns how many were removed."""
        groups: dict[tuple[str, int, int], list[Stored]] = {}
        for entry in self.stored():
            if (found := lineage(entry.key)) is not None and of in (None, found):
                groups.setdefault(found, []).append(entry)
        old = [entry for group in groups.values()
               for entry in sorted(group, key=lambda entry: entry.mtime, reverse=True)[KEEP:]]
        return sum(self.remove(entry.folder) for entry in old)

    def _read(self, folder: Path) -> Stored:
        try:
            written = (folder / MANIFEST).stat().st_mtime
            manifest = json.loads((folder / MANIFEST).read_text())
            return Stored(folder, GraphKey(**manifest["key"]), str(manifest["written"]), written)
        except (OSError, ValueError, KeyError, TypeError):
            return Stored(folder, None, "", 0.0)

    def _claim(self, key: GraphKey, folder: Path) -> None:
        """Make ``key``'s folder ready: its graphs verified, or this process holding the key's lock with the folder
        ready to build into (:meth:`_start`); while another live process holds it, wait (one line)."""
        self.root.mkdir(parents=True, exist_ok=True)
        waiting = False
        while not self._verified(folder):
            taken, owner = try_lock(self.lock_file(folder.name))
            if taken:
                self._start(key, folder, owner)
                return
            if not waiting:
                _notice(f"{_what(key)}: waiting for {owner} building them in {folder}", 5)
                waiting = True
            time.sleep(POLL_SECONDS)
        self._loaded.add(folder.name)

    def _verified(self, folder: Path) -> bool:
        return (folder / MANIFEST).exists() and self._problem(folder / MANIFEST, folder) is None

    def _start(self, key: GraphKey, folder: Path, gone: LockOwner | None) -> None:
        """Under ``key``'s lock (taken over from ``gone``, one line): load graphs committed meanwhile, else empty the
        folder for a build (refused graphs or the files an interrupted build left), saying so in one line."""
        if gone is not None:
            _notice(f"{_what(key)}: took over from {gone}, which is gone and left its lock "
                    f"{self.lock_file(folder.name)} behind", 6)
        manifest = folder / MANIFEST
        problem = self._problem(manifest, folder) if manifest.exists() else None
        if manifest.exists() and problem is None:  # committed while this process waited for the lock
            self.release(key)
            self._loaded.add(folder.name)
            return
        if problem is not None:
            _notice(f"{_what(key)} in {folder} refused ({problem}); rebuilding them", 6)
        elif (stale := self._stale(key)) is not None:  # kept: another process here may still use them
            old, changes = stale
            _notice(f"{_what(key)}: the stored ones ({old.parent.name}) differ in {'; '.join(changes)}; building "
                    f"these in {folder} (minutes, once per machine)", 6)
        else:
            _notice(f"{_what(key)}: building them in {folder} (once per machine; later processes load them)", 6)
        shutil.rmtree(folder, ignore_errors=True)  # under the lock: nobody else builds into it

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
        if key.model.endswith(IN_MEMORY):
            return None
        found = []
        for manifest in sorted(self.root.glob(f"*/{MANIFEST}")):
            try:
                stored = GraphKey(**json.loads(manifest.read_text())["key"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if lineage(stored) == lineage(key) and stored != key:
                found.append((manifest, key.changes(stored)))
        return min(found, key=lambda pair: len(pair[1]), default=None)
