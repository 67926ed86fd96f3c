"""Train a feature draft on the teacher shards with Lightning: soft cross-entropy to the target plus EAGLE's
feature regression, at every depth of an unrolled round (``docs/design.md`` §8).

Depth 1 reads the target's features (shifted one position); depth ``d > 1`` reads the draft's own outputs of
depth ``d − 1`` (EAGLE-3's training-time test), so a candidate far into a round is trained as it is drafted.
Batch ``i`` is a function of the seed and ``i`` alone and the sampler starts at the restored step, so a run
resumed from its ``last.ckpt`` takes the very steps an uninterrupted one would (none twice, none skipped).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from safetensors import safe_open
from torch import Tensor
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from data_gen.schedule import warmup_cosine
from decode.feature_draft import FeatureDraftForCausalLM


@dataclass(frozen=True)
class FeatureTraining:
    """Every knob of a feature draft's training."""

    steps: int = 2000
    tokens_per_step: int = 8192
    max_length: int = 512  # longer sequences are cut
    lr: float = 1e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    unroll: int = 3  # depths trained per position (1: the target's features only, EAGLE-1)
    regression_weight: float = 0.5  # of the feature regression (smooth L1) beside the soft cross-entropy
    held_out_sequences: int = 128  # the last sequences of the last shard: never trained on
    checkpoint_every: int = 100
    seed: int = 0
    depth_weights: tuple[float, ...] = field(default=())  # per depth (default: all 1)

    def weight(self, depth: int) -> float:
        """The loss weight of depth ``depth`` (1-based)."""
        return self.depth_weights[depth - 1] if self.depth_weights else 1.0


@dataclass(frozen=True)
class SequenceRef:
    """One teacher sequence: which shard, where it starts, how long (cut to ``max_length``)."""

    shard: int
    start: int
    length: int


class TeacherData:
    """The teacher shards in memory: tokens ``[N]``, features ``[N, F]``, top-k ``[N, k]`` per shard."""

    def __init__(self, paths: list[Path], max_length: int) -> None:
        self.shards: list[dict[str, Tensor]] = []
        self.sequences: list[SequenceRef] = []
        for index, path in enumerate(paths):
            with safe_open(str(path), "pt") as handle:
                shard = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (a safetensors handle, not a dict)
            self.shards.append(shard)
            starts = torch.cumsum(shard["lengths"].long(), 0) - shard["lengths"].long()
            self.sequences += [SequenceRef(index, int(s), min(int(n), max_length))
                               for s, n in zip(starts, shard["lengths"])]

    @property
    def positions(self) -> int:
        """Positions in all sequences (as cut)."""
        return sum(ref.length for ref in self.sequences)

    def batch(self, refs: list[SequenceRef]) -> dict[str, Tensor]:
        """Right-padded ``ids [B, L]``, ``features [B, L, F]``, ``top_ids / top_probs [B, L, k]``, ``mask [B, L]``."""
        width = max(ref.length for ref in refs)
        first = self.shards[refs[0].shard]
        out = {
            "ids": torch.zeros(len(refs), width, dtype=torch.long),
            "features": torch.zeros(len(refs), width, first["features"].shape[-1], dtype=first["features"].dtype),
            "top_ids": torch.zeros(len(refs), width, first["top_ids"].shape[-1], dtype=torch.long),
            "top_probs": torch.zeros(len(refs), width, first["top_probs"].shape[-1]),
            "mask": torch.zeros(len(refs), width, dtype=torch.bool),
        }
        for row, ref in enumerate(refs):
            shard, span = self.shards[ref.shard], slice(ref.start, ref.start + ref.length)
            out["ids"][row, :ref.length] = shard["tokens"][span].long()
            out["features"][row, :ref.length] = shard["features"][span]
            out["top_ids"][row, :ref.length] = shard["top_ids"][span].long()
            out["top_probs"][row, :ref.length] = shard["top_probs"][span].float()
            out["mask"][row, :ref.length] = True
        return out


