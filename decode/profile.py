"""Speculative Verification (DESIGN §3): companion indicators, the (X, Y) profile, goodput length.

The verification length is a stopping time (DESIGN §1 pitfalls): the step from ``L`` to ``L + 1``
candidates uses the full ``α(X, Y)`` of ``y_1..y_L`` and, for ``y_{L+1}``, only its X-row marginal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from decode.batch_costs import table_time
from decode.digests import Loaded
from decode.metadata import ProfileMetadata
from decode.sampling import Sampling


def sv_indicators(q: Tensor, c: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """``X = Σ_v min(q, c)`` and ``Y = min(1, c(y)/q(y))`` for distributions ``[..., V]`` (vectorised)."""
    x = torch.minimum(q, c).sum(-1)
    qy = q.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    cy = c.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    ratio = torch.where(qy > 0, (cy / qy.clamp_min(1e-30)).clamp(max=1.0), torch.ones_like(qy))
    return x, ratio


@dataclass(frozen=True)
class CompanionIndicators:
    """SV indicators of candidates (DESIGN §3), every field ``[...]`` (one value per candidate).

    ``x = Σ_v min(q, c)``; ``y = min(1, c(y)/q(y))``; ``log_ratio = log c(y) − log q(y)``
    unclipped (floored at ``log 1e-30`` per probability), which keeps what the clipping drops.
    """

    x: Tensor
    y: Tensor
    log_ratio: Tensor


def companion_indicators(
    rule_sampling: Sampling, q_logits: Tensor, c_logits: Tensor, candidates: Tensor
) -> CompanionIndicators:
    """The indicators a rule sees at decode time, from raw logits ``[..., V]`` and its candidates ``[...]``.

    ``rule_sampling`` is the rule's own transform (``rule.transform(sampling)``): distributions are
    its :meth:`~decode.sampling.Sampling.feature_probs` (the untempered softmax under greedy, where
    one-hot distributions carry nothing), and ``candidates`` are the rule's own proposals (``argmax q``
    for greedy). Collection stores exactly these, per rule; the SV policy and ``pre`` heads compute
    them here at decode time.
    """
    q = rule_sampling.feature_probs(q_logits)
    c = rule_sampling.feature_probs(c_logits)
    return companion_indicators_from_probs(q, c, candidates)


def companion_indicators_from_probs(q: Tensor, c: Tensor, candidates: Tensor) -> CompanionIndicators:
    """:func:`companion_indicators` from the rule's feature distributions ``q``, ``c`` ``[..., V]``.

    For callers that already hold ``rule_sampling.feature_probs`` of both models (collection
    computes each transform's distributions once for every column).
    """
    x, y = sv_indicators(q, c, candidates)
    qy = q.gather(-1, candidates.unsqueeze(-1)).squeeze(-1)
    cy = c.gather(-1, candidates.unsqueeze(-1)).squeeze(-1)
    log_ratio = cy.clamp_min(1e-30).log() - qy.clamp_min(1e-30).log()
    return CompanionIndicators(x=x, y=y, log_ratio=log_ratio)


def goodput_length(alpha: Tensor, alpha_next: Tensor, latency: Tensor) -> int:
    """Goodput-optimal verification length as a stopping time (DESIGN §3, §1 pitfalls).

    ``alpha[i]`` is candidate ``i+1``'s full ``α`` (from its own ``X, Y``); ``alpha_next[i]`` its
    prediction from information available before it was drawn (the X-row marginal). ``L`` starts at
    1 and grows to ``L + 1`` iff ``goodput(L + 1) > goodput(L)`` with ``goodput(L) = (E[N|L] + 1) /
    latency(L)`` and ``E[N|L+1] = E[N|L] + Π_{i≤L} α_i · alpha_next[L]``: the step to ``L + 1``
    reads full ``α`` of candidates ``≤ L`` only. ``latency[j]`` is the verification time for
    ``L = j + 1`` candidates; lengths beyond the table reuse its last entry.
    """
    k = alpha.shape[0]
    if k == 0:
        return 0
    lat = latency.double().tolist()
    lat += lat[-1:] * (k - len(lat))
    full, ahead = alpha.double().tolist(), alpha_next.double().tolist()
    length, reach, expected = 1, full[0], full[0]  # reach = Π_{i≤L} α_i, expected = E[N|L]
    while length < k and (expected + reach * ahead[length] + 1) / lat[length] > (expected + 1) / lat[length - 1]:
        reach *= full[length]
        expected += reach
        length += 1
    return length


BatchLatency = Callable[[int, int], float]
"""``t_t(B, T)``: target verification time of a batch of ``B`` rows verifying ``T`` candidates in all."""


def joint_goodput_lengths(
    alpha: Sequence[Tensor], alpha_next: Sequence[Tensor], latency: BatchLatency
) -> list[int]:
    """Verification lengths of a batch's rows, chosen jointly (DESIGN §3, batch scheduling).

    Row ``i`` has ``alpha[i][j]``, the full ``α`` of its candidate ``j+1``, and ``alpha_next[i][j]``,
    its prediction before the candidate was drawn (as in :func:`goodput_length`). Every row with a
    candidate starts at ``L_i = 1``; then, while it raises the batch goodput
    ``(Σ_i E[N_i | L_i] + B) / latency(B, Σ_i L_i)``, the candidate with the largest gain in expected
    accepted tokens ``Π_{j≤L_i} α_ij · alpha_next[i][L_i]`` is added (the lowest row on ties). Each
    row's length is a stopping time: whether its ``y_{L+1}`` is verified reads the full ``α`` of
    its candidates ``≤ L`` only, besides other rows' values, which do not depend on ``y_{L+1}``.
    With one row and ``latency(1, L) = table[L − 1]`` this is :func:`goodput_length`.
    """
    rows = len(alpha)
    full = [a.double().tolist() for a in alpha]
    ahead = [a.double().tolist() for a in alpha_next]
    lengths = [min(1, len(a)) for a in full]
    reach = [a[0] if a else 0.0 for a in full]  # Π_{j≤L_i} α_ij
    expected, total = sum(reach), sum(lengths)
    while True:
        gains = [reach[i] * ahead[i][lengths[i]] if lengths[i] < len(full[i]) else -1.0 for i in range(rows)]
        best = max(range(rows), key=lambda i: (gains[i], -i), default=None)
        if best is None or gains[best] < 0:
            break
        if (expected + gains[best] + rows) / latency(rows, total + 1) <= (expected + rows) / latency(rows, total):
            break
        reach[best] *= full[best][lengths[best]]
        expected += reach[best]
        lengths[best] += 1
        total += 1
    return lengths


@dataclass
class SVProfile:
    """Mean target acceptance per (X-bin, Y-bin), with counts and the verification latency table.

    ``x_edges[nx+1]``, ``y_edges[ny+1]``: bin edges (equal-frequency, fitted elsewhere);
    ``table[nx, ny]``: mean acceptance (sparse bins already backed off at fit time);
    ``counts[nx, ny]``; ``latency[Lmax]``: target verification time for ``L = 1..Lmax``;
    optionally ``batch_sizes[nB]`` and ``batch_latency_table[nB, L]``: target forwards of ``B`` rows ×
    ``l`` tokens measured on the device, SV's ``t_t(B, T)`` in a batch (:meth:`batch_latency`).
    """

    x_edges: Tensor
    y_edges: Tensor
    table: Tensor
    counts: Tensor
    latency: Tensor
    batch_sizes: Tensor | None = None
    batch_latency_table: Tensor | None = None
    metadata: ProfileMetadata | None = None  # what its file records (None: made in memory)
    loaded: Loaded | None = None  # its file, and whether its recorded sha256 was checked (decode.load_profile)

    def __post_init__(self) -> None:
        nx, ny = self.bins
        if nx < 1 or ny < 1 or tuple(self.table.shape) != (nx, ny) or tuple(self.counts.shape) != (nx, ny):
            raise ValueError(
                f"profile shapes disagree: x_edges {tuple(self.x_edges.shape)}, y_edges {tuple(self.y_edges.shape)}, "
                f"table {tuple(self.table.shape)}, counts {tuple(self.counts.shape)}"
            )
        if self.latency.numel() < 1:
            raise ValueError("profile latency table is empty")
        if (self.batch_sizes is None) != (self.batch_latency_table is None) or (
                self.batch_sizes is not None and (self.batch_latency_table.dim() != 2
                                                  or self.batch_latency_table.shape[0] != self.batch_sizes.numel()
                                                  or self.batch_latency_table.shape[1] < 1)):
            raise ValueError("a profile's batch latency needs batch_sizes [B] and batch_latency_table [B, L >= 1] "
                             "together")

    def alpha(self, x: Tensor, y: Tensor) -> Tensor:
        """Predicted acceptance for indicator values ``x``, ``y`` (any matching shapes)."""
        ix = torch.bucketize(x.float().cpu(), self.x_edges[1:-1].float(), right=True)
        iy = torch.bucketize(y.float().cpu(), self.y_edges[1:-1].float(), right=True)
        return self.table.float()[ix, iy]

    def alpha_given_x(self, x: Tensor) -> Tensor:
        """Predicted acceptance from ``x`` alone: the X-row mean over Y-bins weighted by ``counts``.

        Needs nothing of the candidate itself, so it may decide whether that candidate is verified.
        Rows without counts fall back to the count-weighted mean of the whole table.
        """
        table, counts = self.table.double(), self.counts.double()
        total = counts.sum()
        overall = (table * counts).sum() / total if total > 0 else table.mean()
        row_counts = counts.sum(-1)
        rows = torch.where(row_counts > 0, (table * counts).sum(-1) / row_counts.clamp_min(1e-30), overall)
        ix = torch.bucketize(x.float().cpu(), self.x_edges[1:-1].float(), right=True)
        return rows.float()[ix]

    def verification_length(self, x: Tensor, y: Tensor) -> int:
        """Goodput-optimal number of drafted candidates to verify, given their ``X``, ``Y`` (shape ``[K]``).

        A stopping time: see :func:`goodput_length` (``Y_{L+1}`` never decides whether ``y_{L+1}``
        is verified).
        """
        return goodput_length(self.alpha(x, y), self.alpha_given_x(x), self.latency)

    def batch_latency(self, batch: int, total: int) -> float:
        """``t_t(B, T)``: seconds of a verification of ``T`` candidates over ``B`` rows (SV's default batch latency).

        With a measured batch table (``batch_sizes``, ``batch_latency_table[b][l - 1]``: a target forward
        of ``batch_sizes[b]`` rows × ``l`` tokens, as :func:`decode.batch_costs.forward_table` measures it)
        each row feeds its last token and its share of the candidates, interpolated as
        :class:`~decode.batch_costs.BatchCosts` does. Without one: the batch-1 table at the rows' mean
        length ``L = ⌈T / B⌉``, i.e. a row costs in a batch what it costs alone (no batch effect; at
        ``B = 1`` the table itself, so a batch of one verifies what ``generate`` does).
        """
        if self.batch_latency_table is not None:
            return table_time(self.batch_sizes.tolist(), self.batch_latency_table.double().tolist(), batch,
                              total + batch)
        table = self.latency.double().tolist()
        return table[min(max(math.ceil(total / batch), 1), len(table)) - 1]

    @property
    def bins(self) -> tuple[int, int]:
        """(X bins, Y bins) of the table."""
        return self.x_edges.numel() - 1, self.y_edges.numel() - 1

    def tensors(self) -> dict[str, Tensor]:
        """The tensors stored in a profile file."""
        return {
            "x_edges": self.x_edges,
            "y_edges": self.y_edges,
            "table": self.table,
            "counts": self.counts,
            "latency": self.latency,
            **({"batch_sizes": self.batch_sizes, "batch_latency_table": self.batch_latency_table}
               if self.batch_sizes is not None else {}),
        }
