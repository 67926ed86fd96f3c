"""The benchmark CLIs run end to end on micro models saved to disk, on random-init pairs and on an installed zoo."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import decoding as bench
from benchmarks import ensemble as bench_ensemble
from benchmarks import source_costs
from decode.artifacts.gguf import file_sha256
from decode.artifacts.serialization import save_head, save_profile, save_threshold_choice
from decode.artifacts.threshold_choice import ThresholdChoice
from decode.head import AcceptanceHead, HeadConfig
from decode.metadata import HeadMetadata, ProfileMetadata
from decode.profile import SVProfile
from decode.rules import Speculative
from decode.sampling import Sampling
from model_build.zoo.paths import ENV_VAR, METADATA_FILE


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


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
def test_bench_compiled_rows_count_the_decoders_own_calls_over_runs(tmp_path, capsys, make_lm):
    """A compiled graph runs no forward hooks: the compiled rows take their calls from the decoder's stats."""
    make_lm(64, seed=31, hidden=32, layers=2).save_pretrained(tmp_path / "target")
    make_lm(64, seed=32).save_pretrained(tmp_path / "draft")
    results = bench.main(["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--k", "3",
                          "--prompts", "2", "--max-new-tokens", "8", "--device", "cpu", "--compile", "--runs", "2"])
    printed = capsys.readouterr().out
    assert [r.name for r in results][3:] == ["decode TargetOnly, compiled", "decode Fixed(3), compiled"]
    assert [r.tokens for r in results] == [16] * 5
    target_alone, fixed = results[3:]
    assert target_alone.target_calls >= 16 and target_alone.draft_calls == 0
    assert 0 < fixed.target_calls < 16 and fixed.draft_calls >= fixed.target_calls
    assert printed.count("run 1/2") == 1 and printed.count("run 2/2") == 1
    assert re.search(r"compiled: target [1-9]\d* graphs in \d+ s; draft [1-9]\d* graphs", printed)
    assert re.search(r"decode Fixed\(3\), compiled / HF assisted tokens/s over 2 runs: median [0-9.]+x \(runs ", printed)


@pytest.mark.parametrize("name, expected", [("tpu:0", "names no device"), ("cuda:7", "CUDA")])
def test_a_device_this_machine_lacks_is_one_line(capsys, name, expected):
    if torch.cuda.device_count() > 7:
        pytest.skip("this machine has the device")
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--device", name])
    error = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert exit_info.value.code == 2 and len(error) == 1 and expected in error[0]
    assert bench.parse_args(["--device", "cpu"]).device == torch.device("cpu")


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


@pytest.fixture
def saved_pair(tmp_path, make_lm) -> list[str]:
    """A saved micro target / draft pair and a random ``post`` head: the bench's model arguments."""
    make_lm(64, seed=31, hidden=32, layers=2).save_pretrained(tmp_path / "target")
    make_lm(64, seed=32).save_pretrained(tmp_path / "draft")
    torch.manual_seed(0)
    head = AcceptanceHead(HeadConfig(16, depth=1, timing="post"))
    metadata = HeadMetadata(draft="draft", tokenizer_hash="none", rule=Speculative().spec(), sampling=Sampling(),
                            head_config=head.config)
    path = tmp_path / "head.safetensors"
    save_head(head, path, metadata)
    # the h an evaluation chose for it: the benchmarks' default
    save_threshold_choice(ThresholdChoice(file_sha256(path), "", {}, {}, {}, 0.5, ()), path)
    return ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
            "--head", str(tmp_path / "head.safetensors"), "--device", "cpu", "--max-new-tokens", "6"]