def batch_plan(refs: list[SequenceRef], tokens: int, steps: int, seed: int) -> list[list[SequenceRef]]:
    """Batch ``i`` of the run, for every ``i < steps``: epochs of seeded permutations packed to ``tokens``."""
    if sum(ref.length for ref in refs) < tokens:
        raise ValueError(f"the training sequences hold fewer than one step's {tokens} tokens; make more shards")
    plan: list[list[SequenceRef]] = []
    epoch = 0
    while len(plan) < steps:
        order = torch.randperm(len(refs), generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()
        current, size = [], 0
        for index in order:
            current.append(refs[index])
            size += refs[index].length
            if size >= tokens:
                plan.append(current)
                current, size = [], 0
        epoch += 1
    return plan[:steps]


def in_order(refs: list[SequenceRef], tokens: int) -> list[list[SequenceRef]]:
    """``refs`` in their order, cut into batches of about ``tokens`` (the last may be smaller)."""
    batches, current, size = [], [], 0
    for ref in refs:
        current.append(ref)
        size += ref.length
        if size >= tokens:
            batches.append(current)
            current, size = [], 0
    return batches + ([current] if current else [])


class StepBatches(Dataset):
    """Item ``i``: batch ``i`` of the plan, collated."""

    def __init__(self, data: TeacherData, plan: list[list[SequenceRef]]) -> None:
        self.data, self.plan = data, plan

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, step: int) -> dict[str, Tensor]:
        return self.data.batch(self.plan[step])


class FromStep(Sampler[int]):
    """Steps from the trainer's restored ``global_step`` on (read when the epoch's iteration starts)."""

    def __init__(self, module: L.LightningModule, steps: int) -> None:
        self.module, self.steps = module, steps

    def __iter__(self):
        return iter(range(self.module.global_step, self.steps))

    def __len__(self) -> int:
        return self.steps


def subset_columns(draft: FeatureDraftForCausalLM) -> Tensor:
    """Target id → column of the draft's output layer (−1 off its subset) ``[V]``."""
    vocab = draft.config.vocab_size
    if draft.config.draft_vocab_size is None:
        return torch.arange(vocab)
    columns = torch.full((vocab,), -1, dtype=torch.long)
    columns[draft.lm_head.token_ids] = torch.arange(len(draft.lm_head.token_ids))
    return columns


def output_rows(draft: FeatureDraftForCausalLM) -> Tensor:
    """The output layer's weight ``[subset or V, H]``."""
    return draft.get_output_embeddings().weight


@dataclass
class DepthLosses:
    """Losses of one depth: soft cross-entropy to the target, feature regression, and agreement with its argmax."""

    cross_entropy: Tensor
    regression: Tensor
    agreement: Tensor
    overlap: Tensor  # Σ_k min(p_k, q(y_k)) over the target's top-k: a lower bound of 1 − TV


def depth_losses(draft: FeatureDraftForCausalLM, batch: dict[str, Tensor], unroll: int, columns: Tensor
                 ) -> list[DepthLosses]:
    """Losses at depths 1..``unroll`` of every position ``t ≥ 1`` of the batch."""
    mask = batch["mask"].clone()
    mask[:, 0] = False  # position 0 has no feature before it
    target = draft.fuse_features(batch["features"])  # [B, L, H]: what each position's output is regressed on
    reads = torch.cat([torch.zeros_like(target[:, :1]), target[:, :-1]], dim=1)
    cols = columns.to(batch["top_ids"].device)[batch["top_ids"][mask]]  # [n, k]
    probs = batch["top_probs"][mask] * (cols >= 0)
    results = []
    for _ in range(unroll):
        hidden = draft.model(inputs_embeds=draft.inputs(batch["ids"], reads),
                             attention_mask=batch["mask"].long()).last_hidden_state
        log_q = F.linear(hidden[mask], output_rows(draft)).float().log_softmax(-1)
        picked = log_q.gather(-1, cols.clamp_min(0))
        results.append(DepthLosses(
            cross_entropy=-(probs * picked).sum(-1).mean(),
            regression=F.smooth_l1_loss(hidden[mask].float(), target[mask].detach().float()),
            agreement=(log_q.argmax(-1) == cols[:, 0]).float().mean(),
            overlap=torch.minimum(probs, picked.exp() * (cols >= 0)).sum(-1).mean(),
        ))
        reads = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)  # the next depth reads these
    return results


class StepReport(L.Callback):
    """A line every ``every`` steps on stderr (the progress bar draws nothing where stderr is not a terminal)."""

    def __init__(self, every: int) -> None:
        self.every, self.started, self.first = every, 0.0, 0

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.started, self.first = time.perf_counter(), trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every == 0 and not sys.stderr.isatty():
            rate = (time.perf_counter() - self.started) / max(step - self.first, 1)
            metrics = trainer.callback_metrics
            figures = " ".join(f"{name.removeprefix('train/')} {float(value):.3f}" for name, value in metrics.items()
                               if name.startswith("train/ce") or name == "train/loss")
            print(f"step {step}/{trainer.max_steps}: {figures} ({rate:.2f} s/step)", file=sys.stderr, flush=True)


