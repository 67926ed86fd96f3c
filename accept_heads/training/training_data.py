"""Training data for acceptance heads: collected splits → labelled positions → mixed batches.

**Labels.** The label of response position ``t`` is the training rule's column (``label_<rule>``;
fuzzy: ``1[div_t < T]`` on the stored divergence column), read through :meth:`decode.rules.Rule.labels_from`.
Greedy labels belong to the candidate ``argmax q_t`` (column ``draft_argmax``); every other rule's candidate is
the sample ``y_t`` (column ``draft_token``). Labels are the acceptance at the *true* prefix (target tokens).

**Companion indicators** (SV profiles, ``pre`` heads with ``head.use_companion``): the training
rule's own columns ``sv_x_<rule>``, ``sv_y_<rule>`` (:func:`data_gen.labels.companion_columns`),
i.e. :func:`decode.profile.companion_indicators` under that rule's transform and of its candidate,
as its SV policy or head computes them at decode time.

**Outcomes.** AUROC needs binary outcomes: ``o_t = 1[u_t < a_t]`` with ``u_t ~ U(0, 1)`` drawn once
per split from ``seed`` (hard labels give ``o_t = a_t``). Fixed across epochs and ranks.

**Token mixing** (DESIGN §2). The head's input sequence replaces each response token ``x_t`` by
the candidate ``y_t`` with probability ``1 - r``. A ``post`` head (the paper's) takes its loss at
exactly those positions, since its input consumes ``z_t = y_t``. A ``pre`` head's input at ``t`` reads
only the prefix ``z_<t`` (and features of ``y_t`` under the ``q_t`` it produces), so it takes its loss at
every response position and ``r`` only shapes the prefix; with ``r = 1`` the prefix is the target's
own, exactly where ``y_t`` was sampled and ``a_t`` computed. The draw of row ``i`` is a pure function
of ``(seed, split, epoch, i)``: train rows are redrawn every epoch (``epoch`` = the trainer's current
epoch), dev rows use one fixed draw (``epoch = 0``). So mixing is reproducible, independent of batch
composition, workers and DDP sharding. A mixed prefix holds draft tokens while the label was
computed on the target's prefix: the paper's approximation.

**Order and resume.** Epoch ``e`` visits the train rows in :func:`epoch_order` (a pure function of ``(seed, e)``; under
DDP Lightning's seeded ``DistributedSampler`` instead), and every checkpoint records the batches the train loader
(:class:`ResumableLoader`) has served in the epoch (the datamodule's state), so a run resumed from ``last.ckpt``, at an
epoch's end or in its middle, trains on the same batches in the same order as one never stopped.

**Feature cache** (``trainer.feature_cache=true``): the draft's head inputs for one fixed mixing
draw (``epoch = 0`` for train too) are stored under ``<data_dir>/feature_cache/<key>/<split>.safetensors``
so that many heads train without running the draft. Disk cost per labelled position (≈ ``1 - r``
of all response tokens): ``hidden_size × 2`` bytes (bfloat16 draft) or ``× 4`` (float32), plus
``4 × (F + 2)`` bytes of features and indices — e.g. 8 KiB per position for Llama-2-7B in bfloat16.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pyarrow as pa
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, RandomSampler

from ahconf.rule_config import build_rule
from ahconf.schema import ConfigError, HeadTrainConfig, RulesConfig
from data_gen.labels import candidate_column, companion_columns, depth_column, stored_depths
from data_gen.manifest import CollectionManifest
from data_gen.shards import load_split, write_json_atomic
from decode import rules as rule_defs
from decode.json_types import JSONDict

SPLIT_CODES = {"train": 0, "dev": 1, "test": 2}


def training_rule(head: HeadTrainConfig, rules: RulesConfig) -> rule_defs.Rule:
    """The rule whose acceptance the head learns: ``head.rule`` as configured by ``rules``."""
    return build_rule(head.rule, rules)


def check_rule_in_manifest(manifest: CollectionManifest, rule: rule_defs.Rule) -> None:
    """Refuse a rule whose labels the data does not hold (or holds with other parameters); a rule labelled from
    other stored columns (:meth:`~decode.rules.Rule.labelled` none: fuzzy) has any parameters."""
    if not rule.labelled():
        return
    column = rule.label_column
    stored = manifest.rules.get(column)
    if stored != rule.spec():
        have = ", ".join(f"{c}={s}" for c, s in manifest.rules.items()) or "none"
        raise ConfigError(
            f"head.rule={rule.name} needs labels {rule.spec()} (column {column}) but the data holds: {have}; "
            f"collect with that rule in rules.names (and the same rules.params.{rule.name}) or pick another head.rule"
        )


@dataclass
class PositionTable:
    """One split flattened to per-position arrays; row ``i`` owns ``[offsets[i], offsets[i+1])``."""

    prompts: list[np.ndarray]
    prompt_keys: list[str]  # each row's prompt_id (its decoding seed: runtime.seeding.prompt_seed)
    offsets: np.ndarray  # [R + 1]
    response: np.ndarray  # [N] target tokens x_t
    candidate: np.ndarray  # [N] the rule's draft candidate y_t; [N, D] at depths 1..D of a round (feature draft)
    label: np.ndarray  # [N] acceptance target a_t ([N, D]: NaN where no round reaches t at that depth)
    outcome: np.ndarray  # [N] sampled 0/1 outcome for AUROC ([N, D])
    companion: np.ndarray | None  # [N, 2] the rule's SV indicators (X_t, Y_t) at the true prefix
    request: np.ndarray  # [N] the row's running rate of accepted first candidates before t (request_rates)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def positions(self) -> int:
        return int(self.offsets[-1])

    def row(self, index: int) -> slice:
        return slice(int(self.offsets[index]), int(self.offsets[index + 1]))


def _flat(table: pa.Table, name: str, dtype: type) -> np.ndarray:
    return table.column(name).combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(dtype)


def label_depths(data_dir: str | Path, rule: rule_defs.Rule) -> int:
    """How many depths of a round the train split labels for ``rule`` (1 but for a feature draft's data)."""
    return stored_depths(load_split(data_dir, "train").column_names, rule.label_column)


def load_positions(
    data_dir: str | Path, split: str, rule: rule_defs.Rule, *, seed: int, with_companion: bool, depths: int = 1,
    expected: bool = False,
) -> PositionTable:
    """Read ``split`` and flatten it; labels per :func:`training_rule`, outcomes drawn from ``seed``.

    ``with_companion`` also reads ``rule``'s companion indicators (see the module docstring). ``depths > 1``
    reads a feature draft's candidates and labels at depths ``1 .. depths`` (:func:`data_gen.labels.depth_column`)
    as ``[N, depths]`` columns. ``expected``: the labels are the acceptance expected before the draw
    (:func:`expected_labels`) rather than the candidate's own.
    """
    dataset = load_split(data_dir, split)
    table = dataset.data.table
    column = rule.label_column
    if depths > 1 and with_companion:
        raise ConfigError("the companion's indicators are stored at depth 1 only: a head reading them trains on "
                          "depth 1 (a draft without depths) or without head.use_companion")
    wanted = [depth_column(c, d) for c in (column, candidate_column(rule)) for d in range(1, depths + 1)]
    missing = [c for c in wanted if c not in dataset.column_names]
    indicators = companion_columns(rule)
    if with_companion and not {indicators["x"], indicators["y"]} <= set(dataset.column_names):
        missing.append(f"{indicators['x']} / {indicators['y']} (collect with a companion model and "
                       f"'{rule.name}' in rules.names)")
    if missing:
        raise ConfigError(f"the {split} data at {data_dir} lacks columns {missing}")
    lengths = np.asarray([len(r) for r in dataset["response_ids"]], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])

    def by_depth(name: str, dtype: type) -> np.ndarray:
        values = [_flat(table, depth_column(name, d), dtype) for d in range(1, depths + 1)]
        return values[0] if depths == 1 else np.stack(values, axis=1)

    label = rule.labels_from(torch.from_numpy(by_depth(column, np.float32))).numpy()
    if expected:
        label = expected_labels(rule, label, lambda name: by_depth(name, np.float32))
    rng = np.random.default_rng([seed, SPLIT_CODES[split]])
    outcome = (rng.random(label.shape) < label).astype(np.float32)
    companion = None
    if with_companion:
        companion = np.stack([_flat(table, indicators["x"], np.float32), _flat(table, indicators["y"], np.float32)],
                             axis=1)
    prompts = [np.asarray(p, dtype=np.int64) for p in dataset["prompt_ids"]]
    if any(p.size == 0 for p in prompts):
        raise ConfigError(f"the {split} data holds an empty prompt; a head input needs at least one prompt token")
    return PositionTable(
        prompts=prompts,
        prompt_keys=list(dataset["prompt_id"]),
        offsets=offsets,
        response=_flat(table, "response_ids", np.int64),
        candidate=by_depth(candidate_column(rule), np.int64),
        label=label,
        outcome=outcome,
        companion=companion,
        request=request_rates(outcome if outcome.ndim == 1 else outcome[:, 0], offsets),
    )


