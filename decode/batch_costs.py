"""Measured costs of batched forwards: the cost model of DESIGN §5 with a batch axis.

In a batch, one draft call feeds one token to each of ``B`` rows and one verification feeds every
row its candidates, ``T`` in all; what those calls cost depends on ``B`` and ``T`` and on the
device (a GPU verifies many tokens for the price of one until it is compute-bound; a CPU pays
nearly per token). :class:`BatchCosts` holds a table measured on the current device by
:func:`measure_batch_costs` and interpolates it; :class:`~decode.policies.GoodputHead` reads it to
stop each row by the batch's marginal cost, and its :meth:`BatchCosts.verify_time` is a
``t_t(B, T)`` for :class:`~decode.policies.SV`'s joint verification lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from decode.costs import CostModel, LatencyShape
from decode.timing import forward_seconds, random_ids


@dataclass(frozen=True)
class BatchCosts:
    """Seconds of one batched forward, measured at a grid of batch sizes.

    ``draft[b]``: a draft forward of ``batches[b]`` rows, one token each; ``target[b][l - 1]``: a
    target forward of ``batches[b]`` rows feeding ``l`` tokens each (``l = 1..len(target[b])``);
    ``companion`` (optional, same layout as ``target``): the companion's forwards, which score a
    round's candidates (:class:`~decode.policies.SV`); ``draft_widths`` (optional, same layout): the
    draft's forwards of ``l`` tokens per row, which catch its cache up after a round (without it a
    forward of ``l`` tokens is priced as ``l`` one-token forwards). Between grid points the times are
    interpolated linearly; beyond the grid they grow linearly with the last interval's slope (never
    decreasing: a measured table can dip by noise).
    """

    batches: tuple[int, ...]
    draft: tuple[float, ...]
    target: tuple[tuple[float, ...], ...]
    companion: tuple[tuple[float, ...], ...] = ()
    draft_widths: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self) -> None:
        if not self.batches or list(self.batches) != sorted(set(self.batches)) or self.batches[0] < 1:
            raise ValueError(f"batch sizes must be increasing and >= 1, got {self.batches}")
        if len(self.draft) != len(self.batches):
            raise ValueError("need one draft time per batch size")
        for name, table in (("target", self.target), ("companion", self.companion), ("draft_widths", self.draft_widths)):
            if (table or name == "target") and (len(table) != len(self.batches) or not table[0]
                                                or len({len(row) for row in table}) != 1):
                raise ValueError(f"need one {name} row per batch size, each with the same (non-empty) number of lengths")

    def draft_time(self, batch: float) -> float:
        """Seconds of a draft forward of ``batch`` rows."""
        return _extend(batch, self.batches, self.draft)

    def draft_forward_time(self, batch: int, width: int) -> float:
        """Seconds of a draft forward of ``width`` tokens per row over ``batch`` rows (from ``draft_widths`` when
        measured, else ``width`` one-token forwards)."""
        if self.draft_widths:
            return table_time(self.batches, self.draft_widths, batch, batch * width)
        return width * self.draft_time(batch)

    def target_time(self, batch: int, total: float) -> float:
        """``t_t(B, T)``: seconds of a verification of ``total`` candidates over ``batch`` rows.

        Rows are taken to verify the mean length ``T / B`` each (at least one token).
        """
        return table_time(self.batches, self.target, batch, total)

    def companion_time(self, batch: int, total: float) -> float:
        """Seconds of a companion forward of ``total`` tokens over ``batch`` rows (as :meth:`target_time`)."""
        if not self.companion:
            raise ValueError("these BatchCosts have no companion prices: measure them with a companion model")
        return table_time(self.batches, self.companion, batch, total)

    def target_alone_seconds(self, batch: int, forwards: int) -> float:
        """Seconds of ``forwards`` decoding steps of the target alone over ``batch`` rows (one token per row each)."""
        return forwards * self.target_time(batch, batch)

    def batch_one(self) -> CostModel:
        """The batch-1 cost model of these measurements (what :class:`~decode.policies.GoodputHead` uses
        outside a batch): ``t_t`` verifies one candidate (two tokens fed), its shape the measured lengths."""
        verify = [self.verify_time(1, candidates) for candidates in range(1, len(self.target[0]))] or [
            self.verify_time(1, 1)]
        t_companion = self.companion_time(1, 1) if self.companion else 0.0
        return CostModel(t_draft=self.draft_time(1), t_target=verify[0], t_companion=t_companion,
                         latency=LatencyShape(tuple(t / verify[0] for t in verify)))

    def verify_time(self, batch: int, candidates: float) -> float:
        """Seconds of a verification of ``candidates`` over ``batch`` rows: each row also feeds its last token."""
        return self.target_time(batch, candidates + batch)

    def marginal_candidate(self, batch: int, length: int) -> float:
        """Seconds one more candidate adds to a verification where each of ``batch`` rows has ``length``."""
        return max(0.0, self.verify_time(batch, batch * (length + 1)) - self.verify_time(batch, batch * length)) / batch

    def modelled_seconds(self, target_shapes: Sequence[tuple[int, int]], draft_shapes: Sequence[tuple[int, int]],
                         companion_shapes: Sequence[tuple[int, int]] = ()) -> float:
        """Modelled seconds of a batched generation from its forwards' ``(rows, tokens per row)``.

        Each model's first forward (the prompts) is left out: every method on the same prompts pays it.
        A target forward of ``B`` rows × ``w`` tokens costs ``t_t(B, B·w)``; a draft forward
        :meth:`draft_forward_time` (drafting feeds one token per row; catching up after a round and the
        ensemble rules' settling forwards more); a companion forward is priced like a target forward
        from the companion's table.
        """
        target = sum(self.target_time(rows, rows * width) for rows, width in target_shapes[1:])
        draft = sum(self.draft_forward_time(rows, width) for rows, width in draft_shapes[1:])
        companion = sum(self.companion_time(rows, rows * width) for rows, width in companion_shapes[1:])
        return target + draft + companion

    def to_dict(self) -> dict[str, object]:
        """JSON-ready fields (metadata)."""
        return {"batches": list(self.batches), "draft": list(self.draft), "target": [list(r) for r in self.target],
                "companion": [list(r) for r in self.companion], "draft_widths": [list(r) for r in self.draft_widths]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchCosts:
        """Inverse of :meth:`to_dict`."""
        def table(name: str) -> tuple[tuple[float, ...], ...]:
            return tuple(tuple(float(t) for t in row) for row in data.get(name, ()))

        return cls(tuple(int(b) for b in data["batches"]), tuple(float(t) for t in data["draft"]), table("target"),
                   table("companion"), table("draft_widths"))


def table_time(batches: Sequence[float], table: Sequence[Sequence[float]], batch: float, total: float) -> float:
    """Seconds of a forward of ``total`` tokens over ``batch`` rows from a ``[batch size][tokens per row]`` table;
    rows are taken to feed the mean ``total / batch`` tokens each (at least one)."""
    lengths = np.arange(1, len(table[0]) + 1)
    per_row = max(total / batch, 1.0)
    at_length = [_extend(per_row, lengths, row) for row in table]
    return _extend(batch, batches, at_length)


def _extend(x: float, grid: Sequence[float], values: Sequence[float]) -> float:
    """Linear interpolation on ``grid``, linear extrapolation past its end (non-decreasing slope ≥ 0)."""
    grid, values = np.asarray(grid, dtype=float), np.asarray(values, dtype=float)
    if len(grid) == 1 or x <= grid[-1]:
        return float(np.interp(x, grid, values))
    slope = max(0.0, (values[-1] - values[-2]) / (grid[-1] - grid[-2]))
    return float(values[-1] + slope * (x - grid[-1]))


def measure_batch_costs(target: PreTrainedModel, draft: PreTrainedModel, batches: Sequence[int] = (1, 2, 4, 8, 16, 32),
                        max_length: int = 8, context: int = 64, repeats: int = 5,
                        companion: PreTrainedModel | None = None) -> BatchCosts:
    """Time the draft and the target (``1..max_length`` tokens per row) at each batch size, and the companion
    like the target when one is given (``draft``: the draft's one-token forwards, ``draft_widths``: all widths).

    A forward over more rows or more tokens does not take less time, so the measured tables are made
    non-decreasing in both (running maximum): what is left of timer noise cannot reward a longer draft.
    """
    batches = tuple(sorted(set(batches)))
    draft_widths = forward_table(draft, batches, max_length, context, repeats)  # one token per row: its first column
    return BatchCosts(batches, tuple(row[0] for row in draft_widths),
                      forward_table(target, batches, max_length, context, repeats),
                      forward_table(companion, batches, max_length, context, repeats) if companion else (),
                      draft_widths)


def forward_table(model: PreTrainedModel, batches: Sequence[int], max_length: int, context: int = 64,
                  repeats: int = 5) -> tuple[tuple[float, ...], ...]:
    """Median seconds (:func:`decode.timing.forward_seconds`) of a forward of ``b`` rows × ``l`` tokens each after a
    ``context``-token cached prefix of random ids, for every ``b`` of ``batches`` (increasing) and
    ``l = 1..max_length``, made non-decreasing in both (running maximum)."""
    generator = torch.Generator().manual_seed(0)
    times = np.array([forward_seconds(model, random_ids(model, (b, context), generator), range(1, max_length + 1),
                                      repeats) for b in batches])
    times = np.maximum.accumulate(np.maximum.accumulate(times, axis=1), axis=0)
    return tuple(tuple(row) for row in times.tolist())
