"""The wall-clock harness: methods take turns prompt by prompt, tokens/s from its own clock, the counted runs' outputs."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pandas as pd
import pytest
import torch

from accept_heads.evaluation.executor import Executor
from accept_heads.evaluation.wallclock import (
    TimedMethod,
    compiled_here,
    measure,
    summarise,
    take_turns,
    timed_method,
    timed_specs,
    warmup_prompts,
)
from accept_heads.measure.runs import RunSpec, frame
from accept_heads.measure.specs import HFConstantSpec, HFHeuristicSpec
from decode.policy_specs import ConfidenceSpec, FixedSpec
from runtime.encoding import EncodedPrompt
from tests.helpers.config import DATA_OVERRIDES, model_overrides

PROMPTS = [EncodedPrompt(f"p{i}", [1, 2, 3]) for i in range(4)]


class FakeClock:
    """A clock that only moves when a method says it spent time."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_method(label_k: int, log: list[tuple[str, str]], clock: FakeClock, seconds: float, tokens: int,
                family: str = "fixed") -> TimedMethod:
    policy = FixedSpec(label_k) if family == "fixed" else HFConstantSpec(label_k)
    spec = RunSpec(set="test", rule="speculative", policy=policy)

    def decode(prompt: EncodedPrompt) -> torch.Tensor:
        log.append((spec.label, prompt.prompt_id))
        clock.now += seconds
        return torch.arange(tokens)

    return TimedMethod(spec, decode)


def test_methods_take_turns_prompt_by_prompt_with_a_rotating_first_method():
    log: list[tuple[str, str]] = []
    clock = FakeClock()
    methods = [fake_method(k, log, clock, 1.0, 4) for k in (1, 2, 3)]
    take_turns(methods, PROMPTS, clock=clock, warmup=PROMPTS[:1])
    warmup, timed = log[:3], log[3:]
    assert warmup == [("fixed(K=1)", "p0"), ("fixed(K=2)", "p0"), ("fixed(K=3)", "p0")]
    assert [prompt for _, prompt in timed] == [p.prompt_id for p in PROMPTS for _ in methods]  # no blocks
    firsts = [timed[3 * i][0] for i in range(len(PROMPTS))]
    assert firsts == ["fixed(K=1)", "fixed(K=2)", "fixed(K=3)", "fixed(K=1)"]
    for i in range(len(PROMPTS)):  # every method once per prompt
        assert sorted(label for label, _ in timed[3 * i : 3 * i + 3]) == ["fixed(K=1)", "fixed(K=2)", "fixed(K=3)"]


def test_the_warm_up_decodes_one_prompt_of_each_compiled_cache_length():
    """A cache length compiles its own graphs: each is met untimed first (prompt + 64 new tokens + the slack)."""
    prompts = [EncodedPrompt(f"p{i}", [1] * n) for i, n in enumerate((10, 150, 200, 40, 500, 300))]
    assert [p.prompt_id for p in warmup_prompts(prompts, 64)] == ["p0", "p2", "p4"]  # caches of 256, 512, 768
    assert [p.prompt_id for p in warmup_prompts(prompts[:2], 64)] == ["p0"]  # negative control: one length


def test_tokens_per_second_is_generated_tokens_over_its_own_measured_seconds():
    clock, log = FakeClock(), []
    fast = fake_method(4, log, clock, seconds=0.5, tokens=6)  # 12 tok/s
    slow = fake_method(1, log, clock, seconds=2.0, tokens=8)  # 4 tok/s
    timings = take_turns([fast, slow], PROMPTS, clock=clock)
    assert {t.seconds for t in timings if t.policy == "fixed(K=4)"} == {0.5}
    assert {(t.generated, t.seconds) for t in timings if t.policy == "fixed(K=1)"} == {(8, 2.0)}
    counted = pd.DataFrame({"set": [], "rule": [], "policy": [], "prompt_id": [], "output_sha": []})
    summary = summarise(timings, counted, seed=0).set_index("policy")
    assert summary.loc["fixed(K=4)", "tokens_per_s"] == pytest.approx(12.0)
    assert summary.loc["fixed(K=1)", "tokens_per_s"] == pytest.approx(4.0)
    # the first fixed run is the reference: its ratio is 1 with a degenerate interval, the other's is 1/3
    assert summary.loc["fixed(K=4)", ["x_fixed", "x_fixed_lo", "x_fixed_hi"]].tolist() == pytest.approx([1, 1, 1])
    assert summary.loc["fixed(K=1)", ["x_fixed", "x_fixed_lo", "x_fixed_hi"]].tolist() == pytest.approx([1 / 3] * 3)
    assert summary["x_target"].isna().all()  # no target-alone method here