def request_rates(first_outcomes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``[N]``: at each position ``t`` of a row, ``(a + 1) / (t + 2)`` with ``a`` the accepted depth-1 outcomes of the
    row's positions before ``t`` (:data:`decode.head_config.REQUEST_FEATURE`: what the decoder counts over the
    request's verified rounds, here over every earlier position a round could have started at)."""
    before = np.concatenate([[0.0], np.cumsum(first_outcomes, dtype=np.float64)])
    starts = np.repeat(offsets[:-1], np.diff(offsets))
    steps = np.arange(len(first_outcomes)) - starts
    return ((before[:-1] - before[starts] + 1) / (steps + 2)).astype(np.float32)


def expected_labels(rule: rule_defs.Rule, labels: np.ndarray, stored: Any) -> np.ndarray:
    """The acceptance expected before the candidate is drawn (DSpark's soft target; DESIGN §5, "Acceptance before
    the draw"): ``1 − TV(p, q)`` for the speculative rule, from the stored ``tv`` column (``stored(name)`` reads a
    column at the labels' depths); a rule whose label does not depend on the draw (greedy, fuzzy) keeps its labels,
    and so does an ensemble rule, whose ``1 − TV(r, q)`` is not stored (its labels' mean given the state is it)."""
    if rule.name == "speculative":
        return 1.0 - stored("tv")
    return labels


def mixing_mask(length: int, r: float, seed: int, split: str, epoch: int, row: int) -> np.ndarray:
    """``True`` where ``z_t = y_t`` (a loss position): probability ``1 - r``, seeded per row and epoch."""
    return np.random.default_rng([seed, SPLIT_CODES[split], epoch, row]).random(length) >= r


@dataclass(frozen=True)
class SequenceItem:
    """One row of a :class:`PositionTable`, unmixed: its prompt and, per response position ``[N]``, the rest."""

    row: int  # the row's index in its split (seeds its mixing)
    prompt: np.ndarray  # [P] prompt token ids
    response: np.ndarray  # [N] target tokens x_t
    candidate: np.ndarray  # [N] or [N, D] the rule's draft candidate y_t (per depth)
    label: np.ndarray  # [N] or [N, D] acceptance target a_t
    outcome: np.ndarray  # [N] or [N, D] sampled 0/1 outcome
    companion: np.ndarray | None  # [N, 2] the rule's SV indicators (X_t, Y_t), None: not read
    request: np.ndarray  # [N] the request's running acceptance before t


class SequenceDataset(Dataset):
    """Rows of a :class:`PositionTable` as unmixed sequences (mixing happens per batch)."""

    def __init__(self, table: PositionTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> SequenceItem:
        t, span = self.table, self.table.row(index)
        return SequenceItem(row=index, prompt=t.prompts[index], response=t.response[span], candidate=t.candidate[span],
                        label=t.label[span], outcome=t.outcome[span],
                        companion=None if t.companion is None else t.companion[span], request=t.request[span])


def collate_sequences(items: list[SequenceItem]) -> dict[str, Tensor]:
    """Right-pad ``[prompt, response]`` rows; per-token tensors are aligned with ``input_ids`` (``[B, W]``, or
    ``[B, W, D]`` per depth)."""
    width = max(len(i.prompt) + len(i.response) for i in items)
    batch = len(items)
    depths = items[0].candidate.shape[1:]
    input_ids = torch.zeros(batch, width, dtype=torch.long)
    attention_mask = torch.zeros(batch, width, dtype=torch.long)
    is_response = torch.zeros(batch, width, dtype=torch.bool)
    candidate = torch.zeros(batch, width, *depths, dtype=torch.long)
    label = torch.zeros(batch, width, *depths)
    outcome = torch.zeros(batch, width, *depths)
    companion = torch.zeros(batch, width, 2)
    request = torch.zeros(batch, width)
    for b, item in enumerate(items):
        p, n = len(item.prompt), len(item.response)
        input_ids[b, :p] = torch.from_numpy(item.prompt)
        input_ids[b, p : p + n] = torch.from_numpy(item.response)
        attention_mask[b, : p + n] = 1
        is_response[b, p : p + n] = True
        candidate[b, p : p + n] = torch.from_numpy(item.candidate)
        label[b, p : p + n] = torch.from_numpy(item.label)
        outcome[b, p : p + n] = torch.from_numpy(item.outcome)
        request[b, p : p + n] = torch.from_numpy(item.request)
        if item.companion is not None:
            companion[b, p : p + n] = torch.from_numpy(item.companion)
    return {
        "row": torch.tensor([i.row for i in items], dtype=torch.long),
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "is_response": is_response,
        "candidate": candidate,
        "label": label,
        "outcome": outcome,
        "companion": companion,
        "request": request,
    }


def mix_batch(
    batch: dict[str, Tensor], r: float, seed: int, split: str, epoch: int, *, every_position: bool = False
) -> dict[str, Tensor]:
    """Token mixing in place: put ``y_t`` into ``input_ids`` where drawn.

    ``loss_mask`` marks the drawn positions (``post`` heads, whose input consumes ``z_t = y_t``), or
    every response position with ``every_position`` (``pre`` heads, whose input at ``t`` reads only
    the prefix ``z_<t``; mixing then only shapes that prefix). ``r = 1`` draws nothing: the target's own prefix
    (the only choice for candidates per depth, whose round is itself their prefix).
    """
    mixed = torch.zeros_like(batch["is_response"])
    if r < 1:
        for b, row in enumerate(batch["row"].tolist()):
            positions = batch["is_response"][b].nonzero().squeeze(-1)
            draws = torch.from_numpy(mixing_mask(positions.numel(), r, seed, split, epoch, row))
            mixed[b, positions[draws]] = True
        batch["input_ids"] = torch.where(mixed, batch["candidate"], batch["input_ids"])
    batch["loss_mask"] = batch["is_response"].clone() if every_position else mixed
    return batch


def labelled_positions(hidden: Tensor, features: Tensor | None, labels: Tensor, outcomes: Tensor
                       ) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
    """Head inputs ``[M(, D), ·]`` and labels ``[M(, D)]`` flattened over depths, without the positions no round
    reaches at a depth (NaN labels)."""
    labels, outcomes = labels.reshape(-1), outcomes.reshape(-1)
    kept = ~labels.isnan()
    hidden = hidden.reshape(-1, hidden.shape[-1])[kept]
    if features is not None:
        features = features.reshape(-1, features.shape[-1])[kept]
    return hidden, features, labels[kept], outcomes[kept]


def loss_everywhere(timing: str) -> bool:
    """Whether a head of this input ``timing`` takes its loss at every response position (``pre``)."""
    return timing == "pre"


class CachedDataset(Dataset):
    """Rows of precomputed head inputs: item ``i`` is every cached loss position of row ``i`` (with its row and its
    position in the response: ``entry_row``, ``entry_position``)."""

    def __init__(self, tensors: dict[str, Tensor], table: PositionTable) -> None:
        self.hidden, self.features = tensors["hidden"], tensors.get("features")
        flat = tensors["flat_index"]
        self.label = torch.from_numpy(table.label)[flat]
        self.outcome = torch.from_numpy(table.outcome)[flat]
        self.offsets = tensors["row_offsets"].tolist()
        starts = np.repeat(table.offsets[:-1], np.diff(table.offsets))  # [N] each position's row start
        self.position = flat - torch.from_numpy(starts)[flat]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        span = slice(self.offsets[index], self.offsets[index + 1])
        item = {"hidden": self.hidden[span].float(), "label": self.label[span], "outcome": self.outcome[span],
                "entry_row": torch.full((span.stop - span.start,), index), "entry_position": self.position[span]}
        if self.features is not None:
            item["features"] = self.features[span]
        return item


def collate_cached(items: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Concatenate the positions of several rows (the batch size still counts sequences)."""
    return {key: torch.cat([i[key] for i in items]) for key in items[0]}


def cache_key(description: JSONDict) -> str:
    """Directory name of a feature cache: a hash of everything its tensors depend on."""
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]


def epoch_order(size: int, seed: int, epoch: int, batch_size: int, workers: int = 0) -> list[int]:
    """The train rows' order in ``epoch``, whichever epoch a run starts or resumes in: the order a shuffling
    ``DataLoader`` (``batch_size``, ``workers``) with a generator seeded ``seed`` gives an uninterrupted Lightning run
    there, replayed from the seed, so a head trains on the batches it trained on before resuming was exact. Each epoch
    draws its iterator's base seed and its permutation from that one generator, and the sampler's (empty) remainder
    too where the epoch's iterator runs the sampler out: a last batch short of ``batch_size`` is filled until it does,
    and worker processes prefetch past the end (Lightning stops at the loader's length otherwise)."""
    runs_out = size % batch_size != 0 or workers > 0
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epoch + 1):
        torch.empty((), dtype=torch.int64).random_(generator=generator)  # the epoch's iterator: its workers' base seed
        order = torch.randperm(size, generator=generator)
        if runs_out:
            torch.randperm(size, generator=generator)  # the sampler's remainder
    return order.tolist()


class EpochShuffle(RandomSampler):
    """The train rows in :func:`epoch_order` for the epoch Lightning sets (``set_epoch``). A ``RandomSampler``: under
    DDP Lightning replaces it with its own seeded ``DistributedSampler``, as it replaces a shuffling loader's."""

    def __init__(self, data_source: Dataset, seed: int, batch_size: int, workers: int) -> None:
        super().__init__(data_source)
        self.seed, self.batch_size, self.workers, self.epoch = seed, batch_size, workers, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        yield from epoch_order(len(self.data_source), self.seed, self.epoch, self.batch_size, self.workers)


@dataclass
class LoaderPosition:
    """Where the train loader is: the epoch it serves and the batches it has served in it (what a checkpoint records,
    :meth:`AcceptanceDataModule.state_dict`); ``skip``: the batches its next epoch skips (a resumed run's)."""

    epoch: int = 0
    served: int = 0
    skip: int = 0


class ResumableLoader(DataLoader):
    """The train loader, resumable mid-epoch: it counts the batches it serves in ``position`` (an argument, so the
    loader Lightning rebuilds under DDP counts in the same one) and skips (draws and drops) the first
    ``position.skip`` of its next epoch: those a resumed run trained on before it stopped."""

    def __init__(self, *args: Any, position: LoaderPosition, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.position = position

    def __iter__(self):
        position = self.position
        skip, position.skip, position.served = position.skip, 0, 0
        position.epoch = int(getattr(self.sampler, "epoch", 0))
        for batch in super().__iter__():
            position.served += 1
            if position.served > skip:
                yield batch


class AcceptanceDataModule(L.LightningDataModule):
    """Train / dev loaders over the collected data, with seeded per-epoch token mixing.

    ``encoder`` (only with a feature cache) turns a mixed batch into head inputs; the cache is
    built once in :meth:`prepare_data` (global rank 0 of each node) and read by every rank.
    """

    def __init__(
        self,
        data_dir: str | Path,
        rule: rule_defs.Rule,
        head: HeadTrainConfig,
        *,
        seed: int,
        batch_size: int,
        num_workers: int = 0,
        cache_description: JSONDict | None = None,
        encoder: Any = None,
        depths: int = 1,
    ) -> None:
        super().__init__()
        self.data_dir = Path(data_dir)
        self.rule, self.head, self.seed, self.depths = rule, head, seed, depths
        self.batch_size, self.num_workers = batch_size, num_workers
        self.cache_description, self.encoder = cache_description, encoder
        self.tables: dict[str, PositionTable] = {}
        self.position = LoaderPosition()

    def table(self, split: str) -> PositionTable:
        """The split's positions (read once)."""
        if split not in self.tables:
            self.tables[split] = load_positions(
                self.data_dir, split, self.rule, seed=self.seed, with_companion=self.head.use_companion,
                depths=self.depths, expected=self.head.target == "expected",
            )
        return self.tables[split]

    @property
    def cache_dir(self) -> Path | None:
        if self.cache_description is None:
            return None
        return self.data_dir / "feature_cache" / cache_key(self.cache_description)

    def prepare_data(self) -> None:
        cache = self.cache_dir
        if cache is None:
            return
        if self.trainer is not None:
            self.encoder.to(self.trainer.strategy.root_device)
        for split in ("train", "dev"):
            if not (cache / f"{split}.safetensors").is_file():
                build_feature_cache(self, split, cache)
        write_json_atomic(cache / "cache.json", self.cache_description or {})

    def mean_train_label(self) -> float:
        """Mean acceptance target on train: the constant predictor's prediction."""
        return float(np.nanmean(self.table("train").label))

    def _dataset(self, split: str) -> Dataset:
        cache = self.cache_dir
        if cache is None:
            return SequenceDataset(self.table(split))
        return CachedDataset(load_file(str(cache / f"{split}.safetensors")), self.table(split))

    def train_dataloader(self) -> DataLoader:
        """The train loader, at the position of the checkpoint a run resumes from (:meth:`load_state_dict`)."""
        dataset, position = self._dataset("train"), self.position
        sampler = EpochShuffle(dataset, self.seed, self.batch_size, self.num_workers)
        loader = ResumableLoader(
            dataset, batch_size=self.batch_size, sampler=sampler, collate_fn=self._collate,
            num_workers=self.num_workers, generator=torch.Generator().manual_seed(self.seed),  # the workers' seeds
            position=position,
        )
        epoch, served = (position.epoch + 1, 0) if position.served >= len(loader) else (position.epoch, position.served)
        loader.sampler.set_epoch(epoch)  # before Lightning creates the iterator (its workers draw indices at once)
        position.skip = served
        return loader

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self._dataset("dev"), batch_size=self.batch_size, shuffle=False, collate_fn=self._collate,
                          num_workers=self.num_workers)

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint records of the data: the train loader's epoch and the batches it has served in it."""
        return {"train_epoch": self.position.epoch, "train_served": self.position.served}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Resume at a checkpoint's position (Lightning calls this before it asks for the train loader)."""
        self.position = LoaderPosition(epoch=state_dict["train_epoch"], served=state_dict["train_served"])

    @property
    def _collate(self) -> Any:
        return collate_sequences if self.cache_dir is None else collate_cached

    def on_before_batch_transfer(self, batch: dict[str, Tensor], dataloader_idx: int) -> dict[str, Tensor]:
        if "input_ids" not in batch:  # cached head inputs: mixed when the cache was built
            return batch
        training = self.trainer is not None and self.trainer.training
        split, epoch = ("train", self.trainer.current_epoch) if training else ("dev", 0)
        return mix_batch(batch, self.head.mixing_r, self.seed, split, epoch,
                         every_position=loss_everywhere(self.head.timing))


@torch.no_grad()
def build_feature_cache(datamodule: AcceptanceDataModule, split: str, cache: Path) -> None:
    """Run the draft once over ``split`` with the fixed ``epoch = 0`` mixing and store the head inputs."""
    table = datamodule.table(split)
    loader = DataLoader(SequenceDataset(table), batch_size=datamodule.batch_size, collate_fn=collate_sequences)
    hidden, features, flat_index, counts = [], [], [], [0] * len(table)
    for batch in loader:
        batch = mix_batch(batch, datamodule.head.mixing_r, datamodule.seed, split, 0,
                          every_position=loss_everywhere(datamodule.head.timing))
        h, f = datamodule.encoder(batch)
        rows, positions = batch["loss_mask"].nonzero(as_tuple=True)
        starts = torch.from_numpy(table.offsets)[batch["row"][rows]]
        first = batch["attention_mask"].sum(-1)[rows] - batch["is_response"].sum(-1)[rows]
        flat_index.append(starts + positions - first)
        for row in batch["row"][rows].tolist():
            counts[row] += 1
        hidden.append(h.cpu())
        if f is not None:
            features.append(f.cpu())
    tensors = {
        "hidden": torch.cat(hidden),
        "flat_index": torch.cat(flat_index),
        "row_offsets": torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.long),
    }
    if features:
        tensors["features"] = torch.cat(features)
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f".{split}.safetensors.tmp"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(partial))
    partial.replace(cache / f"{split}.safetensors")
