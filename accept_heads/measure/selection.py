"""Choosing a swept parameter (K, τ, h, γ, FSD T): the value with the highest modelled throughput.

One rule for the evaluation's dev selection (:func:`accept_heads.evaluation.table.select`, a head's ``h`` among its
choices) and the levers' choice of ``h``: the highest throughput of the cost model (DESIGN §5) on dev prompts, ties to
the smaller value.
"""

from __future__ import annotations

from collections.abc import Sequence


def best_value(values: Sequence[float], throughputs: Sequence[float]) -> float:
    """The value whose throughput is highest; on a tie the smaller value."""
    if len(values) != len(throughputs) or not values:
        raise ValueError(f"need one throughput per value, got {len(values)} values and {len(throughputs)} throughputs")
    return min(zip(values, throughputs), key=lambda pair: (-pair[1], pair[0]))[0]