class FeatureDraftModule(L.LightningModule):
    """Trains a feature draft's own tensors (its embeddings are the target's, frozen)."""

    def __init__(self, draft: FeatureDraftForCausalLM, training: FeatureTraining) -> None:
        super().__init__()
        self.draft, self.training_config = draft, training
        self.register_buffer("columns", subset_columns(draft), persistent=False)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        losses = depth_losses(self.draft, batch, self.training_config.unroll, self.columns)
        config = self.training_config
        loss = sum(config.weight(d) * (x.cross_entropy + config.regression_weight * x.regression)
                   for d, x in enumerate(losses, 1)) / sum(config.weight(d) for d in range(1, len(losses) + 1))
        for depth, x in enumerate(losses, 1):
            self.log(f"train/ce_depth{depth}", x.cross_entropy, prog_bar=depth == 1)
            self.log(f"train/agree_depth{depth}", x.agreement)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        config = self.training_config
        params = [p for p in self.draft.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, config.warmup_steps, config.steps, config.min_lr_ratio))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


@dataclass(frozen=True)
class TrainingResult:
    """What a training run reached."""

    steps: int
    trained_positions: int
    held_out_positions: int
    held_out: list[dict[str, float]]  # per depth: cross_entropy, agreement, overlap
    config: dict

    @property
    def summary(self) -> dict:
        return asdict(self)


def split_held_out(data: TeacherData, count: int) -> tuple[list[SequenceRef], list[SequenceRef]]:
    """(training sequences, held-out sequences): the last ``count`` sequences are held out."""
    if count >= len(data.sequences):
        raise ValueError(f"{len(data.sequences)} sequences cannot hold out {count}; make more shards")
    return data.sequences[:-count] if count else data.sequences, data.sequences[-count:] if count else []


@torch.no_grad()
def held_out_losses(draft: FeatureDraftForCausalLM, data: TeacherData, refs: list[SequenceRef], unroll: int,
                    tokens: int = 8192) -> list[dict[str, float]]:
    """Position-weighted held-out losses per depth."""
    columns = subset_columns(draft)
    totals = [dict.fromkeys(("cross_entropy", "agreement", "overlap"), 0.0) for _ in range(unroll)]
    weight = 0
    draft.eval()
    for batch_refs in in_order(refs, tokens):
        batch = data.batch(batch_refs)
        n = int(batch["mask"][:, 1:].sum())
        for total, losses in zip(totals, depth_losses(draft, batch, unroll, columns)):
            for name in total:
                total[name] += float(getattr(losses, name)) * n
        weight += n
    return [{name: value / max(weight, 1) for name, value in total.items()} for total in totals]


def train_feature_draft(draft: FeatureDraftForCausalLM, paths: list[Path], training: FeatureTraining,
                        work_dir: Path, precision: str, resume: bool = True,
                        callbacks: list[L.Callback] | None = None) -> TrainingResult:
    """Train ``draft`` in place on the teacher shards; checkpoints in ``work_dir`` (resumed from ``last.ckpt``)."""
    data = TeacherData(paths, training.max_length)
    train_refs, held_refs = split_held_out(data, training.held_out_sequences)
    module = FeatureDraftModule(draft.train(), training)
    plan = batch_plan(train_refs, training.tokens_per_step, training.steps, training.seed)
    loader = DataLoader(StepBatches(data, plan), batch_size=None, sampler=FromStep(module, training.steps))
    checkpoints = work_dir / "checkpoints"
    last = checkpoints / "last.ckpt"
    trainer = L.Trainer(
        max_steps=training.steps, max_epochs=-1, precision=precision, logger=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=checkpoints, save_top_k=0, save_last=True,
                                   every_n_train_steps=training.checkpoint_every),
                   StepReport(max(1, min(25, training.checkpoint_every))), *(callbacks or [])],
        gradient_clip_val=1.0, num_sanity_val_steps=0, deterministic=False,
    )
    trainer.fit(module, train_dataloaders=loader, ckpt_path=str(last) if resume and last.is_file() else None)
    trainer.save_checkpoint(last)
    held_out = held_out_losses(draft, data, held_refs, training.unroll) if held_refs else []
    return TrainingResult(steps=trainer.global_step, trained_positions=sum(r.length for r in train_refs),
                          held_out_positions=sum(r.length for r in held_refs), held_out=held_out,
                          config=asdict(training))
