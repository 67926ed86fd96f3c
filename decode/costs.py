"""The cost model of DESIGN §5: modelled time of a generation from its call counts and verified lengths."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike

from decode.json_types import JSONDict


class CallCounts(Protocol):
    """What the cost model reads of a generation's :class:`~decode.stats.DecodeStats` (which imports this module)."""

    target_calls: int
    draft_calls: int
    companion_calls: int
    verified_per_round: list[int]


@dataclass(frozen=True)
class LatencyShape:
    """Target verification time for ``L`` candidates relative to ``L = 1``: ``shape(L)``.

    Read from ``values`` (linear interpolation for a fractional ``L``). A round that verifies no
    candidate (the last token of a budget; the target alone) counts ``shape(1) = 1``; beyond the
    table the shape grows linearly with the table's mean slope (never decreasing: a measured table
    can dip by noise). The default is flat.
    """

    values: tuple[float, ...] = (1.0,)  # [L_max]: latency(L) / latency(1) for L = 1..L_max

    def __post_init__(self) -> None:
        if not self.values or abs(self.values[0] - 1.0) > 1e-9:
            raise ValueError(f"a latency shape starts with 1.0 (L = 1), got {self.values}")

    @property
    def flat(self) -> bool:
        """Whether every target call costs the same whatever its length."""
        return all(v == 1.0 for v in self.values)

    def __call__(self, lengths: ArrayLike) -> np.ndarray:
        """``shape(L)`` for (possibly fractional) verified lengths ``L``."""
        table = np.asarray(self.values, dtype=float)
        top = len(table)
        lengths = np.maximum(np.asarray(lengths, dtype=float), 1.0)
        slope = max(0.0, (table[-1] - table[0]) / (top - 1)) if top > 1 else 0.0
        inside = np.interp(lengths, np.arange(1, top + 1), table)
        return np.where(lengths > top, table[-1] + slope * (lengths - top), inside)

    def units(self, rounds_by_length: Sequence[int]) -> float:
        """``Σ_r shape(L_r)`` from the number of rounds per verified length (index ``L``)."""
        counts = np.asarray(rounds_by_length, dtype=float)
        return float(counts @ self(np.arange(len(counts))))

    def mean_units(self, target_calls: ArrayLike, verified: ArrayLike) -> np.ndarray:
        """``N_t·shape(verified / N_t)``: for runs that record only their total verified length (HF, SE)."""
        calls = np.asarray(target_calls, dtype=float)
        mean = np.divide(np.asarray(verified, dtype=float), calls, out=np.zeros_like(calls), where=calls > 0)
        return calls * self(mean)


@dataclass(frozen=True)
class CostModel:
    """``T ≈ t_d·N_d + t_c·N_c + t_t·Σ_r shape(L_r)`` (DESIGN §5), ``L_r`` the candidates verified in round r."""

    t_draft: float  # seconds per draft call
    t_target: float  # seconds per target call verifying one candidate
    t_companion: float  # seconds per companion call
    latency: LatencyShape = LatencyShape()
    #: Seconds per token of the target decoding alone (a forward over one new token); None: ``t_target``.
    #: What a speed-up "× target alone" divides by: pricing it at ``t_target`` (a call that verifies a
    #: candidate, so reads two new tokens) would flatter every method by ``t_target / t_alone``.
    t_target_alone: float | None = None

    @property
    def target_alone(self) -> float:
        """Seconds per token of the target alone (:attr:`t_target_alone`, else ``t_target``)."""
        return self.t_target if self.t_target_alone is None else self.t_target_alone

    def times(self, draft_calls: ArrayLike, companion_calls: ArrayLike, verification_units: ArrayLike) -> np.ndarray:
        """Modelled seconds of many runs at once (``verification_units``: their ``Σ_r shape(L_r)``)."""
        return (self.t_draft * np.asarray(draft_calls, dtype=float)
                + self.t_companion * np.asarray(companion_calls, dtype=float)
                + self.t_target * np.asarray(verification_units, dtype=float))

    def time(self, stats: CallCounts) -> float:
        """Modelled seconds of one generation (from its ``verified_per_round`` unless the shape is flat)."""
        if self.latency.flat:
            units = float(stats.target_calls)
        elif len(stats.verified_per_round) == stats.target_calls:
            units = self.latency.units(np.bincount(np.asarray(stats.verified_per_round, dtype=np.int64)))
        else:
            raise ValueError(f"{stats.target_calls} target calls but {len(stats.verified_per_round)} verified "
                             "lengths: a latency shape needs the length of every round")
        return float(self.times(stats.draft_calls, stats.companion_calls, units))

    def to_dict(self) -> JSONDict:
        """JSON-ready fields (results metadata)."""
        return {"t_draft": self.t_draft, "t_target": self.t_target, "t_companion": self.t_companion,
                "t_target_alone": self.target_alone, "latency_shape": list(self.latency.values)}
