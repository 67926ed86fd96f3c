"""The benchmark CLI runs end to end on micro models saved to disk and on random-init pairs."""

from __future__ import annotations

import torch

from decode import bench
from decode.rules import Speculative


def test_bench_runs_on_saved_micro_models(tmp_path, capsys, make_lm):
    make_lm(64, seed=31, hidden=32, layers=2).save_pretrained(tmp_path / "target")
    make_lm(64, seed=32).save_pretrained(tmp_path / "draft")
    results = bench.main(
        ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--k", "3",
         "--prompts", "2", "--max-new-tokens", "8", "--device", "cpu"]
    )
    printed = capsys.readouterr().out
    assert "HF assisted, constant K=3" in printed and "decode Fixed(3)" in printed
    assert [r.tokens for r in results] == [16, 16, 16]
    assert all(r.target_calls > 0 for r in results) and results[0].draft_calls == 0


def test_bench_breakdown_on_a_random_init_pair(capsys):
    results = bench.main(
        ["--random-init", "tiny", "--k", "2", "--prompts", "1", "--max-new-tokens", "6", "--device", "cpu",
         "--breakdown"]
    )
    printed = capsys.readouterr().out
    assert "random-init tiny (torch.float32)" in printed
    assert [r.tokens for r in results] == [6, 6, 6]
    for phase in ["target forward", "draft forward", "draft sampling (Rule.propose)", "verification (Rule.verify)",
                  "other (bookkeeping, rollback, host syncs)"]:
        assert phase in printed
    assert printed.count("ms/round") == 3


def test_phase_timer_restores_what_it_wraps(make_lm):
    model, rule = make_lm(16, seed=1), Speculative()
    timer = bench.PhaseTimer(torch.device("cpu"))
    timer.module("forward", model)
    timer.method("verify", rule, "verify")
    model(torch.tensor([[1, 2]]))
    assert timer.calls == {"forward": 1} and timer.seconds["verify"] == 0.0
    timer.close()
    model(torch.tensor([[1, 2]]))
    assert "verify" not in vars(rule) and timer.calls == {"forward": 1}
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_random_pairs_are_seeded_and_sized():
    a, _ = bench.random_pair("tiny", torch.device("cpu"), torch.float32)
    b, _ = bench.random_pair("tiny", torch.device("cpu"), torch.float32)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    target, draft = bench.random_pair("1b", torch.device("meta"), torch.bfloat16)
    assert 0.9e9 < target.num_parameters() < 1.0e9 and 80e6 < draft.num_parameters() < 110e6
    assert target.dtype == draft.dtype == torch.bfloat16
