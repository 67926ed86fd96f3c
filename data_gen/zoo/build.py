"""Build the zoo into a cache directory: locked, atomic, deterministic."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_gen.corpus import corpus_hash, modules_in
from decode.zoo_dir import METADATA_FILE, ZOO_VERSION, default_cache_dir, is_built

from .recipe import ROLES, STUDENT_ROLES, ZooRecipe

ZOO_NAME = "tiny-code"


class ZooRealismError(RuntimeError):
    """A finished build whose trio misses the realism targets (:mod:`data_gen.zoo.realism`)."""


@dataclass
class Zoo:
    """A built zoo on disk: one ``from_pretrained`` directory per role plus ``zoo.json``."""

    root: Path
    metadata: dict[str, Any] = field(repr=False)
    cache_hit: bool
    seconds: float

    def path(self, role: str) -> Path:
        """Directory of ``role`` (target, draft or companion), loadable with ``from_pretrained``."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
        return self.root / role


def ensure_zoo(
    cache_dir: str | Path | None = None,
    *,
    rebuild: bool = False,
    recipe: ZooRecipe | None = None,
    check_realism: bool = True,
) -> Zoo:
    """Return the zoo in ``cache_dir`` (default: :func:`default_cache_dir`), building it if absent.

    A complete zoo is only ever visible after an atomic rename of a finished temp directory;
    concurrent callers serialise on a file lock next to the cache, and later ones reuse the result.
    Raises ``ValueError`` when the cached zoo was built with another recipe or zoo version, and
    :class:`ZooRealismError` (writing nothing) when a fresh build misses an enforced realism target
    (:mod:`data_gen.zoo.realism`) unless ``check_realism`` is off (tests' tiny recipes).
    """
    started = time.perf_counter()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    recipe = recipe or ZooRecipe()
    if not rebuild and is_built(root):
        return _cached(root, recipe, started)
    root.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(root.parent / f".{root.name}.lock"):
        if not rebuild and is_built(root):
            return _cached(root, recipe, started)
        for stale in root.parent.glob(f".{root.name}.tmp-*"):
            shutil.rmtree(stale)  # left by a builder that was killed; we hold the lock
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
        try:
            metadata = _build_into(staging, recipe, started, check_realism)
            _replace_dir(staging, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return Zoo(root, metadata, cache_hit=False, seconds=time.perf_counter() - started)


def _cached(root: Path, recipe: ZooRecipe, started: float) -> Zoo:
    metadata = json.loads((root / METADATA_FILE).read_text())
    if metadata.get("zoo_version") != ZOO_VERSION or metadata.get("recipe") != recipe.to_dict():
        raise ValueError(
            f"zoo at {root} was built with zoo version {metadata.get('zoo_version')!r} and another "
            f"recipe than requested (version {ZOO_VERSION!r}); pass rebuild=True or another cache dir"
        )
    return Zoo(root, metadata, cache_hit=True, seconds=time.perf_counter() - started)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _replace_dir(staging: Path, root: Path) -> None:
    if root.exists():
        retired = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-old-", dir=root.parent))
        os.replace(root, retired / root.name)
        os.rename(staging, root)
        shutil.rmtree(retired)
    else:
        os.rename(staging, root)


@contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _build_into(staging: Path, recipe: ZooRecipe, started: float, check_realism: bool) -> dict[str, Any]:
    """Train tokenizer and models, evaluate them, and write everything into ``staging``."""
    # Heavy imports stay here so that a cache hit does not pay for them.
    import tokenizers
    import torch
    import transformers

    from .data import spaced_windows, token_stream
    from .evaluation import held_out_loss, line_start_prompts
    from .models import build_model, fold_temperature, parameter_count
    from .precision import resolve_precision
    from .realism import measure_realism
    from .tokenizer import train_tokenizer
    from .training import distil_students, train_target

    train_modules = modules_in("train")[: recipe.train_module_limit]
    dev_modules = modules_in("dev")
    threads = len(os.sched_getaffinity(0))
    precision = resolve_precision(recipe.precision)
    with _torch_threads(threads):
        tokenizer = train_tokenizer([m.read() for m in train_modules], recipe.vocab_size, recipe.context)
        train_stream = token_stream(tokenizer, train_modules)
        dev_windows = spaced_windows(token_stream(tokenizer, dev_modules), recipe.eval_windows, recipe.context)

        models = {role: build_model(recipe.shape(role), tokenizer, recipe.context) for role in ROLES}
        target_loss = train_target(models["target"], train_stream, recipe, precision.autocast_bf16)
        distil_losses = distil_students(
            models["target"], {r: models[r] for r in STUDENT_ROLES}, train_stream, recipe, precision.autocast_bf16
        )
        fold_temperature(models["target"], recipe.target_temperature)

        prompts = line_start_prompts(
            tokenizer, dev_modules, recipe.accept_prompts, recipe.accept_prompt_tokens, recipe.eval_seed
        )
        losses = {role: held_out_loss(model, dev_windows) for role, model in models.items()}
        realism, acceptance = measure_realism(
            models, prompts, recipe.accept_response_tokens, recipe.eval_seed, tokenizer.eos_token_id, losses
        )
    failures = realism.failures()
    if check_realism and failures:
        raise ZooRealismError(
            "the built zoo does not behave like a real draft / target pair: " + "; ".join(failures)
            + " (nothing was written; change the recipe, or pass check_realism=False for a test zoo)"
        )

    for role, model in models.items():
        model.save_pretrained(staging / role)
        tokenizer.save_pretrained(staging / role)
    final_train_loss = {"target": target_loss, **distil_losses}
    metadata = {
        "name": ZOO_NAME,
        "zoo_version": ZOO_VERSION,
        "recipe": recipe.to_dict(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "threads": threads,
        "precision": {"training": precision.name, "reason": precision.reason},
        "corpus": {
            "train_modules": [m.name for m in train_modules],
            "train_module_count": len(train_modules),
            "train_hash": corpus_hash(train_modules),
            "train_tokens": len(train_stream),
            "dev_module_count": len(dev_modules),
            "dev_hash": corpus_hash(dev_modules),
            "held_out_tokens": int(dev_windows.numel()),
        },
        "tokenizer": {
            "vocab_size": len(tokenizer),
            "sha256": hashlib.sha256((staging / "target" / "tokenizer.json").read_bytes()).hexdigest(),
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
                "held_out_loss": losses[role],
                "acceptance_vs_target": acceptance.get(role),
            }
            for role, model in models.items()
        },
        "acceptance": {
            "rule": "speculative: mean of 1 - TV(p, q) over target-sampled response positions",
            "temperature": 1.0,
            "prompts": int(prompts.shape[0]),
            "prompt_tokens": int(prompts.shape[1]),
            "response_tokens": recipe.accept_response_tokens,
            **acceptance,
        },
        "realism": {**realism.to_dict(), "failures": failures},
        "build_seconds": time.perf_counter() - started,
    }
    (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    return metadata
