"""Ensemble functions ``r = E(l_1, …, l_n)`` over the next-token logits of n models (DESIGN §4).

* ``weighted`` (probability level): ``r = Σ_i w_i p_i`` with ``p_i`` the *transformed*
  distribution of model ``i`` (temperature, top-k, top-p applied to each member), ``w_i ≥ 0``,
  ``Σ w_i = 1``. Under greedy decoding ``r`` is the one-hot argmax of ``Σ_i w_i softmax(l_i)``.
* ``contrastive`` (logit level): one *expert* ``e`` (default: the last model) and amateurs
  ``i ≠ e`` with coefficients ``μ_i``: ``r = transform(l_e − Σ_{i≠e} μ_i l_i)``. The transform acts
  on the combined logits, so greedy is its argmax. A token an amateur cannot score (a reduced
  vocabulary's fill logit, :mod:`decode.subset_vocab`; at or below :data:`MASKED_LOGIT`) counts at
  that amateur's lowest logit of the row: as unlikely as its least likely token, not infinitely
  unlikely, which would subtract ``−∞`` and put all of ``r`` on the tokens the draft never proposes.

This is the one definition of the ensemble distribution: the two-model rule
:class:`decode.rules.Ensemble` (``weighted`` with ``weights=(λ, 1−λ)``, ``contrastive`` with expert
``p`` and ``μ``, for models ``[q, p]``) computes its ``r`` here (see :meth:`decode.rules.Ensemble.function`
and :meth:`decode.rules.Ensemble.from_function`). :data:`DEFAULT_MU` and :data:`DEFAULT_WEIGHT` are
the project-wide defaults.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from decode.sampling import Sampling, one_hot_argmax

#: A logit at or below this marks a token its model cannot score (a reduced vocabulary's fill).
MASKED_LOGIT = -1e30
#: Default contrastive coefficient ``μ`` of every amateur.
DEFAULT_MU = 0.1
#: Default weight ``λ`` of the proposer ``q`` in the two-model weighted ensemble ``λ q + (1−λ) p``.
DEFAULT_WEIGHT = 0.5


class EnsembleFn:
    """An n-model ensemble function; ``weights=None`` means uniform, a scalar ``mu`` applies to every amateur."""

    KINDS = ("weighted", "contrastive")

    def __init__(
        self,
        kind: str = "weighted",
        weights: Sequence[float] | None = None,
        mu: float | Sequence[float] | None = None,
        expert: int = -1,
    ) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"unknown ensemble kind {kind!r}; valid: {', '.join(self.KINDS)}")
        if kind == "weighted" and mu is not None:
            raise ValueError("EnsembleFn(kind='weighted') takes weights=[w_1, ..., w_n], not mu")
        if kind == "contrastive" and weights is not None:
            raise ValueError("EnsembleFn(kind='contrastive') takes mu (and expert), not weights")
        self.kind = kind
        self.weights = None if weights is None else tuple(float(w) for w in weights)
        if kind == "contrastive":
            mu = DEFAULT_MU if mu is None else mu
            self.mu: float | tuple[float, ...] | None = (
                float(mu) if isinstance(mu, (int, float)) else tuple(float(m) for m in mu)
            )
        else:
            self.mu = None
        self.expert = int(expert)

    def check(self, n: int) -> None:
        """Raise ``ValueError`` unless the function is defined for ``n`` models."""
        if n < 2:
            raise ValueError(f"an ensemble needs at least 2 models, got {n}")
        if self.kind == "weighted":
            if self.weights is None:
                return
            if len(self.weights) != n:
                raise ValueError(f"weighted ensemble of {n} models needs {n} weights, got {len(self.weights)}")
            if any(w < 0 for w in self.weights) or not math.isclose(sum(self.weights), 1.0, abs_tol=1e-6):
                raise ValueError(f"ensemble weights must be >= 0 and sum to 1, got {self.weights}")
            return
        if not -n <= self.expert < n:
            raise ValueError(f"expert index {self.expert} out of range for {n} models")
        if isinstance(self.mu, tuple) and len(self.mu) != n - 1:
            raise ValueError(f"contrastive ensemble of {n} models needs {n - 1} mu values (one per amateur)")

    def coefficients(self, n: int) -> list[float]:
        """Per-model weights (weighted) or logit coefficients (contrastive: 1 for the expert, −μ_i else)."""
        self.check(n)
        if self.kind == "weighted":
            return list(self.weights) if self.weights is not None else [1.0 / n] * n
        expert = self.expert % n
        mus = iter(self.mu if isinstance(self.mu, tuple) else [self.mu] * (n - 1))
        return [1.0 if i == expert else -next(mus) for i in range(n)]

    def probs(self, logits: Tensor, sampling: Sampling) -> Tensor:
        """``r`` from stacked raw logits ``[n, ..., V]`` (float32, post-transform, one-hot when greedy)."""
        coef = self.coefficients(logits.shape[0])
        logits = logits.float()
        if self.kind == "contrastive":
            expert = self.expert % logits.shape[0]
            members = [member if i == expert else scored_floor(member) for i, member in enumerate(logits)]
            return sampling.probs(_combine(coef, torch.stack(members)))
        if sampling.greedy:
            return one_hot_argmax(_combine(coef, logits.softmax(-1)))
        return _combine(coef, sampling.probs(logits))

    def spec(self) -> dict[str, Any]:
        """JSON-ready description."""
        if self.kind == "weighted":
            return {"kind": "weighted", "weights": self.weights}
        return {"kind": "contrastive", "mu": self.mu, "expert": self.expert}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.spec().items())
        return f"EnsembleFn({args})"


def scored_floor(logits: Tensor) -> Tensor:
    """``logits [..., V]`` with each masked token's (:data:`MASKED_LOGIT`) raised to its row's lowest scored one."""
    masked = logits <= MASKED_LOGIT
    floor = logits.masked_fill(masked, math.inf).amin(-1, keepdim=True)
    return torch.where(masked, floor, logits)


def _combine(coef: list[float], stacked: Tensor) -> Tensor:
    """``Σ_i coef[i] · stacked[i]`` with Python-float coefficients (no host-to-device copy)."""
    total = coef[0] * stacked[0]
    for c, member in zip(coef[1:], stacked[1:]):
        total = total + c * member
    return total
