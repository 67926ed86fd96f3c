"""The distribution losses a feature draft can train with, per position, from the target's top-k and the draft's
log-probabilities at those tokens (``docs/design.md`` §8, "Training recipe v2").

``p [n, k]``: the target's top-k probabilities (zero where the token is off the draft's subset); ``log_q [n, k]``:
the draft's log-probabilities of the same tokens. ``α = Σ_k min(p_k, q_k)`` is the acceptance the speculative rule
gives (over the top-k, a lower bound of ``1 − TV``). Each loss returns ``[n]``:

* ``kl``: the soft cross-entropy ``−Σ p log q`` (the KL divergence up to the target's entropy: the same gradient);
* ``tv``: ``1 − α``;
* ``neg_log_alpha``: ``−log α``;
* ``lk``: the LK hybrid ``λ · kl + (1 − λ) · tv`` with ``λ = exp(−3α)``, detached (KL while the draft is far off,
  TV once it accepts).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

#: Added under the logarithm of ``α`` so that a draft with no mass on the target's top-k has a finite loss.
ALPHA_FLOOR = 1e-6
#: ``λ = exp(−LK_SHARPNESS · α)`` in the LK hybrid.
LK_SHARPNESS = 3.0


def acceptance(p: Tensor, log_q: Tensor) -> Tensor:
    """``α = Σ_k min(p_k, q_k)`` ``[n]``."""
    return torch.minimum(p, log_q.exp()).sum(-1)


def soft_cross_entropy(p: Tensor, log_q: Tensor) -> Tensor:
    """``−Σ_k p_k log q_k`` ``[n]``."""
    return -(p * log_q).sum(-1)


def total_variation(p: Tensor, log_q: Tensor) -> Tensor:
    """``1 − α`` ``[n]``."""
    return 1 - acceptance(p, log_q)


def negative_log_acceptance(p: Tensor, log_q: Tensor) -> Tensor:
    """``−log α`` ``[n]``."""
    return -(acceptance(p, log_q) + ALPHA_FLOOR).log()


def lk_weight(alpha: Tensor) -> Tensor:
    """The LK hybrid's weight on the KL term, ``exp(−3α)``, detached from the graph ``[n]``."""
    return torch.exp(-LK_SHARPNESS * alpha.detach())


def lk_hybrid(p: Tensor, log_q: Tensor) -> Tensor:
    """``λ · kl + (1 − λ) · tv`` with ``λ = exp(−3α)`` detached ``[n]``."""
    alpha = acceptance(p, log_q)
    weight = lk_weight(alpha)
    return weight * soft_cross_entropy(p, log_q) + (1 - weight) * (1 - alpha)


DISTRIBUTION_LOSSES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "kl": soft_cross_entropy,
    "tv": total_variation,
    "neg_log_alpha": negative_log_acceptance,
    "lk": lk_hybrid,
}


def distribution_loss(name: str) -> Callable[[Tensor, Tensor], Tensor]:
    """The loss called ``name``; an unknown name is one line naming the choices."""
    if name not in DISTRIBUTION_LOSSES:
        raise ValueError(f"unknown feature-draft loss {name!r}; choose one of {sorted(DISTRIBUTION_LOSSES)}")
    return DISTRIBUTION_LOSSES[name]
