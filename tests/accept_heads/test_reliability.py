"""The reliability diagram's bins: a mean label's standard error from its count, and ECE over every non-empty bin."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from accept_heads.evaluation.reliability import expected_calibration_error, reliability


def test_a_bins_standard_error_shrinks_with_its_count_and_a_bin_of_one_has_none():
    rng = np.random.default_rng(0)
    many, few = 2000, 20  # labels ~ Bernoulli(0.7) in bin 7, Bernoulli(0.3) in bin 2
    frame = pd.DataFrame({"pred": np.r_[np.full(many, 0.75), np.full(few, 0.25), [0.95]],
                          "label": np.r_[rng.random(many) < 0.7, rng.random(few) < 0.3, [1.0]].astype(float)})
    bins = reliability(frame)
    assert bins.loc[7, "count"] == many and bins.loc[2, "count"] == few and bins.loc[9, "count"] == 1
    for b, n, p in ((7, many, 0.7), (2, few, 0.3)):  # the Bernoulli s.e., to a relative 4 / sqrt(n)
        assert bins.loc[b, "label_se"] == pytest.approx(np.sqrt(p * (1 - p) / n), rel=4 / np.sqrt(n))
    assert bins.loc[7, "label_se"] < bins.loc[2, "label_se"] / 5  # 100x the positions: about a tenth the spread
    assert np.isnan(bins.loc[9, "label_se"]) and bins.loc[[0, 1], "count"].isna().all()  # one position; empty bins


def test_ece_counts_a_bin_of_one_position():
    frame = pd.DataFrame({"pred": [0.95, 0.15, 0.15], "label": [0.0, 0.0, 0.0]})
    assert expected_calibration_error(frame, bins=10) == pytest.approx((0.95 + 2 * 0.15) / 3)
    assert expected_calibration_error(frame.iloc[1:], bins=10) == pytest.approx(0.15)  # negative control: without it
