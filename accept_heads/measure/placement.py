"""Which of a run's prompts decode alone (the evaluation's); where the models run is
:func:`runtime.placement.place`."""

from __future__ import annotations

from ahconf.schema import DecodingConfig, WallclockConfig


def alone_prompts(d: DecodingConfig, wallclock: WallclockConfig, largest_set: int) -> int:
    """How many prompts of every run decode alone before the rest are batched: ``decoding.timed_prompts``, and
    with the wall clock on (``evaluate.wallclock``), at least its prompts. In reduced precision a batched row may
    round differently from the same prompt alone, so the outputs the wall clock reproduces must come from runs
    decoded alone."""
    if not wallclock.sets:
        return d.timed_prompts
    return max(d.timed_prompts, wallclock.prompts or largest_set)
