"""Tests of the tiny-code model zoo: a tiny recipe through the real build path, offline."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from data_gen.corpus import corpus_hash, modules_in, split_of
from data_gen.zoo import ROLES, ModelShape, Zoo, ZooRecipe, ensure_zoo, zoo_summary_table
from data_gen.zoo.__main__ import main
from data_gen.zoo.models import fold_temperature
from data_gen.zoo.precision import resolve_precision
from decode.zoo_dir import ZOO_VERSION, default_cache_dir

TINY = ZooRecipe(
    vocab_size=320,
    context=32,
    target=ModelShape(layers=1, hidden=32, heads=2, intermediate=64, seed=1),
    draft=ModelShape(layers=1, hidden=16, heads=2, intermediate=32, seed=2),
    companion=ModelShape(layers=1, hidden=24, heads=2, intermediate=48, seed=3),
    target_steps=4,
    target_batch=2,
    distil_steps=4,
    draft_steps=3,
    distil_batch=2,
    eval_windows=4,
    accept_prompts=3,
    accept_prompt_tokens=8,
    accept_response_tokens=8,
    train_module_limit=6,
)


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    return ensure_zoo(tmp_path_factory.mktemp("zoo") / "tiny", recipe=TINY, check_realism=False)


def _role_files(zoo: Zoo) -> dict[str, bytes]:
    return {
        f"{role}/{path.name}": path.read_bytes()
        for role in ROLES
        for path in sorted(zoo.path(role).iterdir())
    }


def test_models_and_tokenizer_load_with_auto_classes(tiny_zoo: Zoo) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert not tiny_zoo.cache_hit
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


def test_metadata_records_models_and_acceptance(tiny_zoo: Zoo) -> None:
    meta = tiny_zoo.metadata
    assert meta["recipe"] == TINY.to_dict()
    assert ZooRecipe.from_dict(meta["recipe"]) == TINY
    for role in ROLES:
        info = meta["models"][role]
        assert info["params"] > 0 and info["held_out_loss"] > 0
        assert info["steps"] == TINY.steps(role)
    assert [meta["models"][r]["steps"] for r in ROLES] == [4, 3, 4]
    for role in ("draft", "companion"):
        assert 0.0 <= meta["models"][role]["acceptance_vs_target"] <= 1.0
    assert meta["models"]["target"]["acceptance_vs_target"] is None
    assert "cache" not in zoo_summary_table(tiny_zoo).caption


def test_training_modules_are_train_split_only(tiny_zoo: Zoo) -> None:
    corpus = tiny_zoo.metadata["corpus"]
    names = corpus["train_modules"]
    assert len(names) == corpus["train_module_count"] == TINY.train_module_limit
    assert all(split_of(name) == "train" for name in names)
    assert not set(names) & {m.name for m in modules_in("test")}
    assert corpus["train_hash"] == corpus_hash(modules_in("train")[: TINY.train_module_limit])


def test_second_call_is_a_fast_cache_hit(tiny_zoo: Zoo) -> None:
    again = ensure_zoo(tiny_zoo.root, recipe=TINY, check_realism=False)
    assert again.cache_hit
    assert again.seconds < 5.0
    assert again.metadata == tiny_zoo.metadata
    assert "cache hit" in zoo_summary_table(again).caption


def test_other_recipe_on_existing_cache_is_refused(tiny_zoo: Zoo) -> None:
    with pytest.raises(ValueError, match="another recipe"):
        ensure_zoo(tiny_zoo.root, recipe=ZooRecipe())


def test_rebuild_into_empty_dir_is_byte_identical(tiny_zoo: Zoo, tmp_path: Path) -> None:
    other = ensure_zoo(tmp_path / "tiny", recipe=TINY, check_realism=False)
    assert not other.cache_hit
    assert _role_files(other) == _role_files(tiny_zoo)


def test_interrupted_build_leaves_no_complete_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import data_gen.zoo.training as training

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(training, "distil_students", crash)
    with pytest.raises(RuntimeError, match="injected failure"):
        ensure_zoo(tmp_path / "tiny", recipe=TINY, check_realism=False)
    assert not (tmp_path / "tiny").exists()
    assert [p.name for p in tmp_path.iterdir()] == [".tiny.lock"]  # staging directory removed


def test_concurrent_callers_build_once(tmp_path: Path) -> None:
    results: list[Zoo] = []

    def build() -> None:
        results.append(ensure_zoo(tmp_path / "z", recipe=TINY, check_realism=False))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(zoo.cache_hit for zoo in results) == [False, True]


def test_env_var_overrides_default_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEPT_HEADS_ZOO_DIR", str(tmp_path / "elsewhere"))
    assert default_cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("ACCEPT_HEADS_ZOO_DIR")
    assert default_cache_dir().parts[-3:] == ("accept-heads", "zoo", ZOO_VERSION)


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "--cache-dir" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_default_zoo_meets_its_required_properties() -> None:
    """Builds the real zoo if it is not cached yet (about ten minutes on two cores)."""
    zoo = ensure_zoo()
    models = zoo.metadata["models"]
    assert zoo.metadata["recipe"] == ZooRecipe().to_dict()
    assert models["target"]["held_out_loss"] <= models["draft"]["held_out_loss"] - 0.2
    assert zoo.metadata["realism"]["failures"] == []
    assert all(split_of(name) == "train" for name in zoo.metadata["corpus"]["train_modules"])


def test_auto_precision_trains_in_float32_without_native_bf16() -> None:
    zen3 = {"avx2", "fma", "avx512f"}  # AVX-512 without its bf16 extension still emulates bf16
    assert resolve_precision("auto", flags=zen3).autocast_bf16 is False
    assert resolve_precision("auto", flags=zen3 | {"avx512_bf16"}).autocast_bf16 is True
    assert resolve_precision("auto", flags={"amx_bf16"}).autocast_bf16 is True
    assert resolve_precision("fp32", flags={"amx_bf16"}).autocast_bf16 is False
    with pytest.raises(ValueError, match="unknown zoo precision 'half'"):
        resolve_precision("half")


def test_zoo_json_records_the_training_precision(tiny_zoo: Zoo) -> None:
    expected = resolve_precision(TINY.precision)
    assert tiny_zoo.metadata["precision"] == {"training": expected.name, "reason": expected.reason}


def test_folded_temperature_divides_the_logits_of_a_tied_model(tiny_zoo: Zoo) -> None:
    target = AutoModelForCausalLM.from_pretrained(zoo_path := tiny_zoo.path("target")).eval()
    ids = torch.tensor([[5, 17, 42, 9, 100]])
    with torch.no_grad():
        before = target(input_ids=ids).logits
        fold_temperature(target, 0.8)
        assert torch.allclose(target(input_ids=ids).logits, before / 0.8, atol=1e-5)
        # Control: scaling the tied head scales the input embeddings as well, which is not a temperature.
        tied = AutoModelForCausalLM.from_pretrained(zoo_path).eval()
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
