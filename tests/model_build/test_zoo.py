"""Tests of the tiny-code model zoo: the shipped trio (install, verify, its realism) and the rebuild path."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import model_build.zoo.store as store
from data_gen.corpus import corpus_hash, modules_in, split_of
from data_gen.prompts.shipped import held_out_modules
from model_build.model_store import file_hashes
from model_build.zoo import (
    ROLES,
    SHIPPED_DIR,
    ModelShape,
    Zoo,
    ZooError,
    ZooRealismError,
    ZooRecipe,
    ensure_zoo,
    rebuild_zoo,
    zoo_summary_table,
)
from model_build.zoo.__main__ import main
from model_build.zoo.architecture import fold_temperature
from model_build.zoo.paths import METADATA_FILE, ZOO_VERSION, default_cache_dir
from model_build.zoo.realism import Realism, SetRealism
from runtime.install import directory_lock

TINY = ZooRecipe(
    vocab_size=320,
    context=128,
    target=ModelShape(layers=1, hidden=32, heads=2, intermediate=64, seed=1),
    draft=ModelShape(layers=1, hidden=16, heads=2, intermediate=32, seed=2),
    companion=ModelShape(layers=1, hidden=24, heads=2, intermediate=48, seed=3),
    target_steps=4,
    target_batch=2,
    distil_steps=4,
    draft_steps=3,
    distil_batch=2,
    eval_windows=4,
    realism_prompts=3,
    line_prompt_tokens=8,
    prompt_budget=96,
    response_tokens=8,
    degeneracy_tokens=8,
    train_module_limit=6,
)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _recorded_files() -> dict[str, str]:
    return json.loads((SHIPPED_DIR / METADATA_FILE).read_text())["files"]


# --- the shipped trio -------------------------------------------------------------------------------


def test_ensure_zoo_installs_the_shipped_bytes_without_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_training(*args: object) -> None:
        raise AssertionError("ensure_zoo trained a model")

    monkeypatch.setattr(store, "build_into", no_training)
    zoo = ensure_zoo(tmp_path / "empty")
    assert zoo.action == "installed"
    recorded = _recorded_files()
    assert {f"{role}/model.safetensors" for role in ROLES} <= set(recorded)
    for name, digest in recorded.items():
        assert _sha256(zoo.root / name) == digest, name
    assert zoo.record["origin"] == "shipped" and zoo.record["zoo_version"] == ZOO_VERSION
    again = ensure_zoo(tmp_path / "empty")
    assert again.action == "verified" and again.record == zoo.record
    assert "verified" in zoo_summary_table(again).caption and "shipped reference build" in zoo_summary_table(again).caption


def test_the_shipped_record_lists_every_shipped_file_with_its_sha256() -> None:
    assert file_hashes(SHIPPED_DIR, skip=METADATA_FILE) == _recorded_files()
    meta = json.loads((SHIPPED_DIR / METADATA_FILE).read_text())
    assert meta["recipe"] == ZooRecipe().to_dict()  # the default recipe is the shipped trio's
    assert meta["precision"] == "fp32"
    for role in ROLES:
        model = SHIPPED_DIR / role / "model.safetensors"
        assert model.stat().st_size > 1e6
        assert meta["models"][role]["layers"] == ZooRecipe().shape(role).layers


def test_concurrent_callers_install_once(tmp_path: Path) -> None:
    results: list[Zoo] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_zoo(tmp_path / "z"))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(zoo.action for zoo in results) == ["installed", "verified"]


def test_a_corrupt_cached_file_is_one_line_naming_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "zoo"
    ensure_zoo(root)
    weights = root / "draft" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10] + b"0123456789")
    expected = (f"zoo file {weights} does not match its recorded sha256 (corrupt or modified); restore the shipped "
                f"trio with `python -m model_build.zoo --reinstall --cache-dir {root}`")
    with pytest.raises(ZooError) as error:
        ensure_zoo(root)
    assert str(error.value) == expected
    assert main(["--cache-dir", str(root)]) == 2
    assert capsys.readouterr().err == f"error: {expected}\n"
    assert main(["--cache-dir", str(root), "--reinstall"]) == 0
    assert _sha256(weights) == _recorded_files()["draft/model.safetensors"]


def test_a_bad_zoo_is_a_user_error_of_every_entry_point(tmp_path: Path) -> None:
    from ahconf.entry import USER_ERRORS
    from ahconf.schema import ModelSpec
    from runtime.models import resolve_model_id

    root = tmp_path / "zoo"
    assert resolve_model_id(ModelSpec(id="zoo:draft"), str(root)) == str(root / "draft")
    (root / "draft" / "config.json").write_text("{}")
    with pytest.raises(USER_ERRORS, match=r"^zoo file .*draft/config.json does not match its recorded sha256"):
        resolve_model_id(ModelSpec(id="zoo:target"), str(root))  # every role checks the whole trio


def test_a_missing_file_and_another_version_are_one_line_each(tmp_path: Path) -> None:
    root = tmp_path / "zoo"
    ensure_zoo(root)
    (root / "target" / "tokenizer.json").unlink()
    with pytest.raises(ZooError, match=r"^zoo file .*target/tokenizer.json is missing; restore the shipped trio"):
        ensure_zoo(root)
    ensure_zoo(root, reinstall=True)
    meta = json.loads((root / METADATA_FILE).read_text())
    (root / METADATA_FILE).write_text(json.dumps({**meta, "zoo_version": "v4"}))
    with pytest.raises(ZooError) as error:
        ensure_zoo(root)
    assert str(error.value) == (f"the zoo in {root} is version 'v4', this code uses '{ZOO_VERSION}'; replace it with "
                                f"the shipped trio: `python -m model_build.zoo --reinstall --cache-dir {root}`")
    (root / METADATA_FILE).write_text("{")
    with pytest.raises(ZooError, match=r"zoo.json is unreadable or incomplete \(JSONDecodeError\)"):
        ensure_zoo(root)


def test_a_process_that_waits_for_the_lock_says_for_whom(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "zoo"
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with directory_lock(root, "rebuilding the tiny-code trio"):
            holding.set()
            release.wait(timeout=30)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(timeout=30)
    lock_text = (tmp_path / ".zoo.lock").read_text()
    assert lock_text.startswith(f"process {os.getpid()} (rebuilding the tiny-code trio, since ")
    waiter = threading.Thread(target=ensure_zoo, args=(root,))
    waiter.start()
    waiter.join(timeout=2)
    assert waiter.is_alive()  # blocked behind the holder
    release.set()
    holder.join()
    waiter.join(timeout=30)
    assert capsys.readouterr().err == f"waiting for the lock {tmp_path / '.zoo.lock'}, held by {lock_text}\n"
    assert ensure_zoo(root).action == "verified"


def test_an_unwritable_cache_dir_is_one_line(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(ZooError) as error:
        ensure_zoo(blocked / "zoo")
    assert str(error.value) == (f"cannot write the zoo next to {blocked / 'zoo'} (File exists); choose a writable "
                                "directory with --cache-dir or ACCEPT_HEADS_ZOO_DIR")


def test_env_var_overrides_default_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEPT_HEADS_ZOO_DIR", str(tmp_path / "elsewhere"))
    assert default_cache_dir() == tmp_path / "elsewhere"
    assert ensure_zoo().root == tmp_path / "elsewhere"
    monkeypatch.delenv("ACCEPT_HEADS_ZOO_DIR")
    assert default_cache_dir().parts[-3:] == ("accept-heads", "zoo", ZOO_VERSION)


def test_cli_help_and_flag_checks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--cache-dir" in out and "--rebuild" in out and "--reinstall" in out
    assert main(["--force"]) == 2
    assert capsys.readouterr().err == "error: --force, --ship and --precision go with --rebuild\n"


# --- rebuilding: a reduced recipe through the real build path ------------------------------------------


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    return rebuild_zoo(tmp_path_factory.mktemp("zoo") / "tiny", TINY, require_realism=False)


def _role_files(zoo: Zoo) -> dict[str, bytes]:
    return {f"{role}/{path.name}": path.read_bytes() for role in ROLES for path in sorted(zoo.path(role).iterdir())}


def test_rebuilt_models_and_tokenizer_load_with_auto_classes(tiny_zoo: Zoo) -> None:
    assert tiny_zoo.action == "rebuilt"
    for role in ROLES:
        assert (tiny_zoo.path(role) / "model.safetensors").is_file()
        model = AutoModelForCausalLM.from_pretrained(tiny_zoo.path(role))
        tokenizer = AutoTokenizer.from_pretrained(tiny_zoo.path(role))
        assert model.config.num_hidden_layers == TINY.shape(role).layers
        assert model.config.hidden_size == TINY.shape(role).hidden
        assert model.config.vocab_size == len(tokenizer) == TINY.vocab_size
        assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
        text = "def f(x):\n    return x + 1\n"
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
        assert model.config.eos_token_id == tokenizer.eos_token_id


def test_rebuild_metadata_records_models_realism_and_file_hashes(tiny_zoo: Zoo) -> None:
    meta = tiny_zoo.record
    assert meta["recipe"] == TINY.to_dict() and ZooRecipe.from_dict(meta["recipe"]) == TINY
    assert meta["origin"] == "rebuild" and meta["matches_shipped"] is False
    assert meta["files"] == file_hashes(tiny_zoo.root, skip=METADATA_FILE)
    assert [meta["models"][r]["steps"] for r in ROLES] == [4, 3, 4]
    for role in ("draft", "companion"):
        assert 0.0 <= meta["models"][role]["acceptance_vs_target"] <= 1.0
    realism = tiny_zoo.realism
    assert [s.name for s in realism.sets] == ["line start (dev)", "function (dev)", "module (test, OOD)"]
    assert all(s.prompts == TINY.realism_prompts for s in realism.sets)
    assert all(s.greedy_oracle_gain >= 1.0 - 1e-9 for s in realism.sets)  # the oracle never loses to a fixed K
    assert realism.held_out_loss["draft"] == meta["models"]["draft"]["held_out_loss"]
    assert "a rebuild" in zoo_summary_table(ensure_zoo(tiny_zoo.root)).caption  # a rebuild is kept as installed


def test_training_modules_are_train_split_only(tiny_zoo: Zoo) -> None:
    corpus = tiny_zoo.record["corpus"]
    names = corpus["train_modules"]
    assert len(names) == corpus["train_module_count"] == TINY.train_module_limit
    assert all(split_of(name) == "train" for name in names)
    assert not set(names) & {m.name for m in modules_in("test")}
    trained = modules_in("train")[: TINY.train_module_limit]
    assert corpus["train_hash"] == corpus_hash([(m.name, m.read()) for m in trained])
    assert corpus["dev_hash"] == corpus_hash(held_out_modules())  # measured on the shipped held-out text


def test_rebuild_into_empty_dir_is_byte_identical(tiny_zoo: Zoo, tmp_path: Path) -> None:
    other = rebuild_zoo(tmp_path / "tiny", TINY, require_realism=False)
    assert _role_files(other) == _role_files(tiny_zoo)
    assert other.record["files"] == tiny_zoo.record["files"]


def test_interrupted_rebuild_leaves_the_directory_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import model_build.zoo.training as training

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected failure")

    root = tmp_path / "zoo"
    ensure_zoo(root)
    monkeypatch.setattr(training, "distil_students", crash)
    with pytest.raises(RuntimeError, match="injected failure"):
        rebuild_zoo(root, TINY, require_realism=False)
    assert ensure_zoo(root).record["origin"] == "shipped"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".zoo.lock", "zoo"]  # staging directory removed


def _missing_realism() -> Realism:
    one = SetRealism(name="function (dev)", prompts=64, acceptance=0.72, companion_acceptance=0.8,
                     confidence_auroc=0.74, greedy_oracle_gain=1.5, greedy_best_fixed_k=3, degenerate_share=0.0)
    return Realism((one,), {"target": 3.0, "companion": 3.1, "draft": 3.169})


def _fake_build(staging: Path, recipe: ZooRecipe) -> dict:
    """What a build on another machine may give: the right files, a figure short of its target."""
    for role in ROLES:
        (staging / role).mkdir()
        (staging / role / "model.safetensors").write_bytes(role.encode())
    return {**json.loads((SHIPPED_DIR / METADATA_FILE).read_text()), "origin": "rebuild", "build_seconds": 1.0,
            "machine": {**store.shipped_metadata()["machine"], "cpu_capability": "AVX2"},
            "realism": _missing_realism().to_dict(), "files": file_hashes(staging)}


def test_a_rebuild_that_misses_a_target_warns_in_one_line_and_keeps_the_shipped_trio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "zoo"
    ensure_zoo(root)
    monkeypatch.setattr(store, "build_into", _fake_build)
    with pytest.raises(ZooRealismError) as miss:
        rebuild_zoo(root)
    expected = (f"the rebuilt trio misses 1 realism target(s) (loss_gap = 0.169, target >= 0.2); kept {root} as it "
                "was (pass --force to install the rebuild anyway)")
    assert str(miss.value) == expected
    assert ensure_zoo(root).record["origin"] == "shipped"
    capsys.readouterr()
    assert main(["--rebuild", "--cache-dir", str(root)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {expected} [a rebuild (trained in fp32 on a AVX2 CPU path")
    assert err[0].endswith("differs from the shipped trio]")
    assert ensure_zoo(root).record["origin"] == "shipped"
    assert main(["--rebuild", "--force", "--cache-dir", str(root)]) == 0
    forced = ensure_zoo(root)
    assert forced.record["origin"] == "rebuild" and (forced.root / "draft" / "model.safetensors").read_bytes() == b"draft"


# --- the shipped trio's realism, measured again (the default test run) ----------------------------------


@pytest.fixture(scope="module")
def shipped_realism() -> tuple[Realism, Realism]:
    """(recorded in zoo.json, measured now on this machine) for the shipped trio."""
    from model_build.zoo.realism import measure_realism

    models = {role: AutoModelForCausalLM.from_pretrained(SHIPPED_DIR / role).eval() for role in ROLES}
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_DIR / "target")
    recorded = Realism.from_dict(store.shipped_metadata()["realism"])
    return recorded, measure_realism(models, tokenizer, ZooRecipe())


def test_the_shipped_trio_meets_every_realism_target(shipped_realism: tuple[Realism, Realism]) -> None:
    recorded, measured = shipped_realism
    assert [s.name for s in measured.sets] == ["line start (dev)", "function (dev)", "module (test, OOD)"]
    assert measured.failures() == []
    assert recorded.failures() == []


def test_the_recorded_realism_figures_are_what_the_trio_does(shipped_realism: tuple[Realism, Realism]) -> None:
    """Equal on the reference machine class; elsewhere other rounding may flip a few sampled tokens. The held-out
    text and the prompts ship with the project, so every Python measures the same text."""
    assert corpus_hash(held_out_modules()) == store.shipped_metadata()["corpus"]["dev_hash"]
    recorded, measured = shipped_realism
    assert measured.held_out_loss == pytest.approx(recorded.held_out_loss, abs=1e-4)
    for then, now in zip(recorded.sets, measured.sets):
        assert now.acceptance == pytest.approx(then.acceptance, abs=0.01), now.name
        assert now.confidence_auroc == pytest.approx(then.confidence_auroc, abs=0.02), now.name
        assert now.greedy_oracle_gain == pytest.approx(then.greedy_oracle_gain, abs=0.05), now.name
        assert now.degenerate_share == pytest.approx(then.degenerate_share, abs=0.05), now.name


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_rebuild_on_the_reference_machine_class_is_byte_identical(tmp_path: Path) -> None:
    """About 20 minutes on two cores; training bytes are defined on one machine class only."""
    from model_build.zoo.build import machine_class

    shipped = store.shipped_metadata()
    if machine_class() != shipped["machine"]:
        pytest.skip(f"not the reference machine class {shipped['machine']} (here: {machine_class()})")
    zoo = rebuild_zoo(tmp_path / "zoo")
    assert zoo.record["matches_shipped"] is True
    assert zoo.record["files"] == shipped["files"]
    assert zoo.record["realism"] == shipped["realism"]


# --- recipe helpers ---------------------------------------------------------------------------------------


def test_folded_temperature_divides_the_logits_of_a_tied_model() -> None:
    target = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR / "target").eval()
    ids = torch.tensor([[5, 17, 42, 9, 100]])
    with torch.no_grad():
        before = target(input_ids=ids).logits
        fold_temperature(target, 0.8)
        assert torch.allclose(target(input_ids=ids).logits, before / 0.8, atol=1e-5)
        # Control: scaling the tied head scales the input embeddings as well, which is not a temperature.
        tied = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR / "target").eval()
        tied.lm_head.weight.div_(0.8)
        assert not torch.allclose(tied(input_ids=ids).logits, before / 0.8, atol=1e-3)
    with pytest.raises(ValueError, match="positive"):
        fold_temperature(target, 0.0)


def test_the_draft_may_have_its_own_distillation_weight_and_steps() -> None:
    recipe = ZooRecipe(distil_kl_weight=0.5, draft_kl_weight=0.9, distil_steps=300, draft_steps=240)
    assert (recipe.kl_weight("draft"), recipe.kl_weight("companion")) == (0.9, 0.5)
    assert (recipe.steps("draft"), recipe.steps("companion")) == (240, 300)
    shared = ZooRecipe(distil_kl_weight=0.5, draft_kl_weight=None)
    assert shared.kl_weight("draft") == shared.kl_weight("companion") == 0.5
    with pytest.raises(ValueError, match="unknown role"):
        recipe.kl_weight("verifier")
    with pytest.raises(ValueError, match="unknown zoo precision 'half'"):
        dataclasses.replace(recipe, precision="half")


def test_bf16_rebuilds_fall_back_to_fp32_on_a_cpu_without_native_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    from model_build.zoo import training

    monkeypatch.setattr(training, "native_bf16", lambda: False)
    precision, warning = training.training_precision("bf16")
    assert precision == "fp32" and warning is not None and "no native bfloat16" in warning
    assert training.training_precision("fp32") == ("fp32", None)
    monkeypatch.setattr(training, "native_bf16", lambda: True)
    assert training.training_precision("bf16") == ("bf16", None)
