"""A loss for the stop a head drives (``docs/design.md`` §2, "A loss for the stop").

Every run of ``K`` consecutive labelled candidates of a training row is a round: its ``i``-th candidate is the entry
``i − 1`` places later, read at depth ``min(i, D)`` (a feature draft's labels; ``D = 1`` for a plain draft's, whose
candidates are labelled along the target's prefix). A soft goodput stop chooses the round's length ``k`` with weights
``w_k = softmax_k(log(Ê(k) / c(k)) / τ)`` from the head's estimates (``Ê(k) = 1 + Σ_{i≤k} Π_{j≤i} P̂_j``, ``c(k)`` the
priced cost of drafting ``k`` and verifying them); the rounds then yield ``E(k)`` from their true acceptances ``a``.
The loss is ``−log(Σ_r Σ_k w_rk E_r(k) / Σ_r Σ_k w_rk c(k))``: differentiable through ``P̂`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from decode.costs import LatencyShape


@dataclass(frozen=True)
class RoundCosts:
    """Priced costs of a round, in target calls that verify one candidate."""

    draft: float  # one draft step
    verify: LatencyShape  # T(L) / T(1)

    def of_lengths(self, k_max: int) -> Tensor:
        """``[k_max]``: ``c(k) = k·draft + T(k) / T(1)`` for ``k = 1 .. k_max``."""
        lengths = torch.arange(1, k_max + 1, dtype=torch.float64)
        return lengths * self.draft + torch.from_numpy(self.verify(lengths.numpy()))


def round_starts(rows: Tensor, positions: Tensor, k: int) -> Tensor:
    """``[R, k]`` entry indices of every round of ``k`` consecutive positions of one row, from entries ``[M]`` listed
    row by row in increasing position (a round never crosses a row's end or a gap)."""
    count = rows.numel() - k + 1
    if count < 1:
        return torch.empty(0, k, dtype=torch.long, device=rows.device)
    index = torch.arange(count, device=rows.device)[:, None] + torch.arange(k, device=rows.device)
    same_row = (rows[index] == rows[index[:, :1]]).all(1)
    consecutive = (positions[index] - positions[index[:, :1]] == torch.arange(k, device=rows.device)).all(1)
    return index[same_row & consecutive]


def round_values(values: Tensor, index: Tensor) -> Tensor:
    """``[R, k]``: ``values [M, D]`` (or ``[M]``) along each round, the ``i``-th candidate at depth ``min(i, D)``."""
    if values.ndim == 1:
        values = values[:, None]
    depth = torch.arange(index.shape[1], device=index.device).clamp_max(values.shape[1] - 1)
    return values[index, depth]


def soft_goodput(estimates: Tensor, acceptance: Tensor, costs: Tensor, temperature: float) -> Tensor:
    """The goodput (tokens per priced cost) a soft goodput stop reaches: ``estimates`` and true ``acceptance``
    ``[R, K]`` per round, ``costs [K]`` of rounds of length ``1 .. K`` (module docstring)."""
    costs = costs.to(estimates)
    expected = 1 + estimates.cumprod(-1).cumsum(-1)  # Ê(k)
    weights = torch.softmax((expected / costs).log() / temperature, dim=-1)
    realised = 1 + acceptance.to(estimates).cumprod(-1).cumsum(-1)  # E(k)
    return (weights * realised).sum() / (weights * costs).sum()


@dataclass(frozen=True)
class GoodputObjective:
    """``−log`` :func:`soft_goodput` over a batch's rounds of ``k`` candidates (DESIGN §2)."""

    costs: RoundCosts
    k: int
    temperature: float

    def __call__(self, probabilities: Tensor, labels: Tensor, rows: Tensor, positions: Tensor) -> Tensor | None:
        """The loss from acceptance ``probabilities`` and soft ``labels`` ``[M(, D)]`` (NaN: no round reaches it) of
        entries ``(rows, positions) [M]``; None when the batch holds no whole round."""
        index = round_starts(rows, positions, self.k)
        estimates, acceptance = round_values(probabilities, index), round_values(labels, index)
        whole = ~acceptance.isnan().any(1)
        if not whole.any():
            return None
        goodput = soft_goodput(estimates[whole], acceptance[whole], self.costs.of_lengths(self.k), self.temperature)
        return -goodput.log()
