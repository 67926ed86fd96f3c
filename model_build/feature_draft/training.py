"""Train a feature draft on the teacher shards with Lightning: a distribution loss to the target (:mod:`.losses`)
plus EAGLE's feature regression, at every depth of an unrolled round (``docs/design.md`` §8, "Training recipe v2").

Depth 1 reads the target's features (shifted one position); depth ``d > 1`` reads the draft's own outputs of
depth ``d − 1`` and the target's tokens (the training-time test), with decoding's exact attention masks, so a
candidate far into a round is trained as it is drafted. An on-policy pass may follow: steps that train only where
the draft, as it stands, is rejected.
Batch ``i`` is a function of the seed and ``i`` alone and the sampler starts at the restored step, so a run
resumed from its ``last.ckpt`` takes the very steps an uninterrupted one would (none twice, none skipped).
"""

from __future__ import annotations

import dataclasses
import json
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
from decode.drafts.feature_model import FeatureDraftForCausalLM, depth_hidden, feature_reads
from decode.subset_vocab import SubsetVocabHead
from runtime.checkpoints import CheckpointBeside

from .losses import acceptance, distribution_loss, soft_cross_entropy


@dataclass(frozen=True)
class FeatureTraining:
    """Every knob of a feature draft's training."""

    steps: int = 2000
    tokens_per_step: int = 8192
    max_length: int = 512  # longer sequences are cut
    lr: float = 1e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    unroll: int = 4  # depths trained per position (1: the target's features only, EAGLE-1)
    exact_masks: bool = True  # decoding's attention at every depth (False: causal over each depth's pass, v1)
    loss: str = "kl"  # the distribution loss (model_build.feature_draft.losses: kl, tv, neg_log_alpha, lk)
    regression_weight: float = 0.5  # of the feature regression (smooth L1) beside the distribution loss
    unreachable_top_k: int = 0  # GRIFFIN: train a depth only where the round's earlier tokens were in the top-k
    on_policy_steps: int = 0  # steps after ``steps`` that train only where the draft is rejected
    held_out_sequences: int = 128  # the last sequences of the last shard: never trained on
    checkpoint_every: int = 100
    seed: int = 0
    depth_weights: tuple[float, ...] = field(default=())  # per depth (default: all 1)

    def __post_init__(self) -> None:
        distribution_loss(self.loss)  # an unknown name fails here, in one line
        if self.unroll < 1:
            raise ValueError(f"unroll must be at least 1, got {self.unroll}")

    @property
    def total_steps(self) -> int:
        """The steps of the main run and of the on-policy pass."""
        return self.steps + self.on_policy_steps

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
    """The teacher shards in memory: tokens ``[N]``, features ``[N, F]``, top-k ``[N, k]`` per shard.

    ``layers``: the target layers a draft reads, where the shards stored more (their plan's ``feature_layers``);
    only those columns are kept in memory. None: every stored layer.
    """

    def __init__(self, paths: list[Path], max_length: int, layers: tuple[int, ...] | None = None) -> None:
        self.shards: list[dict[str, Tensor]] = []
        self.sequences: list[SequenceRef] = []
        for index, path in enumerate(paths):
            with safe_open(str(path), "pt") as handle:
                shard = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (a safetensors handle, not a dict)
                stored = tuple(json.loads((handle.metadata() or {}).get("plan", "{}")).get("feature_layers", ()))
            if layers is not None and tuple(layers) != stored:
                shard["features"] = select_layers(shard["features"], stored, layers)
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


def select_layers(features: Tensor, stored: tuple[int, ...], layers: tuple[int, ...]) -> Tensor:
    """The columns of ``layers`` in features ``[N, len(stored) · H]`` stored for ``stored`` → ``[N, len(layers) · H]``."""
    missing = [layer for layer in layers if layer not in stored]
    if missing:
        raise ValueError(f"the teacher shards store the target's layers {list(stored)}, not {missing}; "
                         "make shards with those layers (another --data-dir)")
    parts = features.chunk(len(stored), dim=-1)
    return torch.cat([parts[stored.index(layer)] for layer in layers], dim=-1).contiguous()


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


@dataclass
class DepthLosses:
    """Losses of one depth over its trained positions: the training loss and what is logged beside it."""

    loss: Tensor  # the configured distribution loss (:mod:`.losses`), mean over positions
    cross_entropy: Tensor  # soft cross-entropy to the target's top-k
    regression: Tensor  # smooth L1 of the draft's output on the target's (fused) feature
    agreement: Tensor  # the draft's argmax is the target's
    overlap: Tensor  # α = Σ_k min(p_k, q(y_k)) over the target's top-k: a lower bound of 1 − TV
    reached: Tensor  # Π of α along each kept position's round up to this depth (unconditional), mean; no gradient
    positions: int


