"""Which of a run's prompts decode alone (the evaluation's and the ``h`` sweep's); where the models run is
:func:`runtime.placement.place`."""

from __future__ import annotations

from ahconf.schema import EvaluateConfig


def alone_prompts(e: EvaluateConfig, largest_set: int) -> int:
    """How many prompts of every run decode alone before the rest are batched: ``evaluate.timed_prompts``, and
    with the wall clock on, at least its prompts. In reduced precision a batched row may round differently
    from the same prompt alone, so the outputs the wall clock reproduces must come from runs decoded alone."""
    if not e.wallclock.sets:
        return e.timed_prompts
    return max(e.timed_prompts, e.wallclock.prompts or largest_set)