def test_bench_batch_sizes_on_saved_micro_models(saved_pair, capsys):
    results = bench.main([*saved_pair, "--k", "3", "--batch-sizes", "1", "3", "--layouts", "compact", "holes",
                          "--threshold", "0.5"])
    printed = capsys.readouterr().out
    names = ["target alone (HF generate)", "decode Fixed(3) batched [compact]", "decode Fixed(3) batched [holes]",
             "decode Head(h=0.5) batched [compact]", "decode Head(h=0.5) batched [holes]", "decode Fixed(3) one by one"]
    assert [(r.name, r.batch) for r in results] == [(n, b) for b in (1, 3) for n in names]
    assert all(r.tokens == 6 * r.batch for r in results) and all(name in printed for name in names)
    target_alone = [r for r in results if r.name == names[0]]
    assert [r.target_calls for r in target_alone] == [6, 6] and all(r.draft_calls == 0 for r in target_alone)
    assert all(0 < r.target_calls <= 6 * r.batch and r.draft_calls > 0 for r in results if r.name != names[0])
    batched = {r.batch: r for r in results if r.name == names[1]}
    one_by_one = {r.batch: r for r in results if r.name == names[-1]}
    assert batched[1].target_calls == one_by_one[1].target_calls  # a batch of one is generate
    assert batched[3].target_calls < one_by_one[3].target_calls  # rows share the target's forwards


def test_bench_goodput_prices_every_method_at_the_measured_batch_costs(saved_pair, capsys):
    rows = bench.main([*saved_pair, "--batch-sizes", "1", "3", "--goodput", "--k-grid", "1", "3"])
    printed = capsys.readouterr().out
    names = ["target alone (HF generate)", "Fixed(1)", "Fixed(3)", "Head(h=0.5)", "GoodputHead (batch costs)",
             "vLLM estimator, survival budget (batch costs)", "target alone (our loop, K=0)",
             "HeadBudget (survival, batch costs)"]
    assert [(r.method, r.batch) for r in rows] == [(n, b) for b in (1, 3) for n in names]
    # the same 3 prompts at every B, each method both priced and timed
    assert all(r.tokens == 6 * 3 and r.modelled_s > 0 and r.measured_s > 0 for r in rows)
    loop = [r for r in rows if r.method == "target alone (our loop, K=0)"]
    hf = [r for r in rows if r.method == "target alone (HF generate)"]
    assert [r.modelled_s for r in loop] == pytest.approx([r.modelled_s for r in hf])  # one token per row per forward
    fixed = [line for line in printed.splitlines() if line.startswith(("Fixed(", "target alone (our loop"))]
    modelled_best = [line for line in fixed if re.match(r"(Fixed\(\d\)|target alone \(our loop, K=0\)) \*", line)]
    measured_best = [line for line in fixed if re.match(r"(Fixed\(\d\)|target alone \(our loop, K=0\)) \*?\+", line)]
    # one best fixed K (K = 0 included) per batch size by each measure
    assert "measured costs" in printed and len(modelled_best) == len(measured_best) == 2


def test_bench_goodput_prices_sv_with_the_companions_measured_costs(saved_pair, tmp_path, make_lm, capsys):
    make_lm(64, seed=33).save_pretrained(tmp_path / "companion")
    profile = SVProfile(x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 0.5, 1.0]),
                        table=torch.tensor([[0.2, 0.6], [0.5, 0.9]]), counts=torch.ones(2, 2),
                        latency=torch.tensor([1.0, 1.1, 1.2, 1.3]))
    metadata = ProfileMetadata(draft="draft", tokenizer_hash="none", rule=Speculative().spec(), sampling=Sampling(),
                               bins=profile.bins, k_max=4)
    save_profile(profile, tmp_path / "profile.safetensors", metadata)
    rows = bench.main([*saved_pair, "--batch-sizes", "1", "3", "--goodput", "--k-grid", "2",
                       "--profile", str(tmp_path / "profile.safetensors"), "--companion", str(tmp_path / "companion")])
    printed = capsys.readouterr().out
    sv = [r for r in rows if r.method == "SV(k=4, batch costs)"]
    assert [r.batch for r in sv] == [1, 3] and all(r.tokens == 6 * 3 and r.modelled_s > 0 for r in sv)
    assert "companion" in printed  # the companion's measured table is printed with the others
    with pytest.raises(SystemExit):  # a profile belongs to a --goodput comparison
        bench.parse_args([*saved_pair, "--batch-sizes", "1", "--profile", "p"])


