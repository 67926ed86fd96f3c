"""Reliability-diagram statistics of acceptance predictions (numpy / pandas only: notebooks import this)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def reliability(frame: pd.DataFrame, bins: int = 10) -> pd.DataFrame:
    """Equal-width bins of the prediction: mean prediction, mean label and count per bin."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = np.clip(np.digitize(frame["pred"], edges[1:-1]), 0, bins - 1)
    grouped = frame.assign(bin=index).groupby("bin")
    out = pd.DataFrame({"pred": grouped["pred"].mean(), "label": grouped["label"].mean(), "count": grouped.size()})
    return out.reindex(range(bins)).assign(lo=edges[:-1], hi=edges[1:])


def expected_calibration_error(frame: pd.DataFrame, bins: int = 15) -> float:
    """ECE with equal-width bins and soft labels."""
    table = reliability(frame, bins).dropna()
    if table.empty:
        return float("nan")
    return float((table["count"] * (table["pred"] - table["label"]).abs()).sum() / table["count"].sum())
