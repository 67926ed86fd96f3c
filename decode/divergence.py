"""Batched divergences between distributions over the last dimension (natural log)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def kl(p: Tensor, q: Tensor) -> Tensor:
    """KL(p‖q) = Σ p log(p/q); ``inf`` where q = 0 < p."""
    return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(-1)


def js(p: Tensor, q: Tensor) -> Tensor:
    """Jensen–Shannon divergence ½KL(p‖m) + ½KL(q‖m), m = ½(p+q); bounded by ln 2."""
    m = 0.5 * (p + q)
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def tv(p: Tensor, q: Tensor) -> Tensor:
    """Total variation ½ Σ |p − q|."""
    return 0.5 * (p - q).abs().sum(-1)


DIVERGENCES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"js": js, "kl": kl, "tv": tv}


def divergence(name: str) -> Callable[[Tensor, Tensor], Tensor]:
    """Look up a divergence by name (``js``, ``kl``, ``tv``)."""
    try:
        return DIVERGENCES[name]
    except KeyError:
        raise ValueError(f"unknown divergence {name!r}; valid: {', '.join(DIVERGENCES)}") from None