def unrolled_hidden(draft: FeatureDraftForCausalLM, ids: Tensor, mask: Tensor, reads: Tensor, depths: int,
                    exact_masks: bool) -> list[Tensor]:
    """The draft's outputs ``[B, L, H]`` at depths ``1 .. depths`` along the target's tokens ``ids [B, L]``.

    ``exact_masks``: decoding's attention (:func:`decode.drafts.feature_model.depth_hidden`); else every depth attends
    causally over its own pass (earlier positions' keys from the draft's own outputs: how the v1 draft trained).
    """
    if exact_masks:
        return depth_hidden(draft, ids, mask.long(), reads, depths)
    outputs = []
    for _ in range(depths):
        hidden = draft.model(inputs_embeds=draft.inputs(ids, reads), attention_mask=mask.long()).last_hidden_state
        outputs.append(hidden)
        reads = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)
    return outputs


def shift_right(values: Tensor) -> Tensor:
    """``values [B, L]`` one position later (False at position 0): what position ``t`` inherits from ``t − 1``."""
    return torch.cat([torch.zeros_like(values[:, :1]), values[:, :-1]], dim=1)


def draft_rejected(scores: Tensor, cols: Tensor) -> Tensor:
    """Where the draft's proposal is rejected under the greedy rule ``[...]``: its argmax over the subset
    (``scores [..., S]``) is not the target's top token (``cols [..., k]``, column 0; off the subset: always)."""
    return scores.argmax(-1) != cols[..., 0]


def subset_scores(draft: FeatureDraftForCausalLM, hidden: Tensor) -> Tensor:
    """The draft's logits over the tokens its output layer scores ``[..., S]`` (column order: :func:`subset_columns`)."""
    head = draft.get_output_embeddings()
    return head.scores(hidden) if isinstance(head, SubsetVocabHead) else head(hidden)


