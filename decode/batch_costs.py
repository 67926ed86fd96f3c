"""Measured costs of batched forwards: the cost model of DESIGN §5 with a batch axis.

In a batch, one draft call feeds one token to each of ``B`` rows and one verification feeds every
row its candidates, ``T`` in all; what those calls cost depends on ``B`` and ``T`` and on the
device (a GPU verifies many tokens for the price of one until it is compute-bound; a CPU pays
nearly per token). :class:`BatchCosts` holds a table measured on the current device by
:func:`measure_batch_costs` and interpolates it; :class:`~decode.policies.GoodputHead` reads it to
stop each row by the batch's marginal cost, and its :meth:`BatchCosts.verify_time` is a
``t_t(B, T)`` for :class:`~decode.policies.SV`'s joint verification lengths. A :class:`CostProfile` is a machine's
table at batch 1 alone, eager and compiled: the prices of ``cost.source=measured``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from decode.costs import CostModel, LatencyShape
from decode.json_types import JSONDict
from decode.timing import ForwardFactory, eager_forward, medians_taking_turns, random_ids

Table = tuple[tuple[float, ...], ...]  # [batch size][tokens per row - 1] seconds


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
        outside a batch): ``t_t`` verifies one candidate (two tokens fed), its shape the measured lengths, and the
        target alone a forward of one token."""
        verify = [self.verify_time(1, candidates) for candidates in range(1, len(self.target[0]))] or [
            self.verify_time(1, 1)]
        t_companion = self.companion_time(1, 1) if self.companion else 0.0
        return CostModel(t_draft=self.draft_time(1), t_target=verify[0], t_companion=t_companion,
                         latency=LatencyShape(tuple(t / verify[0] for t in verify)),
                         t_target_alone=self.target_time(1, 1))

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
                        companion: PreTrainedModel | None = None,
                        forward: ForwardFactory = eager_forward) -> BatchCosts:
    """Time the draft and the target (``1..max_length`` tokens per row) at each batch size, and the companion
    like the target when one is given (``draft``: the draft's one-token forwards, ``draft_widths``: all widths), the
    models taking turns (:func:`forward_tables`).

    A forward over more rows or more tokens does not take less time, so the measured tables are made
    non-decreasing in both (running maximum): what is left of timer noise cannot reward a longer draft.
    """
    batches = tuple(sorted(set(batches)))
    models = {"draft": draft, "target": target, **({"companion": companion} if companion is not None else {})}
    tables = forward_tables(models, batches, max_length, context, repeats, forward)
    return BatchCosts(batches, tuple(row[0] for row in tables["draft"]), tables["target"], tables.get("companion", ()),
                      tables["draft"])


def forward_table(model: PreTrainedModel, batches: Sequence[int], max_length: int, context: int = 64,
                  repeats: int = 5) -> Table:
    """:func:`forward_tables` of one model."""
    return forward_tables({"model": model}, batches, max_length, context, repeats)["model"]


@torch.inference_mode()
def forward_tables(models: Mapping[str, PreTrainedModel], batches: Sequence[int], max_length: int, context: int = 64,
                   repeats: int = 5, forward: ForwardFactory = eager_forward) -> dict[str, Table]:
    """Each model's median seconds (:func:`decode.timing.medians_taking_turns`: every forward of every model takes its
    turn in each round) of a forward of ``b`` rows × ``l`` tokens each after a ``context``-token cached prefix of
    random ids, made by ``forward``, for every ``b`` of ``batches`` and ``l = 1..max_length``; made non-decreasing in
    both (running maximum)."""
    batches = sorted(set(batches))
    generator = torch.Generator().manual_seed(0)
    device = next(iter(models.values())).device
    with ExitStack() as opened:
        runs = {}
        for name, model in models.items():
            for b in batches:
                call = opened.enter_context(forward(model, random_ids(model, (b, context), generator)))
                for width in range(1, max_length + 1):
                    runs[name, b, width] = partial(call, random_ids(model, (b, width), generator))
        medians = medians_taking_turns(runs, repeats, device)
    tables = {}
    for name in models:
        times = np.array([[medians[name, b, width] for width in range(1, max_length + 1)] for b in batches])
        times = np.maximum.accumulate(np.maximum.accumulate(times, axis=1), axis=0)
        tables[name] = tuple(tuple(row) for row in times.tolist())
    return tables


