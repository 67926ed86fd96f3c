"""sha256 of tensors: what an artifact's header records of its weights and what keys a model's compiled graphs."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

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
