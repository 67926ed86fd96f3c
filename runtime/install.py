"""Installing a directory atomically: a lock next to it, a staging directory renamed into place; where installs go.

How the zoo and the real pairs install (:mod:`model_build.model_store`) and the shipped prompts are written, and
the default cache directory of each kind (:func:`cache_dir`; the measured machine costs keep theirs there too). A
finished staging directory replaces the old one in two renames, so a killed install leaves either the
old directory or the new one, never half of one; the lock serialises installers, and a process that
waits for it says so, and for whom.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from decode.json_types import JSONDict


def write_json(path: Path, data: JSONDict) -> None:
    """``data`` as indented JSON."""
    path.write_text(json.dumps(data, indent=2) + "\n")


@contextmanager
def staging_dir(root: Path) -> Iterator[Path]:
    """A fresh temp directory next to ``root`` (removed on exit unless renamed into place)."""
    for stale in root.parent.glob(f".{root.name}.tmp-*"):
        shutil.rmtree(stale)  # left by a process that was killed; we hold the lock
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def replace_dir(staging: Path, root: Path) -> None:
    """Put ``staging`` in ``root``'s place (the old directory, if any, is removed after the swap)."""
    if root.exists():
        retired = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-old-", dir=root.parent))
        os.replace(root, retired / root.name)
        os.rename(staging, root)
        shutil.rmtree(retired)
    else:
        os.rename(staging, root)


@contextmanager
def directory_lock(root: Path, purpose: str, *, stream: TextIO | None = None) -> Iterator[None]:
    """Hold the lock of ``root`` (``.<name>.lock`` next to it); if another process holds it, say so and wait.

    The holder writes its pid, what it does and since when into the lock file, so that a waiting
    process can name it in the one line it prints to ``stream`` (default: stderr).
    """
    path = root.parent / f".{root.name}.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            print(f"waiting for the lock {path}, held by {holder}", file=stream or sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} ({purpose}, since {time.strftime('%H:%M:%S')})")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


def cache_dir(env_var: str, *default: str) -> Path:
    """``$env_var`` if set, else ``~/.cache/accept-heads/<default...>``: where a kind installs by default."""
    override = os.environ.get(env_var)
    return Path(override).expanduser() if override else Path.home().joinpath(".cache", "accept-heads", *default)
