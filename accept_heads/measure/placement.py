"""Where a measurement's models run and which of a run's prompts decode alone (the evaluation's and the ``h``
sweep's)."""

from __future__ import annotations

import torch

from ahconf.schema import EvaluateConfig
from data_gen.models import Trio


def place(trio: Trio) -> str:
    """Move the models to the GPU when there is one (unless a device map placed them); returns the device."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for model in (trio.target, trio.draft, trio.companion):
        if model is not None:
            model.eval()
            if getattr(model, "hf_device_map", None) is None:
                model.to(device)
    return device


def alone_prompts(e: EvaluateConfig, largest_set: int) -> int:
    """How many prompts of every run decode alone before the rest are batched: ``evaluate.timed_prompts``, and
    with the wall clock on, at least its prompts. In reduced precision a batched row may round differently
    from the same prompt alone, so the outputs the wall clock reproduces must come from runs decoded alone."""
    if not e.wallclock.sets:
        return e.timed_prompts
    return max(e.timed_prompts, e.wallclock.prompts or largest_set)