def test_bench_times_a_head_at_batch_1_with_its_own_phase_in_the_breakdown(saved_pair, capsys):
    results = bench.main([*saved_pair, "--k", "3", "--prompts", "2", "--threshold", "0.4", "--breakdown"])
    printed = capsys.readouterr().out
    assert [r.name for r in results][-1] == "decode Head(h=0.4)" and results[-1].tokens == 12
    assert "acceptance head" in printed and printed.count("ms/round") == 4


def test_bench_without_batch_sizes_refuses_goodput():
    with pytest.raises(SystemExit):
        bench.parse_args(["--random-init", "tiny", "--goodput"])


def test_bench_reads_the_installed_zoo_from_its_directory(tmp_path, monkeypatch, capsys, make_lm):
    make_lm(64, seed=31, hidden=32, layers=2).save_pretrained(tmp_path / "zoo" / "target")
    make_lm(64, seed=32).save_pretrained(tmp_path / "zoo" / "draft")
    (tmp_path / "zoo" / METADATA_FILE).write_text("{}")  # what marks an installed zoo
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "zoo"))
    results = bench.main(["--k", "2", "--prompts", "1", "--max-new-tokens", "4", "--device", "cpu"])
    assert "target=target draft=draft" in capsys.readouterr().out
    assert [r.tokens for r in results] == [4, 4, 4]


