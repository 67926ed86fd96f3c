"""Length policies: how many candidates to draft, and how many of them to verify (DESIGN §6).

A package by role: :mod:`~decode.policies.base` (the :class:`Policy` and :class:`BatchPlan` interfaces),
:mod:`~decode.policies.schedules` (policies without an acceptance source), :mod:`~decode.policies.sources` (every
acceptance source), :mod:`~decode.policies.stops` (the stop rules), :mod:`~decode.policies.stop_policy` (a source
under a stop), :mod:`~decode.policies.batch_plans` (how a stop's rows decide together in a batch),
:mod:`~decode.policies.sv` (Speculative Verification) and :mod:`~decode.policies.bounds` (the analysis bounds).
The library's public names are here (``decode.policies.Fixed(k=5)``); the project imports each from its module.
"""

from decode.policies.base import BatchPlan, Policy
from decode.policies.batch_plans import BatchGoodput, SurvivalBudget
from decode.policies.bounds import Oracle, PerfectGoodput, PerfectHead
from decode.policies.schedules import SVIP, Confidence, Fixed, Heuristic, RefitConfidence, TargetOnly
from decode.policies.sources import (
    AcceptanceSource,
    DraftConfidence,
    EntropyBound,
    HeadEstimate,
    OnlineMargin,
    TrueAcceptance,
    VLLMEstimator,
)
from decode.policies.stop_policy import GoodputHead, Head, StopPolicy
from decode.policies.stops import Goodput, StopRule, SurvivalStop, Threshold
from decode.policies.sv import SV

__all__ = [
    "SV",
    "SVIP",
    "AcceptanceSource",
    "BatchGoodput",
    "BatchPlan",
    "Confidence",
    "DraftConfidence",
    "EntropyBound",
    "Fixed",
    "Goodput",
    "GoodputHead",
    "Head",
    "HeadEstimate",
    "Heuristic",
    "OnlineMargin",
    "Oracle",
    "PerfectGoodput",
    "PerfectHead",
    "Policy",
    "RefitConfidence",
    "StopPolicy",
    "StopRule",
    "SurvivalBudget",
    "SurvivalStop",
    "TargetOnly",
    "Threshold",
    "TrueAcceptance",
    "VLLMEstimator",
]
