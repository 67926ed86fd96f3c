"""Forward-time regression of the cost model ``T ≈ t_d·N_d + t_t·N_t`` (DESIGN §5)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class CostFit:
    """Least-squares ``t_d``, ``t_t`` (seconds per call, no intercept) and the fit's R² over ``n`` tuples."""

    t_draft: float
    t_target: float
    r2: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def fit_costs(draft_calls: np.ndarray, target_calls: np.ndarray, seconds: np.ndarray) -> CostFit:
    """Fit ``seconds ≈ t_d·draft_calls + t_t·target_calls`` by least squares.

    R² is ``1 − SS_res / SS_tot`` with ``SS_tot`` taken around the mean time.
    """
    x = np.stack([np.asarray(draft_calls, float), np.asarray(target_calls, float)], axis=1)
    y = np.asarray(seconds, float)
    if y.size < 2:
        raise ValueError(f"the cost fit needs at least 2 (draft calls, target calls, time) tuples, got {y.size}")
    (t_draft, t_target), *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = float(((y - x @ np.array([t_draft, t_target])) ** 2).sum())
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - residual / total if total > 0 else float(residual == 0)
    return CostFit(float(t_draft), float(t_target), r2, int(y.size))