@pytest.mark.parametrize("main", [bench.main, bench_ensemble.main])
def test_benches_without_an_installed_zoo_name_the_install_command(main, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "no-zoo"))
    with pytest.raises(SystemExit) as stopped:
        main(["--prompts", "1", "--device", "cpu"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error == (f"error: no model zoo installed in {tmp_path / 'no-zoo'}; install it first with "
                     "`python -m model_build.zoo`\n")
    assert not (tmp_path / "no-zoo").exists()  # the bench installs nothing


def test_the_loops_bench_times_the_loop_against_another_revision(capsys):
    from benchmarks import loops

    figures = loops.main(["--random-init", "tiny", "--prompts", "4", "--max-new-tokens", "6", "--repeats", "1",
                          "--device", "cpu", "--batch-sizes", "1", "2", "--against", "HEAD"])
    printed = capsys.readouterr().out
    assert "ours generate " in printed and "HEAD generate_batch" in printed and "B=2" in printed
    assert figures["B=1 ours generate"] > 0 and figures["B=2 HEAD generate_batch"] > 0
    assert figures["B=1 HEAD generate ratio"] == figures["B=2 HEAD generate_batch ratio"] == 1.0  # the references
    key = "B=1 ours generate ratio"
    assert figures[f"{key} lo"] <= figures[key] <= figures[f"{key} hi"]


def test_turns_add_the_repeats_up_and_show_their_spread(capsys):
    from rich.console import Console

    from benchmarks.turns import table, time_methods

    calls: list[str] = []

    def method(name: str, tokens: int):
        def run(prompt: list[int], seed: int) -> int:
            calls.append(name)
            return tokens
        return run

    timed = time_methods({"a": method("a", 4), "b": method("b", 6)}, [[1, 2], [3], [4, 5, 6]], "x", repeats=2)
    assert calls[:2] == ["a", "b"] and calls[2:8] == ["a", "b"] * 3  # warm-ups, then turns prompt by prompt
    assert [one.tokens for one in timed] == [[8, 8, 8], [12, 12, 12]]
    assert all(len(one.repeat_rates) == 2 and min(one.seconds) > 0 for one in timed)
    Console(width=200).print(table("t", timed, seed=0, reference=1))
    out = capsys.readouterr().out
    assert "repeats (min–max)" in out and "vs b" in out and "2 repeats" in out


def test_engines_without_vllm_say_so_in_one_line(capsys):
    from benchmarks.engines import vllm_rates

    assert vllm_rates(sys.executable, Path("nowhere"), [[1, 2]], 4, 1, None) is None
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("vLLM was not timed")]
    assert len(lines) == 1 and "vllm" in lines[0].lower()


def test_the_costs_bench_prints_and_stores_this_machines_profile(tmp_path, monkeypatch, capsys, make_lm,
                                                                 make_tokenizer):
    from benchmarks import costs

    for role, model in (("target", make_lm(64, seed=31, hidden=32, layers=2)), ("draft", make_lm(64, seed=32))):
        model.save_pretrained(tmp_path / role)
        make_tokenizer(64).save_pretrained(tmp_path / role)
    monkeypatch.setenv("ACCEPT_HEADS_COSTS_DIR", str(tmp_path / "costs"))
    argv = ["--exp", "tiny", "--repeats", "1", f"models.target.id={tmp_path / 'target'}",
            f"models.draft.id={tmp_path / 'draft'}", "models.companion=null"]
    profile = costs.main(argv)
    out = " ".join(capsys.readouterr().out.split())  # the table wraps long lines (a long tmp path) at its width
    assert len(profile.ratios()) == 16 and profile.compiled is None and "no cost profile" in out
    assert "T(m)/T(1), eager" in out and "one-token step / target step T(1), eager: draft" in out
    assert "measured now" in out and "t_t = T(2)" in out
    assert costs.main(argv) == profile and "stored earlier" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        costs.main(["--exp", "tiny", "models.target.id=/nowhere/model"])
    assert capsys.readouterr().err.startswith("error: ")


def test_the_vllm_door_counts_acceptance_by_position_as_vllm_does():
    """Ours from the per-round counts, vLLM's from its counters: the same rounds give the same figures, conditional
    and unconditional, named apart (a hand case: 4 rounds of K = 3 accepting 3, 1, 0, 2)."""
    from benchmarks.engines import VllmRun
    from benchmarks.vllm_door import Acceptance
    from decode.stats import DecodeStats

    stats = DecodeStats()
    for accepted in (3, 1, 0, 2):
        stats.record_round(verified=3, accepted=accepted)
    stats.record_round(verified=0, accepted=0)  # the target's first step alone drafts nothing
    ours = Acceptance.of_stats([stats], 3)
    theirs = Acceptance.of_vllm(VllmRun([1.0], 1.5, drafts=4, accepted_per_position=[3, 2, 1]), 3)
    assert ours == theirs
    assert ours.unconditional == [3 / 4, 2 / 4, 1 / 4]
    assert ours.conditional == [3 / 4, 2 / 3, 1 / 2]
    assert ours.conditional == stats.per_position_acceptance  # the decoder's own figure is the conditional one


def test_the_vllm_script_counts_only_the_timed_repeats():
    from benchmarks.vllm_cpu import since

    before = {"drafts": 10, "tokens": 12, "per_position": [7, 4, 1]}
    after = {"drafts": 30, "tokens": 40, "per_position": [20, 14, 6]}
    assert since(after, before) == {"drafts": 20, "tokens": 28, "per_position": [13, 10, 5]}
    assert since({}, {}) == {}  # no speculation, no counters


def test_the_vllm_door_without_a_vllm_python_says_so_in_one_line(capsys, monkeypatch):
    from benchmarks import vllm_door

    monkeypatch.delenv("VLLM_PYTHON", raising=False)
    assert vllm_door.main(["--draft", "nowhere"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "--vllm-python" in err[0]


def test_the_source_costs_benchmark_times_every_deployable_source_beside_the_draft_step(tmp_path, capsys, make_lm):
    make_lm(64, seed=33).save_pretrained(tmp_path / "draft")
    assert source_costs.main(["--draft", str(tmp_path / "draft"), "--context", "8", "--repeats", "4"]) == 0
    rows = {line.split("│")[1].strip().split("[")[0] for line in capsys.readouterr().out.splitlines()
            if line.count("│") > 2}
    assert rows >= {"draft step", "confidence", "adaedl", "margin", "vllm", "head", "head-online"}
    assert "perfect" not in rows  # it reads the target in hindsight: no deployable cost
