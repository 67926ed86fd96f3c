"""The benchmark CLI runs end to end on micro models saved to disk."""

from __future__ import annotations

from decode import bench


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
