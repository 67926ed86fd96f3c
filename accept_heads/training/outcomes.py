"""What a training job hands back: typed records of an exported head or profile (built in ``train``, read by
``report``)."""

from __future__ import annotations

from dataclasses import dataclass

from decode.metadata import InformationGain
from decode.rules import RuleSpec


@dataclass(frozen=True)
class HeadOutcome:
    """An exported SpecDec++ head: where it and its checkpoints are and its dev metrics.

    ``dev_metrics``: metric name → value, None where undefined (an AUROC with one outcome class).
    """

    name: str
    head_path: str
    checkpoint_dir: str
    timing: str
    depth: int
    rule: RuleSpec
    dev_metrics: dict[str, float | None]
    global_step: int
    best_checkpoint: str | None
    round_depths: int = 1  # depths of a round its labels cover (a feature draft's; 1: the draft's q has none)


@dataclass(frozen=True)
class ProfileOutcome:
    """An exported SV profile: its bins, information gain per split and latency tables (DESIGN §3).

    ``information``: split → its gain (:func:`accept_heads.measure.information.information_gain`).
    """

    name: str
    profile_path: str
    bins: tuple[int, int]
    requested_bins: tuple[int, int]
    backed_off_bins: int
    information: dict[str, InformationGain]
    latency: list[float]  # [L]: seconds per verification of L = 1.. candidates
    latency_device: str
    batch_sizes: list[int] | None  # [B] batch sizes of the batch latency table (None: not measured)
    batch_latency: list[list[float]] | None  # [B][L]: seconds per forward of B rows × L tokens
