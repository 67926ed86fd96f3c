"""What a training job hands back: typed records of an exported head or profile (built in ``train``, read by ``report``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accept_heads.threshold import Calibration


@dataclass(frozen=True)
class HeadOutcome:
    """An exported SpecDec++ head: where it and its checkpoints are, its dev metrics and its threshold ``h``.

    ``dev_metrics``: metric name → value, None where undefined (an AUROC with one outcome class);
    ``calibration``: the choice of ``h`` on dev and its sweep (None: ``head.calibrate=false``).
    """

    name: str
    head_path: str
    checkpoint_dir: str
    timing: str
    depth: int
    rule: dict[str, Any]
    dev_metrics: dict[str, float | None]
    calibration: Calibration | None
    global_step: int
    best_checkpoint: str | None


@dataclass(frozen=True)
class ProfileOutcome:
    """An exported SV profile: its bins, information gain per split and latency tables (DESIGN §3).

    ``information``: split → ``h_a``, ``h_a_given_xy``, ``gain``, ``gain_fraction`` (shuffle-corrected) and
    ``gain_plugin`` (:func:`accept_heads.metrics.information_gain`); ``latency``:
    seconds per verification of ``L = 1..`` candidates; ``batch_latency``: ``batch_sizes`` and their
    ``table`` rows, or None.
    """

    name: str
    profile_path: str
    bins: tuple[int, int]
    requested_bins: tuple[int, int]
    backed_off_bins: int
    information: dict[str, dict[str, float]]
    latency: list[float]
    latency_device: str
    batch_latency: dict[str, Any] | None