@dataclass(frozen=True)
class CostProfile:
    """One machine's prices at batch 1 (DESIGN §5): the cost model of ``cost.source=measured``.

    ``eager`` and ``compiled`` are :class:`BatchCosts` of batch size 1 alone: the target's forward of ``m = 1..M``
    tokens on a cached context (``T(m)``), the draft's forwards (its one-token step first) and the companion's, the
    models taking turns. A round that verifies ``L`` candidates feeds the target ``L + 1`` tokens and is priced
    ``T(L + 1)``; the target alone ``T(1)`` a token (:meth:`BatchCosts.batch_one`).
    """

    machine: str  # decode.timing.machine_class of the device measured on
    dtype: str  # the target's dtype
    eager: BatchCosts  # eager forwards
    compiled: BatchCosts | None = None  # compiled forwards (decode.compile); None: not measured

    def __post_init__(self) -> None:
        for costs in (self.eager, self.compiled):
            if costs is not None and costs.batches != (1,):
                raise ValueError(f"a cost profile holds batch size 1 only, got {costs.batches}")

    def costs(self, compiled: bool = False) -> BatchCosts:
        """The eager or the compiled table."""
        if not compiled:
            return self.eager
        if self.compiled is None:
            raise ValueError("this cost profile has no compiled forwards: measure it with compiled=True")
        return self.compiled

    def ratios(self, compiled: bool = False) -> tuple[float, ...]:
        """``T(m) / T(1)`` for ``m = 1..M``."""
        row = self.costs(compiled).target[0]
        return tuple(t / row[0] for t in row)

    def shares(self, compiled: bool = False) -> dict[str, float]:
        """The draft's one-token step and the companion's (where measured) over the target's, ``t / T(1)``."""
        costs = self.costs(compiled)
        step = costs.target[0][0]
        return {"draft": costs.draft[0] / step, **({"companion": costs.companion[0][0] / step} if costs.companion
                                                   else {})}

    def cost_model(self, compiled: bool = False) -> CostModel:
        """The batch-1 cost model of these prices: ``t_t = T(2)``, ``shape(L) = T(L + 1) / T(2)``, the target alone
        ``T(1)``, ``t_d`` and ``t_c`` one-token steps."""
        return self.costs(compiled).batch_one()

    def caption(self, compiled: bool = False) -> str:
        """What a table modelled at these prices says of them: the machine, the dtype, the forwards and the ratios."""
        step = self.costs(compiled).target[0][0]
        shares = ", ".join(f"{name} {share:.3f}" for name, share in self.shares(compiled).items())
        ratios = " ".join(f"{ratio:.2f}" for ratio in self.ratios(compiled))
        return (f"costs measured on {self.machine}, {self.dtype}, {'compiled' if compiled else 'eager'}: "
                f"T(1) = {1e3 * step:.1f} ms; one-token step / T(1): {shares}; "
                f"T(m)/T(1), m = 1..{len(self.ratios(compiled))}: {ratios}")

    def to_dict(self) -> JSONDict:
        """JSON-ready fields (the stored profile)."""
        return {"machine": self.machine, "dtype": self.dtype, "eager": self.eager.to_dict(),
                "compiled": None if self.compiled is None else self.compiled.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostProfile:
        """Inverse of :meth:`to_dict`."""
        compiled = data.get("compiled")
        return cls(data["machine"], data["dtype"], BatchCosts.from_dict(data["eager"]),
                   None if compiled is None else BatchCosts.from_dict(compiled))
