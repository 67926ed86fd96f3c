"""One feature-draft build on a target: prompts → teacher shards → training → a ``from_pretrained`` directory.

Every stage resumes: finished shards are kept (:mod:`.shards`), training continues from its ``last.ckpt``
(:mod:`.training`), and the draft directory is written whole and renamed into place, with a record
(``feature_draft.json``: the recipe, the data, the held-out losses per depth, every file's sha256).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from data_gen.prompts import load_prompts
from decode.artifacts.hub import native_bf16
from decode.drafts.feature_model import BUILD_RECORD, FeatureDraftForCausalLM
from model_build.model_store import file_hashes
from model_build.zoo.build import machine_class
from runtime.encoding import encode_prompts
from runtime.install import write_json

from .model import FeatureDraftShape, frequent_tokens, initial_draft, trained_tensors, warm_start
from .shards import ShardPlan, ShardTimes, build_shards, read_sequences
from .training import FeatureTraining, TrainingResult, train_feature_draft

SHIPPED_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class PromptSource:
    """Which prompts the target answers, rendered as the experiment renders them."""

    source: str = "builtin"
    split: str = "train"
    style: str | None = "function"
    template: str = "chat"
    instruction: str = "Complete the following Python function.\n\n```python\n{message}```"
    max_prompt_tokens: int = 384


@dataclass(frozen=True)
class FeatureRecipe:
    """Everything a build depends on."""

    shape: FeatureDraftShape = field(default_factory=FeatureDraftShape)
    training: FeatureTraining = field(default_factory=FeatureTraining)
    prompts: PromptSource = field(default_factory=PromptSource)
    shards: int = 46  # every train-split stub once at each temperature
    prompts_per_shard: int = 256
    response_tokens: int = 128
    temperatures: tuple[float, ...] = (1.0, 0.0)  # one pass over the prompts each (0: greedy)
    teacher_layers: tuple[int, ...] | None = None  # the target layers the shards store (None: those the draft reads)
    generation_batch: int = 32
    top_k: int = 32
    seed: int = 0

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))


def encoded(tokenizer: PreTrainedTokenizerBase, prompts: PromptSource, seed: int) -> list[list[int]]:
    """The prompts' token ids, those over the budget skipped."""
    texts = load_prompts(prompts.source, prompts.split, style=prompts.style, seed=seed)
    encoded_prompts, _ = encode_prompts(texts, tokenizer, prompts.template, prompts.max_prompt_tokens, "skip",
                                        prompts.instruction)
    return [p.token_ids for p in encoded_prompts]


def shard_plan(recipe: FeatureRecipe, target: PreTrainedModel, target_sha256: str) -> ShardPlan:
    """The shards' plan for this recipe and target."""
    return ShardPlan(prompts_per_shard=recipe.prompts_per_shard, response_tokens=recipe.response_tokens,
                     top_k=recipe.top_k, seed=recipe.seed, target_sha256=target_sha256,
                     feature_layers=recipe.teacher_layers or recipe.shape.reads(target), temperatures=recipe.temperatures,
                     generation_batch=recipe.generation_batch)


def build_data(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target_sha256: str,
               recipe: FeatureRecipe, data_dir: Path, teacher: bool, times: ShardTimes) -> list[Path]:
    """Only the shards, no training: the response shards (the slow part, kept for a later teacher pass and
    training), and with ``teacher`` the teacher shards too; their paths."""
    plan = shard_plan(recipe, target, target_sha256)
    return build_shards(target, encoded(tokenizer, recipe.prompts, recipe.seed), data_dir, plan,
                        tokenizer.eos_token_id, tokenizer.pad_token_id, len(tokenizer), recipe.shards, teacher=teacher,
                        times=times)


@dataclass(frozen=True)
class BuildResult:
    """A finished build."""

    draft: FeatureDraftForCausalLM
    record: dict
    directory: Path


