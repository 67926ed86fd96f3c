"""The cost model of DESIGN §5: modelled time of a generation from its call counts and verified lengths."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
    source_key: str | None
    source_calls: int
    source_updates: int


@dataclass(frozen=True)
class SourcePrice:
    """What an acceptance source's own compute costs (DESIGN §5): seconds per ``P̂`` it estimates (a head's forward
    with its features) and per verified round it folds (an online fit's update)."""

    estimate: float = 0.0  # seconds per estimate
    update: float = 0.0  # seconds per verified round folded

    def seconds(self, calls: ArrayLike, updates: ArrayLike) -> np.ndarray:
        """The seconds of ``calls`` estimates and ``updates`` folded rounds."""
        return self.estimate * np.asarray(calls, dtype=float) + self.update * np.asarray(updates, dtype=float)


#: A source whose compute is not priced: none (fixed K), or a bound whose reads are hindsight.
FREE = SourcePrice()


def price_of(prices: Mapping[str, SourcePrice], key: str | None) -> SourcePrice:
    """The price of the source with ``key`` in ``prices`` (None: no source, free; no prices: every source free; a
    key missing from prices it has is an error)."""
    if key is None or not prices:
        return FREE
    if key not in prices:
        raise ValueError(f"no price for acceptance source {key!r} (the cost model prices {', '.join(prices)}): "
                         "measure its prices with the sources decoded")
    return prices[key]


def source_seconds(prices: Mapping[str, SourcePrice], keys: Sequence[str | None], calls: ArrayLike,
                   updates: ArrayLike) -> np.ndarray:
    """Modelled seconds of many runs' sources: run ``j``'s ``calls[j]`` estimates and ``updates[j]`` folded rounds at
    the price of ``keys[j]`` (:func:`price_of`)."""
    estimate = np.array([price_of(prices, key).estimate for key in keys], dtype=float)
    update = np.array([price_of(prices, key).update for key in keys], dtype=float)
    return estimate * np.asarray(calls, dtype=float) + update * np.asarray(updates, dtype=float)


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
    """``T ≈ t_d·N_d + t_c·N_c + t_t·Σ_r shape(L_r) + t_e·N_e + t_u·N_u`` (DESIGN §5): ``L_r`` the candidates verified
    in round r, ``N_e`` / ``N_u`` the estimates and folded rounds of the policy's acceptance source at its price.

    ``sources`` prices each source by its key (:attr:`~decode.policies.sources.AcceptanceSource.price_key`); a model
    without any prices every source free, one with some refuses a key it lacks.
    """

    t_draft: float  # seconds per draft call
    t_target: float  # seconds per target call verifying one candidate
    t_companion: float  # seconds per companion call
    latency: LatencyShape = LatencyShape()
    #: Seconds per token of the target decoding alone (a forward over one new token); None: ``t_target``.
    #: What a speed-up "× target alone" divides by: pricing it at ``t_target`` (a call that verifies a
    #: candidate, so reads two new tokens) would flatter every method by ``t_target / t_alone``.
    t_target_alone: float | None = None
    sources: tuple[tuple[str, SourcePrice], ...] = ()  # (price key, its price), by key

    def with_sources(self, prices: Mapping[str, SourcePrice]) -> CostModel:
        """This model pricing each source key of ``prices`` (and only those)."""
        return replace(self, sources=tuple(sorted(prices.items())))

    def price(self, key: str | None) -> SourcePrice:
        """The price of the source with ``key`` (:func:`price_of` its :attr:`sources`)."""
        return price_of(dict(self.sources), key)

    @property
    def target_alone(self) -> float:
        """Seconds per token of the target alone (:attr:`t_target_alone`, else ``t_target``)."""
        return self.t_target if self.t_target_alone is None else self.t_target_alone

    def times(self, draft_calls: ArrayLike, companion_calls: ArrayLike, verification_units: ArrayLike,
              source_seconds: ArrayLike = 0.0) -> np.ndarray:
        """Modelled seconds of many runs at once (``verification_units``: their ``Σ_r shape(L_r)``;
        ``source_seconds``: their sources' seconds, :func:`source_seconds`)."""
        return (self.t_draft * np.asarray(draft_calls, dtype=float)
                + self.t_companion * np.asarray(companion_calls, dtype=float)
                + self.t_target * np.asarray(verification_units, dtype=float)
                + np.asarray(source_seconds, dtype=float))

    def time(self, stats: CallCounts) -> float:
        """Modelled seconds of one generation (from its ``verified_per_round`` unless the shape is flat)."""
        if self.latency.flat:
            units = float(stats.target_calls)
        elif len(stats.verified_per_round) == stats.target_calls:
            units = self.latency.units(np.bincount(np.asarray(stats.verified_per_round, dtype=np.int64)))
        else:
            raise ValueError(f"{stats.target_calls} target calls but {len(stats.verified_per_round)} verified "
                             "lengths: a latency shape needs the length of every round")
        source = self.price(stats.source_key).seconds(stats.source_calls, stats.source_updates)
        return float(self.times(stats.draft_calls, stats.companion_calls, units, source))

    def to_dict(self) -> JSONDict:
        """JSON-ready fields (results metadata)."""
        return {"t_draft": self.t_draft, "t_target": self.t_target, "t_companion": self.t_companion,
                "t_target_alone": self.target_alone, "latency_shape": list(self.latency.values),
                "sources": {key: {"estimate": price.estimate, "update": price.update} for key, price in self.sources}}

    @classmethod
    def from_dict(cls, data: JSONDict) -> CostModel:
        """Inverse of :meth:`to_dict` (the target alone as recorded: :attr:`target_alone`)."""
        sources = tuple(sorted((key, SourcePrice(**price)) for key, price in data["sources"].items()))
        return cls(data["t_draft"], data["t_target"], data["t_companion"], LatencyShape(tuple(data["latency_shape"])),
                   t_target_alone=data["t_target_alone"], sources=sources)
