"""The one forward-latency timer (``decode.timing``): median after a warm-up, runs taking turns, cached forwards."""

from __future__ import annotations

import pytest
import torch

from decode import timing
from decode.timing import CachedForward, Stopwatch, forward_seconds, median_seconds, medians_taking_turns

CPU = torch.device("cpu")


class ScriptedClock:
    """A ``perf_counter`` that only moves when a run spends its scripted seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: list[float], calls: list[str], name: str):
        def run() -> None:
            calls.append(name)
            self.now += seconds.pop(0)
        return run


@pytest.fixture
def clock(monkeypatch) -> ScriptedClock:
    clock = ScriptedClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    return clock


def test_the_median_after_an_untimed_warm_up(clock):
    calls: list[str] = []
    assert median_seconds(clock.spend([100.0, 3.0, 1.0, 2.0], calls, "a"), 3, CPU) == 2.0  # not 1.0, the minimum
    assert calls == ["a"] * 4
    with pytest.raises(ValueError, match="repeats"):
        median_seconds(clock.spend([1.0], calls, "a"), 0, CPU)


def test_runs_take_turns_within_every_round(clock):
    calls: list[str] = []
    runs = {"a": clock.spend([9.0, 1.0, 5.0, 3.0], calls, "a"), "b": clock.spend([9.0, 2.0, 2.0, 8.0], calls, "b")}
    assert medians_taking_turns(runs, 3, CPU) == {"a": 3.0, "b": 2.0}
    assert calls == ["a", "b"] * 4


def test_a_stopwatch_times_its_block(clock):
    with Stopwatch(CPU) as watch:
        clock.now += 0.25
    assert watch.seconds == 0.25


def test_a_cached_forward_leaves_the_cache_at_its_context(wide):
    context = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        forward = CachedForward(wide["target"], context)
        forward(torch.tensor([[6, 7, 8]]))
    assert forward.cache.get_seq_length() == 5


def test_forward_seconds_times_every_width_on_every_row(wide):
    seconds = forward_seconds(wide["draft"], torch.zeros(3, 4, dtype=torch.long), [1, 2, 4], repeats=2)
    assert len(seconds) == 3 and min(seconds) > 0