def test_timed_specs_take_the_dev_choices_and_put_the_target_alone_first():
    specs = [RunSpec("test", "speculative", FixedSpec(3), chosen_on="dev"),
             RunSpec("test", "speculative", FixedSpec(5), chosen_on="grid"),
             RunSpec("test", "speculative", HFHeuristicSpec()),
             RunSpec("test", "speculative", ConfidenceSpec(0.5), chosen_on="dev"),
             RunSpec("test", "greedy", FixedSpec(2), chosen_on="dev"),
             RunSpec("ood", "speculative", FixedSpec(3), chosen_on="dev")]
    labels = [s.label for s in timed_specs(specs, "test", "speculative")]
    assert labels == ["target", "fixed(K=3)", "confidence(τ=0.5)", "hf-heuristic"]


@pytest.fixture(scope="module")
def executor(make_config, micro_trio, tmp_path_factory):
    root = tmp_path_factory.mktemp("wallclock")
    config = make_config(*model_overrides(micro_trio), *DATA_OVERRIDES, f"paths.root={root}",
                         "decoding.prompts={dev: 1, test: 3, ood: 1}", "decoding.max_new_tokens=10",
                         "evaluate.wallclock.sets=[test]", "evaluate.wallclock.rules=[speculative]",
                         "evaluate.wallclock.threads=1")
    return Executor.build(config.evaluate_job(), notes={})


def test_every_timed_generation_is_the_counted_runs_output(executor):
    """Our decoder and HF assisted generation reproduce, when timed in turns, the outputs their counted-call runs
    produced for the same seeds; a decoder seeded otherwise (negative control) does not."""
    specs = [RunSpec("test", "speculative", FixedSpec(2), chosen_on="dev"),
             RunSpec("test", "speculative", HFConstantSpec(2), chosen_on="dev"),
             RunSpec("test", "speculative", HFHeuristicSpec())]
    counted = frame([record for spec in specs for record in executor.run(spec)])
    timings, summary = measure(executor, specs, counted)
    rows = summary.set_index("policy")
    assert rows.loc["fixed(K=2)", "matches"] == 1.0
    assert rows.loc["hf-constant(K=2)", "matches"] == 1.0 and rows.loc["hf-heuristic", "matches"] == 1.0
    assert pd.isna(rows.loc["target", "matches"])  # the target alone has no counted run
    assert {t.turn for t in timings} == set(range(4)) and len(timings) == 4 * 3
    reseeded = replace(executor.decoding, seed=executor.decoding.seed + 1)
    shifted = take_turns([timed_method(specs[0], reseeded, executor.hf)], executor.sets["test"].prompts)
    control = summarise(shifted, counted, seed=0)
    assert control["matches"].iloc[0] < 1.0


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
def test_compiled_the_timed_decodes_are_the_counted_ones_and_the_target_alone_is_our_loop(executor):
    """``decoding.compile``: our timed decoder (compiled) reproduces the eager counted run's outputs, and the target
    alone it is timed against is our own compiled loop drafting nothing."""
    from decode.policies.schedules import TargetOnly

    fast = replace(executor.decoding, compile=True)
    spec = RunSpec("test", "speculative", FixedSpec(2), chosen_on="dev")
    counted = frame(executor.run(spec))
    timed = take_turns([timed_method(spec, fast, executor.hf)], executor.sets["test"].prompts)
    assert summarise(timed, counted, seed=0)["matches"].iloc[0] == 1.0
    alone = fast.target_alone("speculative")
    assert isinstance(alone.policy, TargetOnly) and alone.compiled_models()["target"] is not None
    compiled = compiled_here(executor)  # what the wall clock's table title reports
    assert compiled.startswith("; compiled in this process: target ") and "draft " in compiled, compiled
