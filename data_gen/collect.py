"""``python -m data_gen.collect [+exp=NAME] [overrides]``: collect labelled training data.

One target pass per prompt: the target samples a response and its per-step logits are kept; the
draft (and the companion) run once over the same tokens; every position gets the draft's sample,
divergences, one label per configured rule and, with a companion, each configured rule's SV
indicators (:mod:`data_gen.labels`). Every model's logits are sliced to the shared vocabulary
(:attr:`data_gen.models.Trio.vocab`), as the decoder slices them. Output: HF ``datasets`` Arrow
shards per split plus ``manifest.json`` (see :mod:`data_gen.shards`). Safe to kill and re-run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets
import hydra
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from ahconf.entry import CONF_DIR, run_entry
from ahconf.schema import CollectJob, RulesConfig, SamplingConfig
from data_gen.distributed import World, close_world, init_world, local_device
from data_gen.encoding import EncodedPrompt, split_prompts
from data_gen.generation import generate_responses, teacher_forced_logits
from data_gen.labels import batch_columns, draft_candidates, indicator_rules, label_rules
from data_gen.manifest import MANIFEST_VERSION, CollectionManifest, SplitProgress, build_manifest, print_summary
from data_gen.models import Trio, load_trio
from data_gen.prompts import check_prompt_choices
from data_gen.seeding import prompt_seed
from data_gen.shards import MANIFEST_FILE, claim_directory, complete_shards, write_json_atomic, write_shard
from decode.sampling import Sampling

log = logging.getLogger(__name__)

POSITION_INT_COLUMNS = ("draft_token", "draft_argmax", "target_argmax")


def features_for(column_names: list[str]) -> datasets.Features:
    """Arrow schema of a shard row: ids, token lists and per-position columns."""
    ints = datasets.List(datasets.Value("int32"))
    floats = datasets.List(datasets.Value("float32"))
    spec: dict[str, Any] = {
        "prompt_id": datasets.Value("string"),
        "prompt_ids": ints,
        "response_ids": ints,
        "finished": datasets.Value("bool"),
    }
    for name in column_names:
        spec[name] = ints if name in POSITION_INT_COLUMNS else floats
    return datasets.Features(spec)


def fingerprint(job: CollectJob, trio_description: dict[str, Any]) -> dict[str, Any]:
    """Everything that changes the collected data; a directory never mixes two fingerprints.

    ``manifest_version`` stands for the column schema: shards of an older schema are never resumed.
    """
    return {
        "manifest_version": MANIFEST_VERSION,
        "models": trio_description,
        "prompts": asdict(job.prompts),
        "sampling": asdict(job.sampling),
        "rules": asdict(job.rules),
        "max_new_tokens": job.collect.max_new_tokens,
        "shard_size": job.collect.shard_size,
        "seed": job.seed,
    }


def collect_batch(trio: Trio, batch: list[EncodedPrompt], sampling_config: SamplingConfig, rules: RulesConfig,
                  max_new_tokens: int, seed: int, label_columns: dict) -> list[dict]:
    """Generate, score and label one batch of prompts; one row per prompt."""
    sampling = Sampling(**asdict(sampling_config))
    device = trio.target.device  # generators live where the draws are made (decode.rules.sample)
    generators = [torch.Generator(device=device).manual_seed(prompt_seed(seed, p.prompt_id)) for p in batch]
    tokenizer = trio.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    generated = generate_responses(
        trio.target,
        [p.token_ids for p in batch],
        sampling=sampling,
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad,
        generators=generators,
        vocab=trio.vocab,
    )
    q_logits = teacher_forced_logits(trio.draft, generated, trio.vocab)
    c_logits = teacher_forced_logits(trio.companion, generated, trio.vocab) if trio.companion is not None else None
    lengths = generated.response_lengths
    valid = generated.attention_mask[:, generated.prompt_width :].bool()
    y = draft_candidates(q_logits, lengths, sampling, generators)
    columns = batch_columns(
        generated.target_logits,
        q_logits,
        c_logits,
        y,
        valid,
        sampling=sampling,
        label_columns=label_columns,
        companion_rules=indicator_rules(rules),
    )
    per_row = {name: values.split(lengths) for name, values in columns.items()}
    rows = []
    for row, prompt in enumerate(batch):
        response = generated.response_ids(row)
        rows.append(
            {
                "prompt_id": prompt.prompt_id,
                "prompt_ids": prompt.token_ids,
                "response_ids": response.tolist(),
                "finished": bool(lengths[row] and response[-1].item() == tokenizer.eos_token_id),
                **{name: values[row].tolist() for name, values in per_row.items()},
            }
        )
    return rows


def collect_split(trio: Trio, job: CollectJob, split: str, root: Path, world: World) -> SplitProgress:
    """Collect the shards of ``split`` that this rank owns and that are not complete yet."""
    encoded, skipped = split_prompts(job.prompts, split, seed=job.seed, tokenizer=trio.tokenizer,
                                     context=context_length(trio), max_new_tokens=job.collect.max_new_tokens)
    shard_size = job.collect.shard_size
    shards = [encoded[i : i + shard_size] for i in range(0, len(encoded), shard_size)]
    done = {int(p.name.split("_")[1]) for p in complete_shards(root, split)}
    todo = [i for i in range(len(shards)) if world.owns(i) and i not in done]
    progress = SplitProgress(prompts_available=len(encoded), skipped=skipped, shards_total=len(shards))
    label_columns = label_rules(job.rules)
    column_names: list[str] | None = None
    started = time.perf_counter()
    bar = tqdm(total=sum(len(shards[i]) for i in todo), desc=f"collect {split}", unit="prompt",
               disable=not world.is_main and world.size > 1)
    for index in todo:
        rows: list[dict] = []
        for start in range(0, len(shards[index]), job.collect.batch_size):
            batch = shards[index][start : start + job.collect.batch_size]
            rows.extend(collect_batch(trio, batch, job.sampling, job.rules, job.collect.max_new_tokens,
                                      job.seed, label_columns))
            progress.response_tokens += sum(len(r["response_ids"]) for r in rows[-len(batch):])
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{progress.response_tokens / max(time.perf_counter() - started, 1e-9):.0f}")
        if column_names is None:
            column_names = [k for k in rows[0] if k not in ("prompt_id", "prompt_ids", "response_ids", "finished")]
        write_shard(root, split, index, rows, features_for(column_names))
        progress.shards_written += 1
    bar.close()
    progress.seconds = time.perf_counter() - started
    return progress


def context_length(trio: Trio) -> int:
    """The shortest context among the loaded models."""
    models = [m for m in (trio.target, trio.draft, trio.companion) if m is not None]
    return min(int(getattr(m.config, "max_position_embeddings", 10**9)) for m in models)


def collect(job: CollectJob) -> dict[str, Any]:
    """Run the collection described by ``job``; returns the manifest (None on ranks other than 0)."""
    world = init_world()
    started = time.perf_counter()
    try:
        torch.manual_seed(job.seed)
        trio = load_trio(job.models, job.paths.zoo_dir, with_companion=job.models.companion is not None)
        device = local_device(world)
        for model in (trio.target, trio.draft, trio.companion):
            if model is not None and getattr(model, "hf_device_map", None) is None:
                model.to(device)
        root = Path(job.paths.data_dir)
        if world.is_main:
            claim_directory(root, fingerprint(job, trio.description), overwrite=job.collect.overwrite)
            (root / MANIFEST_FILE).unlink(missing_ok=True)  # the manifest is rewritten when the run completes
        world.barrier()
        progress = {split: collect_split(trio, job, split, root, world) for split in job.collect.splits}
        world.barrier()
        manifest: CollectionManifest | None = None
        if world.is_main:
            manifest = build_manifest(job, trio, root, progress, time.perf_counter() - started, world.size)
            write_json_atomic(root / MANIFEST_FILE, manifest.to_dict())
            print_summary(manifest)
        return manifest
    finally:
        close_world(world)


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_entry(cfg, "data_gen.collect", lambda config: collect(config.collect_job()), check_prompt_choices)


if __name__ == "__main__":
    main()
