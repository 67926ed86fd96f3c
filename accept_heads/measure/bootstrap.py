"""95 % paired-bootstrap intervals over prompts: per-prompt costs of a run, the draws, a ratio's and a gap share's
interval (the evaluation's table columns: :mod:`accept_heads.evaluation.intervals`; the levers and the turn
benchmark).

Every policy decodes the same prompts with the same per-prompt seeds, so a comparison is paired:
one bootstrap draw resamples prompt ids with replacement and recomputes both runs' throughput
``Σ generated / Σ modelled seconds`` on the same draw. Draws are seeded (``seed``), so the
intervals are reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from accept_heads.measure.costing import run_source_seconds, verification_units
from decode.costs import CostModel

DRAWS = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class PromptCosts:
    """Per-prompt totals of one run, aligned on prompt ids: ``generated[P]``, ``seconds[P]`` (modelled)."""

    prompt_ids: tuple[str, ...]
    generated: np.ndarray
    seconds: np.ndarray


def generation_seconds(generations: pd.DataFrame, cost: CostModel) -> np.ndarray:
    """Modelled seconds of each generation under ``cost`` (the table's cost model, per row)."""
    frame = generations.assign(rounds_by_length=generations["verified_per_round"].map(
        lambda lengths: np.bincount(np.asarray(lengths, dtype=np.int64)).tolist()))
    units = verification_units(frame, cost.latency)
    sources = run_source_seconds(frame, dict(cost.sources))
    return cost.times(frame["draft_calls"], frame["companion_calls"], units, sources)


def _resampled_throughput(run: PromptCosts, draws: np.ndarray) -> np.ndarray:
    """Throughput of ``run`` on each bootstrap draw (``draws[D, P]`` prompt indices)."""
    seconds = run.seconds[draws].sum(1)
    return np.divide(run.generated[draws].sum(1), seconds, out=np.full(len(draws), np.nan), where=seconds > 0)


def paired_draws(prompts: int, seed: int, draws: int = DRAWS) -> np.ndarray:
    """``[draws, prompts]`` prompt indices, the same for every comparison of a prompt set."""
    return np.random.default_rng(seed).integers(0, prompts, size=(draws, prompts))


def interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan"), float("nan")
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def ratio_interval(run: PromptCosts, reference: PromptCosts, draws: np.ndarray) -> tuple[float, float]:
    """Interval of ``throughput(run) / throughput(reference)`` over paired draws (same prompt ids)."""
    if run.prompt_ids != reference.prompt_ids:
        raise ValueError("a paired comparison needs both runs on the same prompts")
    return interval(_resampled_throughput(run, draws) / _resampled_throughput(reference, draws))


def gap_share_interval(run: PromptCosts, fixed: PromptCosts, oracle: PromptCosts,
                       draws: np.ndarray) -> tuple[float, float]:
    """Interval of ``(x − fixed) / (oracle − fixed)`` throughputs over paired draws (undefined draws dropped)."""
    x, f, o = (_resampled_throughput(r, draws) for r in (run, fixed, oracle))
    gap = o - f
    share = np.divide(x - f, gap, out=np.full(len(draws), np.nan), where=gap > 0)
    return interval(share)
