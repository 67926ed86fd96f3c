"""``python -m data_gen.collect [+exp=NAME] [overrides]``: collect labelled training data.

One target pass per prompt: the target samples a response and its per-step logits are kept; the
draft (and the companion) run once over the same tokens; every position gets the draft's sample,
divergences, one label per configured rule and, with a companion, each configured rule's SV
indicators (:mod:`data_gen.labels`). Every model's logits are sliced to the shared vocabulary
(:attr:`runtime.models.Trio.vocab`), as the decoder slices them. Output: HF ``datasets`` Arrow
shards per split plus ``manifest.json`` (see :mod:`data_gen.shards`). Safe to kill and re-run.

With ``responses=PATH`` the responses come from a file instead (:mod:`data_gen.responses`, e.g. written
by :mod:`data_gen.regenerate`): the target then runs one teacher-forced forward over each batch, like
the draft, and everything after that forward is the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import datasets
import hydra
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from ahconf.entry import CONF_DIR, run_entry
from ahconf.schema import CollectJob
from data_gen.distributed import World, close_world, init_world, local_device
from data_gen.generation import Batch, generate_responses, given_batch, round_depth_logits, teacher_forced_logits
from data_gen.labels import (
    base_column,
    batch_columns,
    depth_column,
    depth_columns,
    draft_candidates,
    indicator_rules,
    label_rules,
)
from data_gen.manifest import MANIFEST_VERSION, CollectionManifest, SplitProgress, build_manifest, print_summary
from data_gen.prompts import check_prompt_choices, split_prompts
from data_gen.responses import GivenResponse, ResponsesSource
from data_gen.shards import MANIFEST_FILE, claim_directory, complete_shards, write_json_atomic, write_shard
from decode.drafts import drafter_of
from decode.json_types import JSONDict
from decode.loops.prompt_input import pad_id
from decode.loops.runner import context_length as models_context
from decode.sampling import Sampling
from runtime.encoding import EncodedPrompt
from runtime.models import Trio, load_trio
from runtime.placement import place
from runtime.seeding import prompt_seed

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
        spec[name] = ints if base_column(name) in POSITION_INT_COLUMNS else floats
    return datasets.Features(spec)


def fingerprint(job: CollectJob, trio_description: JSONDict, source: ResponsesSource | None,
                depths: int = 1) -> JSONDict:
    """Everything that changes the collected data; a directory never mixes two fingerprints.

    ``manifest_version`` stands for the column schema: shards of an older schema are never resumed.
    Labelling given responses adds their source (path, content hash, sidecar); a feature draft's labels, their
    ``depths``.
    """
    return ({"depths": depths} if depths > 1 else {}) | {
        "manifest_version": MANIFEST_VERSION,
        "models": trio_description,
        "prompts": asdict(job.prompts),
        "sampling": asdict(job.sampling),
        "rules": asdict(job.rules),
        "max_new_tokens": job.collect.max_new_tokens,
        "shard_size": job.collect.shard_size,
        "seed": job.seed,
        "responses": None if source is None else source.describe(),
    }


@dataclass(frozen=True)
class Labeller:
    """What labelling a batch needs, built once per run: the models, the transform, the rules, the seed."""

    trio: Trio
    sampling: Sampling
    label_columns: dict
    companion_rules: list
    seed: int
    depths: int = 1  # depths of a round labelled (more than one where the draft kind's q depends on the depth)

    @classmethod
    def for_job(cls, trio: Trio, job: CollectJob) -> Labeller:
        depths = drafter_of(trio.draft).labelled_depths(job.collect.depths)
        return cls(trio, Sampling(**asdict(job.sampling)), label_rules(job.rules), indicator_rules(job.rules),
                   job.seed, depths)

    @property
    def pad_id(self) -> int:
        return pad_id(self.trio.tokenizer.pad_token_id, self.trio.tokenizer.eos_token_id)

    def generators(self, prompt_ids: list[str], stream: str = "") -> list[torch.Generator]:
        """One generator per prompt, on the device where the draws are made (decode.rules.sample)."""
        device = self.trio.target.device
        return [torch.Generator(device=device).manual_seed(prompt_seed(self.seed, p, stream)) for p in prompt_ids]

    def generate(self, batch: list[EncodedPrompt], max_new_tokens: int) -> list[dict]:
        """Sample the target's responses to ``batch`` (its logits kept), then label them; one row per prompt."""
        generated = generate_responses(
            self.trio.target,
            [p.token_ids for p in batch],
            sampling=self.sampling,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.trio.tokenizer.eos_token_id,
            pad_token_id=self.pad_id,
            generators=self.generators([p.prompt_id for p in batch]),
            vocab=self.trio.vocab,
        )
        return self.label(generated, [p.prompt_id for p in batch])

    def given(self, batch: list[GivenResponse]) -> list[dict]:
        """Label responses produced elsewhere: the target runs one teacher-forced forward, like the draft.

        On CPU the batch runs in consecutive parts of at most :data:`CPU_FORCED_TOKENS` padded tokens
        (a forward is compute-bound well before that, and narrower parts of length-sorted rows carry
        less padding); the rows are those of one pass, every step being row-wise.
        """
        rows: list[dict] = []
        for part in forced_parts(batch, self.trio.target.device):
            forced = given_batch(self.trio.target, [r.prompt_ids for r in part], [r.response_ids for r in part],
                                 pad_token_id=self.pad_id, vocab=self.trio.vocab)
            rows.extend(self.label(forced, [r.prompt_id for r in part]))
        return rows

    def label(self, batch: Batch, prompt_ids: list[str]) -> list[dict]:
        """Score ``batch`` with the draft and companion and compute every column; one row per prompt.

        The draft's candidates come from each prompt's own ``"draft"`` stream, so they depend on the
        prompt and the draft's logits only, not on how (or with whom) the response was produced.
        A depth-dependent draft (a feature draft) is labelled at every depth of a round
        (:func:`data_gen.generation.round_depth_logits`):
        depth 1 in the usual columns, depth ``d > 1`` in :func:`data_gen.labels.depth_columns` (candidates from the
        stream ``"draft@d<d>"``, no companion indicators).
        """
        trio = self.trio
        if drafter_of(trio.draft).depth_dependent:
            depth_logits = round_depth_logits(trio.target, trio.draft, batch, trio.vocab, self.depths)
        else:
            depth_logits = [teacher_forced_logits(trio.draft, batch, trio.vocab)]
        c_logits = teacher_forced_logits(trio.companion, batch, trio.vocab) if trio.companion is not None else None
        lengths = batch.response_lengths
        valid = batch.attention_mask[:, batch.prompt_width :].bool()
        response = batch.input_ids[:, batch.prompt_width :][valid]
        steps = valid.nonzero(as_tuple=True)[1]
        columns: dict[str, torch.Tensor] = {}
        for depth, q_logits in enumerate(depth_logits, 1):
            stream = depth_column("draft", depth)
            y = draft_candidates(q_logits, lengths, self.sampling, self.generators(prompt_ids, stream))
            at_depth = batch_columns(batch.target_logits, q_logits, c_logits if depth == 1 else None, y, response,
                                     valid, sampling=self.sampling, label_columns=self.label_columns,
                                     companion_rules=self.companion_rules)
            columns |= at_depth if depth == 1 else depth_columns(at_depth, depth, steps)
        per_row = {name: values.split(lengths) for name, values in columns.items()}
        eos = trio.tokenizer.eos_token_id
        rows = []
        for row, prompt_id in enumerate(prompt_ids):
            tokens = batch.response_ids(row)
            rows.append(
                {
                    "prompt_id": prompt_id,
                    "prompt_ids": batch.prompt_ids(row),
                    "response_ids": tokens.tolist(),
                    "finished": bool(lengths[row] and tokens[-1].item() == eos),
                    **{name: values[row].tolist() for name, values in per_row.items()},
                }
            )
        return rows