def depth_losses(draft: FeatureDraftForCausalLM, batch: dict[str, Tensor], training: FeatureTraining,
                 columns: Tensor, on_policy: bool = False) -> list[DepthLosses]:
    """Losses at depths ``1 .. training.unroll`` (``docs/design.md`` §8, "Training recipe v2").

    Position ``t`` at depth ``d`` is step ``d`` of a round started at ``t − d + 1 ≥ 1`` (position 0 has no
    feature before it). With ``unreachable_top_k`` a position counts only if, at every earlier step of its round,
    the token fed next was among the draft's top-k there (GRIFFIN: a round never reaches it otherwise).
    ``on_policy`` keeps only the positions where the draft, as it stands, is rejected (:func:`draft_rejected`).
    """
    loss_fn = distribution_loss(training.loss)
    target = draft.fuse_features(batch["features"])  # [B, L, H]: what each position's output is regressed on
    reads = feature_reads(target, batch["mask"].long())
    cols = columns.to(batch["top_ids"].device)[batch["top_ids"]]  # [B, L, k] subset columns (−1 off it)
    probs = batch["top_probs"] * (cols >= 0)
    next_cols = columns.to(batch["ids"].device)[batch["ids"].roll(-1, dims=1)]  # [B, L]: the token fed next
    valid = batch["mask"] & (torch.arange(batch["mask"].shape[1], device=batch["mask"].device) >= 1)[None]
    reachable = torch.ones_like(valid)
    chain: Tensor | None = None  # [B, L] Π α along the round ending at each position (0 where not kept)
    results = []
    hiddens = unrolled_hidden(draft, batch["ids"], batch["mask"], reads, training.unroll, training.exact_masks)
    for hidden in hiddens:
        keep = valid & reachable
        scores = subset_scores(draft, hidden)  # [B, L, S]
        if training.unreachable_top_k:
            top = scores.detach().topk(training.unreachable_top_k, dim=-1).indices
            reachable = shift_right(reachable & (top == next_cols[..., None]).any(-1))
        if on_policy:
            keep = keep & draft_rejected(scores.detach(), cols)
        log_q = scores[keep].float().log_softmax(-1)  # [n, S]
        picked = log_q.gather(-1, cols[keep].clamp_min(0))  # [n, k]
        p = probs[keep]
        count = int(keep.sum())
        alpha = torch.zeros(valid.shape, device=valid.device)
        alpha[keep] = acceptance(p, picked).detach()
        chain = alpha if chain is None else shift_right(chain) * alpha
        results.append(DepthLosses(
            loss=loss_fn(p, picked).sum() / max(count, 1),
            cross_entropy=soft_cross_entropy(p, picked).sum() / max(count, 1),
            regression=F.smooth_l1_loss(hidden[keep].float(), target[keep].detach().float(), reduction="sum")
            / max(count * hidden.shape[-1], 1),
            agreement=(log_q.argmax(-1) == cols[keep][:, 0]).float().sum() / max(count, 1),
            overlap=acceptance(p, picked).sum() / max(count, 1),
            reached=chain[keep].sum() / max(count, 1),
            positions=count,
        ))
        valid = batch["mask"] & shift_right(valid)  # the next depth: rounds started one position earlier
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
        config = self.training_config
        on_policy = self.global_step >= config.steps
        losses = depth_losses(self.draft, batch, config, self.columns, on_policy=on_policy)
        loss = sum(config.weight(d) * (x.loss + config.regression_weight * x.regression)
                   for d, x in enumerate(losses, 1)) / sum(config.weight(d) for d in range(1, len(losses) + 1))
        for depth, x in enumerate(losses, 1):
            self.log(f"train/ce_depth{depth}", x.cross_entropy, prog_bar=depth == 1)
            self.log(f"train/alpha_depth{depth}", x.overlap)
            self.log(f"train/agree_depth{depth}", x.agreement)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/on_policy", float(on_policy))
        return loss

    def configure_optimizers(self):
        config = self.training_config
        params = [p for p in self.draft.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, config.warmup_steps, config.total_steps, config.min_lr_ratio))
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
def held_out_losses(draft: FeatureDraftForCausalLM, data: TeacherData, refs: list[SequenceRef],
                    training: FeatureTraining, tokens: int = 8192, depths: int | None = None) -> list[dict[str, float]]:
    """Position-weighted held-out figures per depth (every position reached at that depth, with decoding's masks
    whatever the training used: what decoding would see), at depths ``1 .. depths`` (default: those trained).

    ``reached`` is the unconditional figure (Π α along each round, :class:`DepthLosses`); ``conditional`` its ratio
    to the depth before.
    """
    columns = subset_columns(draft)
    measured = dataclasses.replace(training, exact_masks=True, unreachable_top_k=0, unroll=depths or training.unroll)
    names = ("cross_entropy", "agreement", "overlap", "reached")
    totals = [dict.fromkeys(names, 0.0) for _ in range(measured.unroll)]
    weights = [0] * measured.unroll
    draft.eval()
    for batch_refs in in_order(refs, tokens):
        for depth, losses in enumerate(depth_losses(draft, data.batch(batch_refs), measured, columns)):
            for name in names:
                totals[depth][name] += float(getattr(losses, name)) * losses.positions
            weights[depth] += losses.positions
    figures = [{name: value / max(weight, 1) for name, value in total.items()} for total, weight in zip(totals, weights)]
    for depth, one in enumerate(figures):
        one["conditional"] = one["reached"] / max(figures[depth - 1]["reached"] if depth else 1.0, 1e-12)
    return figures


def train_feature_draft(draft: FeatureDraftForCausalLM, paths: list[Path], training: FeatureTraining,
                        work_dir: Path, precision: str, resume: bool = True,
                        callbacks: list[L.Callback] | None = None) -> TrainingResult:
    """Train ``draft`` in place on the teacher shards; checkpoints in ``work_dir`` (resumed from ``last.ckpt``)."""
    data = TeacherData(paths, training.max_length, draft.feature_layers)
    train_refs, held_refs = split_held_out(data, training.held_out_sequences)
    module = FeatureDraftModule(draft.train(), training)
    plan = batch_plan(train_refs, training.tokens_per_step, training.total_steps, training.seed)
    loader = DataLoader(StepBatches(data, plan), batch_size=None, sampler=FromStep(module, training.total_steps))
    checkpoints = work_dir / "checkpoints"
    last = checkpoints / "last.ckpt"
    trainer = L.Trainer(
        max_steps=training.total_steps, max_epochs=-1, precision=precision, logger=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=checkpoints, save_top_k=0, save_last=True,
                                   every_n_train_steps=training.checkpoint_every),
                   StepReport(max(1, min(25, training.checkpoint_every))), *(callbacks or [])],
        gradient_clip_val=1.0, num_sanity_val_steps=0, deterministic=False, plugins=[CheckpointBeside()],
    )
    trainer.fit(module, train_dataloaders=loader, ckpt_path=str(last) if resume and last.is_file() else None)
    trainer.save_checkpoint(last, weights_only=False)  # the optimiser too: a later run resumes from it
    held_out = held_out_losses(draft, data, held_refs, training) if held_refs else []
    return TrainingResult(steps=trainer.global_step, trained_positions=sum(r.length for r in train_refs),
                          held_out_positions=sum(r.length for r in held_refs), held_out=held_out,
                          config=asdict(training))
