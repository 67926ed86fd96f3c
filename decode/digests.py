"""sha256 of tensors (what an artifact's header records of its weights and what keys a model's compiled graphs), and
the record of where a loaded artifact came from and whether its sha256 was checked."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import torch


def tensors_sha256(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over ``(name, tensor)`` pairs in the order given: each one's name, dtype, shape and bytes (a file's
    tensors in name order; a model's parameters and buffers, :func:`decode.compile.store.weights_digest`)."""
    digest = hashlib.sha256()
    for name, tensor in named:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy())  # the bytes in place, not a copy
    return digest.hexdigest()


@dataclass(frozen=True)
class Loaded:
    """Where an artifact (a head, an SV profile, a model directory) was read from, and whether the sha256 it records
    was checked on the way in (False: loaded with ``verify=False``, an artifact edited on purpose)."""

    file: str
    verified: bool


def loaded(artifact: object) -> Loaded | None:
    """The :class:`Loaded` record a loader set as ``artifact.loaded`` (None: made in memory, or read elsewhere)."""
    return getattr(artifact, "loaded", None)


def unverified_files(*artifacts: object) -> list[str]:
    """The files of ``artifacts`` (None skipped) that were loaded without checking their sha256, in order."""
    return [record.file for record in map(loaded, artifacts) if record is not None and not record.verified]
