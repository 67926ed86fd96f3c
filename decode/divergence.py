"""Batched divergences between distributions over the last dimension (natural log).

Terms ``p log x`` are computed as ``p · log(x)`` with a vectorised ``log`` and ``0 · log 0 = 0``
(:func:`_kl_from_logs`), not with ``torch.xlogy``, whose CPU kernel is scalar and took a large share of data
collection's column time (docs/log/figures-from-code-comments.md); each ``log`` is taken
once and shared (:func:`divergences`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def _kl_from_logs(p: Tensor, log_p: Tensor, log_r: Tensor) -> Tensor:
    """``Σ p (log p − log r)`` with ``0 · log 0 = 0``; ``inf`` where ``r = 0 < p``."""
    return torch.where(p > 0, p * (log_p - log_r), 0.0).sum(-1)


def kl(p: Tensor, q: Tensor) -> Tensor:
    """KL(p‖q) = Σ p log(p/q); ``inf`` where q = 0 < p."""
    return _kl_from_logs(p, p.log(), q.log())


def _js_from_logs(p: Tensor, q: Tensor, log_p: Tensor, log_q: Tensor) -> Tensor:
    m = 0.5 * (p + q)
    log_m = m.log()
    return 0.5 * _kl_from_logs(p, log_p, log_m) + 0.5 * _kl_from_logs(q, log_q, log_m)


def js(p: Tensor, q: Tensor) -> Tensor:
    """Jensen–Shannon divergence ½KL(p‖m) + ½KL(q‖m), m = ½(p+q); bounded by ln 2."""
    return _js_from_logs(p, q, p.log(), q.log())


def tv(p: Tensor, q: Tensor) -> Tensor:
    """Total variation ½ Σ |p − q|."""
    return 0.5 * (p - q).abs().sum(-1)


DIVERGENCES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"js": js, "kl": kl, "tv": tv}


def divergences(p: Tensor, q: Tensor) -> dict[str, Tensor]:
    """Every divergence of :data:`DIVERGENCES` for one pair, ``{name: fn(p, q)}`` bit for bit.

    ``log p`` and ``log q`` are taken once for both ``kl`` and ``js``; the operations are otherwise
    exactly those of :func:`kl`, :func:`js` and :func:`tv`.
    """
    log_p, log_q = p.log(), q.log()
    return {"js": _js_from_logs(p, q, log_p, log_q), "kl": _kl_from_logs(p, log_p, log_q), "tv": tv(p, q)}


def divergence(name: str) -> Callable[[Tensor, Tensor], Tensor]:
    """Look up a divergence by name (``js``, ``kl``, ``tv``)."""
    try:
        return DIVERGENCES[name]
    except KeyError:
        raise ValueError(f"unknown divergence {name!r}; valid: {', '.join(DIVERGENCES)}") from None