def build_feature_draft(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target_sha256: str,
                        recipe: FeatureRecipe, out: Path, data_dir: Path, work_dir: Path,
                        init_from: Path | None = None) -> BuildResult:
    """Make the shards, train, and write the draft to ``out`` (see the module docstring); ``init_from``: a trained
    draft's directory to continue from (its shape, and its output layer's subset, rather than this data's)."""
    started = time.perf_counter()
    prompts = encoded(tokenizer, recipe.prompts, recipe.seed)
    plan = shard_plan(recipe, target, target_sha256)
    times = ShardTimes()
    paths = build_shards(target, prompts, data_dir, plan, tokenizer.eos_token_id, tokenizer.pad_token_id,
                         len(tokenizer), recipe.shards, times=times)
    stored = [read_sequences(path) for path in paths]
    start = load_file(init_from / "trained.safetensors") if init_from is not None else None
    subset = (start["lm_head.token_ids"] if start is not None and "lm_head.token_ids" in start
              else frequent_tokens((s.tokens for s in stored), target.config.vocab_size, recipe.shape.vocab_subset)
              if recipe.shape.vocab_subset is not None else None)
    responses = sum(int((s.lengths - s.prompt_lengths).sum()) for s in stored)
    sequences = sum(len(s.lengths) for s in stored)
    del stored
    draft = initial_draft(target, recipe.shape, subset)
    if start is not None:
        warm_start(draft, start)
    bf16 = native_bf16("cuda" if torch.cuda.is_available() else "cpu")
    training_started = time.perf_counter()
    result = train_feature_draft(draft, paths, recipe.training, work_dir, precision="bf16-mixed" if bf16 else "32-true")
    training_seconds = time.perf_counter() - training_started
    record = {
        "recipe": recipe.to_dict(),
        "target_sha256": target_sha256,
        **({"started_from": started_from(init_from)} if init_from is not None else {}),
        "machine": machine_class(),
        "training_precision": "bf16" if bf16 else "fp32",
        "data": {"shards": recipe.shards, "sequences": sequences, "response_tokens": responses,
                 "positions": result.trained_positions + result.held_out_positions},
        "time": {**times.to_dict(), "training_seconds": round(training_seconds, 1)},
        "training": _training(result),
        "params": sum(t.numel() for t in trained_tensors(draft, torch.float32).values()),
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    save_draft(draft.eval(), tokenizer, out, record)
    return BuildResult(draft, record, out)


def started_from(directory: Path) -> dict:
    """What a warm-started draft continued from: the trained tensors' sha256 and that draft's recipe."""
    record = json.loads((directory / BUILD_RECORD).read_text())
    return {"trained_sha256": file_hashes(directory, ["trained.safetensors"])["trained.safetensors"],
            "recipe": record["recipe"], "training_steps": record["training"]["steps"]}


def _training(result: TrainingResult) -> dict:
    return {"steps": result.steps, "trained_positions": result.trained_positions,
            "held_out_positions": result.held_out_positions, "held_out": result.held_out}


def save_draft(draft: FeatureDraftForCausalLM, tokenizer: PreTrainedTokenizerBase, out: Path, record: dict) -> None:
    """``out`` as a ``from_pretrained`` directory plus its record, written beside and renamed into place; a draft
    already there is renamed aside first and removed after, so a killed save never leaves ``out`` holding a record
    beside missing files."""
    staging, replaced = out.with_name(f".{out.name}.partial"), out.with_name(f".{out.name}.replaced")
    for leftover in (staging, replaced):  # a killed save's
        if leftover.exists():
            shutil.rmtree(leftover)
    staging.mkdir(parents=True)
    draft.config.save_pretrained(staging)
    draft.generation_config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    state = {k: v.contiguous() for k, v in draft.state_dict().items()
             if not (draft.config.tie_word_embeddings and k == "lm_head.weight")}
    save_file(state, staging / "model.safetensors", metadata={"format": "pt"})
    save_file(trained_tensors(draft, SHIPPED_DTYPE), staging / "trained.safetensors",
              metadata={"format": "pt", "config": draft.config.to_json_string()})
    write_json(staging / BUILD_RECORD, {**record, "files": file_hashes(staging)})
    if out.exists():
        out.rename(replaced)
    staging.rename(out)
    if replaced.exists():
        shutil.rmtree(replaced)
