"""A lock file per key of the graph store (:mod:`decode.compile.store`): taken atomically (``O_CREAT | O_EXCL``), naming
its process's pid, host and start (which tells a reused pid apart), held until the build is committed or abandoned
or the process exits, and taken over from a process that is gone by exactly one of the processes waiting for it."""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

UNREADABLE_AFTER = 5.0  # seconds after which a lock file that names no process counts as abandoned


def process_status(pid: int) -> list[str] | None:
    """The fields of Linux's ``/proc/<pid>/stat`` after the process's name (its state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks after boot; tells a reused pid apart), or None where unknown."""
    status = process_status(pid)
    return None if status is None else status[19]  # field 22


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user counts; a zombie, ended, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    status = process_status(pid)
    return status is None or status[0] != "Z"


@dataclass(frozen=True)
class LockOwner:
    """Whom a lock file names (``pid`` None: nobody readable, a file being written or left half-written) and the
    file's stamp (inode, mtime, bytes), which tells it apart from a later lock of the same name."""

    pid: int | None
    host: str
    start: str | None
    age: float  # seconds since the file was written
    stamp: tuple[int, int, bytes]

    def live(self) -> bool:
        """Whether the lock is held: its process runs (or runs on another host, which this one cannot tell), or an
        unreadable file is younger than :data:`UNREADABLE_AFTER`."""
        if self.pid is None:
            return self.age < UNREADABLE_AFTER
        if self.host != socket.gethostname():
            return True
        start = process_start(self.pid)
        return pid_alive(self.pid) and (self.start is None or start is None or start == self.start)

    def mine(self) -> bool:
        """Whether the lock names this process."""
        return (self.pid, self.host, self.start) == (os.getpid(), socket.gethostname(), process_start(os.getpid()))

    def __str__(self) -> str:
        if self.pid is None:
            return f"a process whose lock file is unreadable ({self.age:.0f} s old)"
        return f"process {self.pid}" + ("" if self.host == socket.gethostname() else f" on {self.host}")


HELD: set[Path] = set()  # the lock files this process holds
os.register_at_fork(after_in_child=HELD.clear)  # a forked child holds none of its parent's locks


def stamp(path: Path) -> tuple[int, int, bytes]:
    """``path``'s inode, mtime (ns) and bytes."""
    status = path.stat()
    return status.st_ino, status.st_mtime_ns, path.read_bytes()


def read_lock(path: Path) -> LockOwner | None:
    """Whom the lock file ``path`` names; None when there is none."""
    try:
        found = stamp(path)
    except FileNotFoundError:
        return None
    age = time.time() - found[1] / 1e9
    try:
        record = json.loads(found[2])
        return LockOwner(int(record["pid"]), str(record["host"]), record.get("start"), age, found)
    except (ValueError, KeyError, TypeError):
        return LockOwner(None, "", None, age, found)


def try_lock(path: Path) -> tuple[bool, LockOwner | None]:
    """Take the lock file ``path`` without waiting: ``(True, None)`` when it was free (or this process holds it),
    ``(True, owner)`` when taken over from a gone ``owner``, ``(False, owner)`` while a live ``owner`` holds it."""
    gone = None
    while path not in HELD:
        try:
            handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = read_lock(path)
            if owner is not None and owner.live():
                return False, owner
            if owner is not None and set_aside(path, owner):
                gone = owner
            continue
        with os.fdopen(handle, "w") as out:
            json.dump({"pid": os.getpid(), "host": socket.gethostname(), "start": process_start(os.getpid())}, out)
        HELD.add(path)
    return True, gone


def set_aside(path: Path, owner: LockOwner) -> bool:
    """Remove the abandoned lock file ``path`` of ``owner`` atomically: True for the one process whose rename moved
    that very file; another, which moved a lock taken meanwhile, puts it back."""
    aside = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False  # another waiter moved it first
    won = stamp(aside) == owner.stamp
    if not won:
        with suppress(FileExistsError):  # a third lock taken in between stays; the moved one's owner keeps building
            os.link(aside, path)
    aside.unlink()
    return won


def unlock(path: Path) -> None:
    """Give up the lock file ``path`` where this process holds it (its file removed where it still names it)."""
    if path not in HELD:
        return
    HELD.discard(path)
    owner = read_lock(path)
    if owner is not None and owner.mine():
        path.unlink(missing_ok=True)


@atexit.register
def _unlock_all() -> None:
    """Give up the locks a process leaves holding (a build it never committed)."""
    for path in list(HELD):
        unlock(path)
