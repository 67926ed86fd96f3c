"""Giving freed heap memory back to the system between and inside long phases."""

from __future__ import annotations

import ctypes


def release_freed_memory() -> None:
    """Give the heap's freed pages back to the system (glibc's ``malloc_trim``; elsewhere nothing to do).

    The build's phases each allocate and free gigabytes of temporaries (KV caches, ``[B, L, V]`` logits);
    glibc keeps freed pages for reuse, and the next phase's differently sized allocations do not reuse
    them, so without a trim between phases the process holds several times its live data.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
