"""Models on disk with a record of their files' sha256: verified at every load, installed atomically.

What the zoo (:mod:`model_build.zoo.store`) and the real pairs (:mod:`model_build.real.pair_store`) share: one
``from_pretrained`` directory per role (:data:`ROLES`) and a JSON record whose ``files`` maps every file that
matters to its sha256. A :class:`ModelStore` names one kind (its record file, its errors, what its messages call
it) and takes the steps every kind takes: :meth:`~ModelStore.ensure` verifies what is installed or installs under
the directory's lock, :meth:`~ModelStore.rebuild` installs a rebuild only when it meets its realism targets, and
:meth:`~ModelStore.check_files` is the check of every load. The lock and the atomic swap are
:mod:`runtime.install`'s.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from decode.artifacts.gguf import file_sha256
from decode.artifacts.hub import ModelLoadError
from decode.json_types import JSONDict
from runtime.install import directory_lock, replace_dir, staging_dir, write_json

ROLES: tuple[str, ...] = ("target", "draft", "companion")
STUDENT_ROLES: tuple[str, ...] = ("draft", "companion")  # the models a project builds on its target

Record = JSONDict  # a JSON document read from or written to disk
Installed = TypeVar("Installed", bound="InstalledModels")


@dataclass
class InstalledModels:
    """Models on disk: one ``from_pretrained`` directory per role under ``root`` and the record of their files.

    ``action`` says what the call that returned it did: ``verified`` (already installed), ``installed`` or
    ``rebuilt``; ``seconds``, how long it took.
    """

    root: Path
    record: Record = field(repr=False)
    action: str
    seconds: float

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles installed: :data:`ROLES`."""
        return ROLES

    def path(self, role: str) -> Path:
        """Directory of ``role`` (target, draft, companion, ...: :attr:`roles`), loadable with ``from_pretrained``."""
        if role not in self.roles:
            raise ValueError(f"unknown role {role!r}; choose one of {', '.join(self.roles)}")
        return self.root / role


class RealismMiss(ModelLoadError):
    """A rebuild misses a realism target; nothing was installed. ``record`` describes the rebuild."""

    def __init__(self, message: str, record: Record) -> None:
        super().__init__(message)
        self.record = record


def file_hashes(root: Path, names: Iterable[str] | None = None, skip: str | None = None) -> dict[str, str]:
    """sha256 of ``names`` under ``root`` (default: every file below it but those called ``skip``), by relative
    POSIX path."""
    if names is None:
        names = [path.relative_to(root).as_posix() for path in sorted(root.rglob("*"))
                 if path.is_file() and path.name != skip]
    return {name: file_sha256(root / name) for name in names}


def read_record(path: Path) -> Record | None:
    """The JSON record at ``path``, None when there is none (a kind before a maintainer first ships it)."""
    return json.loads(path.read_text()) if path.is_file() else None


@dataclass(frozen=True)
class ModelStore:
    """One kind of installed models: its record file, its errors and what its messages call it."""

    name: str  # what messages call the directory and its files: "zoo" ("cannot write the zoo", "zoo file ...")
    models: str  # what messages call the models: "trio" ("the rebuilt trio misses ...")
    record_file: str  # the record in the directory: zoo.json, pair.json
    env_var: str  # the variable that moves the default directory
    error: type[ModelLoadError]  # raised, in one line, for a directory that cannot be used as it is
    realism_error: type[RealismMiss]  # raised for a rebuild that misses a realism target

    def is_installed(self, root: Path) -> bool:
        """Whether ``root`` holds a complete install (its record is written last)."""
        return (root / self.record_file).is_file()

    def read(self, root: Path, shown: Path, fix: str) -> Record:
        """The record in ``root`` (named ``shown`` in messages), with its ``files``; :attr:`error` ending in ``fix``
        when it is unreadable or incomplete."""
        try:
            record = json.loads((root / self.record_file).read_text())
            record["files"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise self.error(f"{shown / self.record_file} is unreadable or incomplete ({type(error).__name__}); "
                             f"{fix}") from None
        return record

    def check_files(self, root: Path, record: Record, shipped: Record | None, shown: Path, fix: str) -> None:
        """Refuse (:attr:`error` ending in ``fix``) a record that claims to be the ``shipped`` one and is not, and a
        recorded file that is missing or does not match its sha256."""
        if record.get("origin") == "shipped" and record != shipped:
            raise self.error(f"{shown / self.record_file} differs from the shipped {self.models}'s record; {fix}")
        for name, digest in record["files"].items():
            path = root / name
            if not path.is_file():
                raise self.error(f"{self.name} file {shown / name} is missing; {fix}")
            if file_sha256(path) != digest:
                raise self.error(f"{self.name} file {shown / name} does not match its recorded sha256 "
                                 f"(corrupt or modified); {fix}")

    def ensure(self, root: Path, purpose: str, *, reinstall: bool, verify: Callable[[Path, Path], Record],
               install: Callable[[Path], None], make: Callable[[Path, Record, str, float], Installed]) -> Installed:
        """The models in ``root``, verified (``verify(directory, shown_as)``: the record after every check); when
        none are installed, or ``reinstall``, ``install(staging)`` fills a staging directory under the lock, which is
        verified and swapped in. ``make(root, record, action, seconds)`` builds the result."""
        started = time.perf_counter()
        if not reinstall and self.is_installed(root):
            return make(root, verify(root, root), "verified", time.perf_counter() - started)
        self.writable_parent(root)
        with directory_lock(root, purpose):
            if not reinstall and self.is_installed(root):
                return make(root, verify(root, root), "verified", time.perf_counter() - started)
            with staging_dir(root) as staging:
                install(staging)
                record = verify(staging, root)
                replace_dir(staging, root)
        return make(root, record, "installed", time.perf_counter() - started)

    def rebuild(self, root: Path, purpose: str, build: Callable[[Path], tuple[Record, list[str]]], *,
                require_realism: bool, make: Callable[[Path, Record, str, float], Installed],
                ship: Callable[[Path, Record], None] | None = None) -> Installed:
        """``build(staging)`` (the record and the realism targets it misses) installed in ``root`` under the lock;
        a miss raises :attr:`realism_error` and leaves ``root`` as it was, unless ``require_realism`` is off.
        ``ship(staging, record)`` runs before the swap (maintainers: write the build into the package)."""
        started = time.perf_counter()
        self.writable_parent(root)
        with directory_lock(root, purpose):
            with staging_dir(root) as staging:
                record, failures = build(staging)
                if failures and require_realism:
                    raise self.realism_error(
                        f"the rebuilt {self.models} misses {len(failures)} realism target(s) ({'; '.join(failures)}); "
                        f"kept {root} as it was (pass --force to install the rebuild anyway)", record)
                write_json(staging / self.record_file, record)
                if ship is not None:
                    ship(staging, record)
                replace_dir(staging, root)
        return make(root, record, "rebuilt", time.perf_counter() - started)

    def writable_parent(self, root: Path) -> None:
        """Create ``root``'s parent; :attr:`error` when it cannot hold the install."""
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            if not os.access(root.parent, os.W_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as error:
            raise self.error(f"cannot write the {self.name} next to {root} ({error.strerror}); choose a writable "
                             f"directory with --cache-dir or {self.env_var}") from None