#: Padded tokens per teacher-forced part of a batch of given responses on CPU: the tiny target's forward runs
#: faster in parts this size than over a whole batch at once (docs/log/figures-behind-the-defaults.md).
CPU_FORCED_TOKENS = 2048


def forced_parts(batch: list[GivenResponse], device: torch.device) -> list[list[GivenResponse]]:
    """``batch`` cut into consecutive parts whose padded width × rows stays within :data:`CPU_FORCED_TOKENS`
    (on CPU; elsewhere the whole batch)."""
    if device.type != "cpu":
        return [batch]
    parts: list[list[GivenResponse]] = [[]]
    prompt_width = response_width = 0
    for row in batch:
        prompt_width = max(prompt_width, len(row.prompt_ids))
        response_width = max(response_width, len(row.response_ids))
        if parts[-1] and (prompt_width + response_width) * (len(parts[-1]) + 1) > CPU_FORCED_TOKENS:
            parts.append([])
            prompt_width, response_width = len(row.prompt_ids), len(row.response_ids)
        parts[-1].append(row)
    return parts


@dataclass(frozen=True)
class SplitWork:
    """One split's items (prompts to generate from, or given responses) and what was skipped.

    ``by_length``: batch the items of a shard in order of length (given responses: a teacher-forced
    batch is as wide as its longest row, so similar lengths waste less on padding); the shard keeps
    its items' order either way.
    """

    items: list[EncodedPrompt] | list[GivenResponse]
    skipped: dict[str, int]
    label: Callable[[list], list[dict]]
    by_length: bool = False

    def label_shard(self, shard: list, batch_size: int, done: Callable[[list[dict]], None]) -> list[dict]:
        """The rows of ``shard`` in its order, labelled ``batch_size`` items at a time (``done`` after each batch)."""
        rows: list[dict] = [{} for _ in shard]
        for batch in batches_of(shard, batch_size, by_length=self.by_length):
            labelled = self.label([shard[i] for i in batch])
            for i, row in zip(batch, labelled):
                rows[i] = row
            done(labelled)
        return rows


