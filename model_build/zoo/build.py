"""Train the zoo from its recipe into a directory: tokenizer and three models, plus the record for ``zoo.json``.

Seeded and deterministic on one machine class (:func:`machine_class`): the same SIMD path,
thread count, training precision and library versions give the same bytes. Only
``python -m model_build.zoo --rebuild`` and the tests build; everyone else installs the shipped trio
(:mod:`model_build.zoo.store`).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from data_gen.corpus import corpus_hash, modules_in
from model_build.model_store import ROLES, STUDENT_ROLES, file_hashes
from model_build.zoo.paths import METADATA_FILE, ZOO_VERSION

from .recipe import ZooRecipe

ZOO_NAME = "tiny-code"


def machine_class() -> dict[str, Any]:
    """What decides the bytes a build trains: CPU SIMD path, threads and library versions."""
    import tokenizers
    import torch
    import transformers

    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def build_into(staging: Path, recipe: ZooRecipe) -> dict[str, Any]:
    """Train tokenizer and models into ``staging`` and measure their realism; returns the record for ``zoo.json``."""
    # Heavy imports stay here so that installing the shipped trio does not pay for them.
    import torch

    from data_gen.prompts.shipped import held_out_modules
    from decode.threads import torch_threads

    from .architecture import build_model, fold_temperature, parameter_count
    from .evaluation import EVALUATION_SETS
    from .realism import measure_realism
    from .tokenizer import train_tokenizer
    from .training import distil_students, train_target, training_precision
    from .windows import token_stream

    started = time.perf_counter()
    train_modules = [(m.name, m.read()) for m in modules_in("train")[: recipe.train_module_limit]]
    train_texts = [text for _, text in train_modules]
    dev_modules = held_out_modules()
    machine = machine_class()
    precision, fallback = training_precision(recipe.precision)
    if fallback:
        print(f"warning: {fallback}", file=sys.stderr)
    bf16 = precision == "bf16"
    with torch_threads(machine["threads"]), torch.random.fork_rng(devices=[]):
        tokenizer = train_tokenizer(train_texts, recipe.vocab_size, recipe.context)
        train_stream = token_stream(tokenizer, train_texts)

        models = {role: build_model(recipe.shape(role), tokenizer, recipe.context) for role in ROLES}
        target_loss = train_target(models["target"], train_stream, recipe, bf16)
        distil_losses = distil_students(models["target"], {r: models[r] for r in STUDENT_ROLES}, train_stream,
                                        recipe, bf16)
        fold_temperature(models["target"], recipe.target_temperature)

        realism = measure_realism(models, tokenizer, recipe)

    for role, model in models.items():
        model.save_pretrained(staging / role)
        tokenizer.save_pretrained(staging / role)
    final_train_loss = {"target": target_loss, **distil_losses}
    (evaluation_dev,) = [s for s in realism.sets if s.name == EVALUATION_SETS[0][0]]  # the evaluation's dev prompts
    acceptance = {"draft": evaluation_dev.acceptance, "companion": evaluation_dev.companion_acceptance}
    metadata = {
        "name": ZOO_NAME,
        "zoo_version": ZOO_VERSION,
        "origin": "rebuild",
        "recipe": recipe.to_dict(),
        "machine": machine,
        "precision": precision,
        "requested_precision": recipe.precision,
        "corpus": {
            "train_modules": [name for name, _ in train_modules],
            "train_module_count": len(train_modules),
            "train_hash": corpus_hash(train_modules),
            "train_tokens": len(train_stream),
            "dev_module_count": len(dev_modules),
            "dev_hash": corpus_hash(dev_modules),
        },
        "tokenizer": {
            "vocab_size": len(tokenizer),
            "special_tokens": {"bos": tokenizer.bos_token, "eos": tokenizer.eos_token, "pad": tokenizer.pad_token},
        },
        "models": {
            role: {
                "params": parameter_count(model),
                "layers": recipe.shape(role).layers,
                "hidden_size": recipe.shape(role).hidden,
                "seed": recipe.shape(role).seed,
                "steps": recipe.steps(role),
                "final_train_loss": final_train_loss[role],
                "held_out_loss": realism.held_out_loss[role],
                "acceptance_vs_target": acceptance.get(role),
            }
            for role, model in models.items()
        },
        "realism": realism.to_dict(),
        "build_seconds": time.perf_counter() - started,
        "files": file_hashes(staging, skip=METADATA_FILE),
    }
    return metadata
