"""The zoo on disk: install the shipped trio, verify it at every load, or replace it by a rebuild.

The project ships one reference build of the tiny-code trio (``data_gen/zoo/tiny-code/``: three
``from_pretrained`` directories and ``zoo.json``, which records the version and the sha256 of every
file). :func:`ensure_zoo` copies it into the cache directory on first use — no training, the same
bytes on every machine — and checks every file against its recorded sha256 whenever it is loaded.
:func:`rebuild_zoo` trains the recipe instead (:mod:`data_gen.zoo.build`) and installs the result
only when it meets every realism target, or when asked to.

Writes are atomic (a finished staging directory is renamed into place) and serialised by a file
lock next to the cache; a process that waits for the lock says so, and for whom.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_gen.install import directory_lock, replace_dir, staging_dir, write_json
from data_gen.zoo.paths import INSTALL_COMMAND, METADATA_FILE, ZOO_VERSION, default_cache_dir, is_built
from decode.artifacts.hub import ModelLoadError

from .build import build_into, file_hashes
from .realism import Realism
from .recipe import ROLES, ZooRecipe

SHIPPED_DIR = Path(__file__).resolve().parent / "tiny-code"


class ZooError(ModelLoadError):
    """A zoo directory cannot be used as it is; the message names the problem and the fix."""


class ZooRealismError(ZooError):
    """A rebuild misses a realism target; nothing was installed. ``metadata`` describes the rebuild."""

    def __init__(self, message: str, metadata: dict[str, Any]) -> None:
        super().__init__(message)
        self.metadata = metadata


@dataclass
class Zoo:
    """A zoo on disk: one ``from_pretrained`` directory per role plus ``zoo.json``.

    ``action`` says what this call did: ``verified`` (already installed), ``installed`` (the shipped
    trio copied in) or ``rebuilt``.
    """

    root: Path
    metadata: dict[str, Any] = field(repr=False)
    action: str
    seconds: float

    def path(self, role: str) -> Path:
        """Directory of ``role`` (target, draft or companion), loadable with ``from_pretrained``."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
        return self.root / role

    @property
    def realism(self) -> Realism:
        """The realism figures recorded when this trio was built."""
        return Realism.from_dict(self.metadata["realism"])


def shipped_metadata() -> dict[str, Any] | None:
    """``zoo.json`` of the shipped trio (None only before a maintainer first ships one)."""
    path = SHIPPED_DIR / METADATA_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def ensure_zoo(cache_dir: str | Path | None = None, *, reinstall: bool = False) -> Zoo:
    """The zoo in ``cache_dir`` (default: :func:`data_gen.zoo.paths.default_cache_dir`), verified file by file.

    An empty directory gets the shipped trio (copied, not trained). ``reinstall`` replaces whatever
    the directory holds (an old version, a rebuild, a corrupt file) with the shipped trio. Raises
    :class:`ZooError` (one line: the problem and the command that fixes it) when the directory holds
    another zoo version or a file that does not match its recorded sha256.
    """
    started = time.perf_counter()
    root = _root(cache_dir)
    if not reinstall and is_built(root):
        return Zoo(root, verify(root), "verified", time.perf_counter() - started)
    _writable_parent(root)
    with directory_lock(root, "installing the shipped tiny-code trio"):
        if not reinstall and is_built(root):
            return Zoo(root, verify(root), "verified", time.perf_counter() - started)
        if shipped_metadata() is None:
            raise ZooError(f"this installation of accept-heads has no shipped trio in {SHIPPED_DIR}; "
                           "reinstall the package (pip install -e .)")
        with staging_dir(root) as staging:
            shutil.copytree(SHIPPED_DIR, staging, dirs_exist_ok=True)
            metadata = verify(staging, shown_as=root)
            replace_dir(staging, root)
    return Zoo(root, metadata, "installed", time.perf_counter() - started)


def rebuild_zoo(cache_dir: str | Path | None = None, recipe: ZooRecipe | None = None, *,
                require_realism: bool = True, ship: bool = False) -> Zoo:
    """Train ``recipe`` (default: the shipped trio's) and install the result in ``cache_dir``.

    A rebuild that misses a realism target raises :class:`ZooRealismError` and leaves the directory
    as it was, unless ``require_realism`` is off (``--force``; the tests' reduced recipes). ``ship``
    records it as the shipped reference build (maintainers write it into :data:`SHIPPED_DIR`).
    """
    started = time.perf_counter()
    root = _root(cache_dir)
    recipe = recipe or ZooRecipe()
    _writable_parent(root)
    with directory_lock(root, "rebuilding the tiny-code trio"):
        with staging_dir(root) as staging:
            metadata = build_into(staging, recipe)
            if ship:
                metadata["origin"] = "shipped"
            else:
                shipped = shipped_metadata()
                metadata["matches_shipped"] = shipped is not None and metadata["files"] == shipped["files"]
            failures = Realism.from_dict(metadata["realism"]).failures()
            if failures and require_realism:
                raise ZooRealismError(
                    f"the rebuilt trio misses {len(failures)} realism target(s) ({'; '.join(failures)}); "
                    f"kept {root} as it was (pass --force to install the rebuild anyway)", metadata)
            write_json(staging / METADATA_FILE, metadata)
            replace_dir(staging, root)
    return Zoo(root, metadata, "rebuilt", time.perf_counter() - started)


def verify(root: Path, shown_as: Path | None = None) -> dict[str, Any]:
    """``zoo.json`` of the zoo in ``root`` after checking its version and every file's sha256."""
    shown = shown_as or root
    fix = _fix_command(shown)
    try:
        metadata = json.loads((root / METADATA_FILE).read_text())
        recorded = metadata["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ZooError(f"{shown / METADATA_FILE} is unreadable or incomplete ({type(error).__name__}); "
                       f"restore the shipped trio with `{fix}`") from None
    if metadata.get("zoo_version") != ZOO_VERSION:
        raise ZooError(f"the zoo in {shown} is version {metadata.get('zoo_version')!r}, this code uses "
                       f"{ZOO_VERSION!r}; replace it with the shipped trio: `{fix}`")
    if metadata.get("origin") == "shipped" and metadata != shipped_metadata():
        raise ZooError(f"{shown / METADATA_FILE} differs from the shipped trio's record; restore it with `{fix}`")
    actual = file_hashes(root)
    for name, digest in recorded.items():
        if name not in actual:
            raise ZooError(f"zoo file {shown / name} is missing; restore the shipped trio with `{fix}`")
        if actual[name] != digest:
            raise ZooError(f"zoo file {shown / name} does not match its recorded sha256 (corrupt or modified); "
                           f"restore the shipped trio with `{fix}`")
    return metadata


def _root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def _writable_parent(root: Path) -> None:
    """Create ``root``'s parent; :class:`ZooError` when it cannot hold the zoo."""
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(root.parent, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as error:
        raise ZooError(f"cannot write the zoo next to {root} ({error.strerror}); choose a writable directory with "
                       f"--cache-dir or ACCEPT_HEADS_ZOO_DIR") from None


def _fix_command(root: Path) -> str:
    where = "" if root == default_cache_dir() else f" --cache-dir {root}"
    return f"{INSTALL_COMMAND} --reinstall{where}"