def batches_of(items: list, batch_size: int, *, by_length: bool) -> list[list[int]]:
    """Indices of ``items`` in batches of ``batch_size``: in order, or in order of ``len(prompt) + len(response)``."""
    order = list(range(len(items)))
    if by_length:
        order.sort(key=lambda i: len(items[i].prompt_ids) + len(items[i].response_ids))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def split_work(labeller: Labeller, job: CollectJob, split: str, source: ResponsesSource | None) -> SplitWork:
    """What to do for ``split``: generate from the run's prompts, or label the source's responses."""
    context = context_length(labeller.trio)
    if source is None:
        encoded, skipped = split_prompts(job.prompts, split, seed=job.seed, tokenizer=labeller.trio.tokenizer,
                                         context=context, max_new_tokens=job.collect.max_new_tokens)
        return SplitWork(encoded, skipped, lambda batch: labeller.generate(batch, job.collect.max_new_tokens))
    tokenized = source.split(split, labeller.trio.tokenizer, job, context)
    return SplitWork(tokenized.rows, dict(tokenized.skipped), labeller.given, by_length=True)


def collect_split(labeller: Labeller, job: CollectJob, split: str, root: Path, world: World,
                  source: ResponsesSource | None) -> SplitProgress:
    """Collect the shards of ``split`` that this rank owns and that are not complete yet."""
    work = split_work(labeller, job, split, source)
    shard_size = job.collect.shard_size
    shards = [work.items[i : i + shard_size] for i in range(0, len(work.items), shard_size)]
    done = {int(p.name.split("_")[1]) for p in complete_shards(root, split)}
    todo = [i for i in range(len(shards)) if world.owns(i) and i not in done]
    progress = SplitProgress(prompts_available=len(work.items), skipped=work.skipped, shards_total=len(shards))
    column_names: list[str] | None = None
    started = time.perf_counter()
    verb = "collect" if source is None else "label"
    bar = tqdm(total=sum(len(shards[i]) for i in todo), desc=f"{verb} {split}", unit="prompt",
               disable=not world.is_main and world.size > 1)

    def done(batch: list[dict]) -> None:
        progress.response_tokens += sum(len(r["response_ids"]) for r in batch)
        bar.update(len(batch))
        bar.set_postfix(tok_s=f"{progress.response_tokens / max(time.perf_counter() - started, 1e-9):.0f}")

    for index in todo:
        rows = work.label_shard(shards[index], job.collect.batch_size, done)
        if column_names is None:
            column_names = [k for k in rows[0] if k not in ("prompt_id", "prompt_ids", "response_ids", "finished")]
        write_shard(root, split, index, rows, features_for(column_names))
        progress.shards_written += 1
    bar.close()
    progress.seconds = time.perf_counter() - started
    return progress


def context_length(trio: Trio) -> int:
    """The shortest context among the loaded models."""
    return models_context([m for m in (trio.target, trio.draft, trio.companion) if m is not None]) or 10**9


def collect(job: CollectJob) -> CollectionManifest | None:
    """Run the collection described by ``job``; returns the manifest (None on ranks other than 0)."""
    world = init_world()
    started = time.perf_counter()
    try:
        torch.manual_seed(job.seed)
        trio = load_trio(job.models, job.paths.zoo_dir, with_companion=job.models.companion is not None)
        place(trio, local_device(world))
        source = None if job.responses is None else ResponsesSource.open(job.responses, job.models.target, job.sampling)
        root = Path(job.paths.data_dir)
        labeller = Labeller.for_job(trio, job)
        if world.is_main:
            claim_directory(root, fingerprint(job, trio.description.to_dict(), source, labeller.depths),
                            overwrite=job.collect.overwrite)
            (root / MANIFEST_FILE).unlink(missing_ok=True)  # the manifest is rewritten when the run completes
        world.barrier()
        progress = {split: collect_split(labeller, job, split, root, world, source) for split in job.collect.splits}
        world.barrier()
        manifest: CollectionManifest | None = None
        if world.is_main:
            manifest = build_manifest(job, trio, root, progress, time.perf_counter() - started, world.size,
                                      None if source is None else source.record())
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
