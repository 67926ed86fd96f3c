"""``python -m accept_heads.train [+exp=NAME] [overrides]``: train acceptance heads / SV profiles.

``head=specdecpp`` (default): a SpecDec++ head on the frozen draft (:mod:`accept_heads.training.module`),
trained on the collected data with token mixing, checkpointed (head weights only) and exported to
``<head_dir>/head.safetensors`` (its stop threshold ``h`` is chosen on dev by ``accept_heads.evaluate``, which records
it beside the head). ``head=sv_profile``: an
SV binning profile with a latency table, exported to ``<head_dir>/profile.safetensors``.
``ckpt_path=last`` resumes from the job's ``last.ckpt``. In a multirun (``-m``) every job writes
under its own ``<head_dir>/<job>`` (see :func:`job_name`).
"""

from __future__ import annotations

import math
import re
import sys
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from lightning.pytorch.callbacks import Callback, Checkpoint, EarlyStopping, ModelCheckpoint
from omegaconf import DictConfig
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from accept_heads.measure.cost_models import device_description, verification_latency
from accept_heads.measure.information import information_gain
from accept_heads.training.export import artifact_dir, common_metadata, head_metadata, profile_metadata, work_dir
from accept_heads.training.features import DraftFeatures, head_encoder
from accept_heads.training.loggers import make_logger
from accept_heads.training.module import HeadModule, fold_prior_shift
from accept_heads.training.outcomes import HeadOutcome, ProfileOutcome
from accept_heads.training.prices import priced_loss
from accept_heads.training.profile_fit import (
    ProfileFitter,
    batch_latency_table,
    build_profile,
    equal_frequency_edges,
    position_loader,
)
from accept_heads.training.run_summary import print_head_summary, print_profile_summary
from accept_heads.training.training_data import (
    AcceptanceDataModule,
    check_rule_in_manifest,
    label_depths,
    load_positions,
    loss_everywhere,
    training_rule,
)
from ahconf.entry import CONF_DIR, run_entry
from ahconf.schema import ConfigError, HeadTrainConfig, LoggerConfig, ModelSpec, TrainerConfig, TrainJob
from data_gen.manifest import CollectionManifest, read_manifest
from data_gen.prompts import check_prompt_choices
from decode.artifacts.hub import load_causal_lm, load_tokenizer, tokenizer_hash
from decode.artifacts.serialization import load_head, load_profile, save_head, save_profile
from decode.drafts import drafter_of
from decode.head import DEPTH_FEATURE, PRE_FEATURES, AcceptanceHead, HeadConfig
from decode.head_config import PREVIOUS_TOKEN, REQUEST_FEATURE, ROUND_FEATURE, TOP_K_FEATURES
from decode.rules import Rule
from decode.sampling import Sampling
from runtime.checkpoints import CheckpointBeside
from runtime.models import resolve_model_id


@dataclass
class DataContext:
    """The collected data a run trains on, and the rule and sampling transform its labels follow."""

    manifest: CollectionManifest
    manifest_sha256: str
    rule: Rule
    sampling: Sampling


def data_context(job: TrainJob) -> DataContext:
    """Read the manifest; refuse data made with another draft, sampling transform or rule parameters."""
    manifest, sha = read_manifest(job.paths.data_dir)
    sampling = Sampling.from_dict(manifest.sampling)
    if sampling.to_dict() != asdict(job.sampling):
        raise ConfigError(
            f"the data at {job.paths.data_dir} was collected under sampling {sampling.to_dict()} but the config "
            f"says {asdict(job.sampling)}; a head is only valid for the transform of its labels"
        )
    stored = manifest.model("draft")
    stored_draft = (None, None) if stored is None else (stored.id, stored.revision)
    if stored_draft != (job.models.draft.id, job.models.draft.revision):
        raise ConfigError(
            f"the data at {job.paths.data_dir} was collected with draft {stored_draft[0]!r} "
            f"but models.draft.id={job.models.draft.id!r}; train with the draft that made the data"
        )
    rule = training_rule(job.head, job.rules)
    check_rule_in_manifest(manifest, rule)
    return DataContext(manifest, sha, rule, sampling)


def load_model(spec: ModelSpec, zoo_dir: str | None, dtype: str | None = None) -> tuple[PreTrainedModel, str]:
    """A configured model (``dtype`` overrides the spec's) and its resolved path."""
    path = resolve_model_id(spec, zoo_dir)
    return load_causal_lm(path, revision=spec.revision, dtype=dtype or spec.dtype, device_map=spec.device_map), path


def draft_dtype(trainer: TrainerConfig) -> str:
    """``trainer.draft_dtype``, with ``auto`` = bfloat16 on GPU and float32 on CPU."""
    if trainer.draft_dtype != "auto":
        return trainer.draft_dtype
    gpu = trainer.accelerator in ("gpu", "cuda") or (trainer.accelerator == "auto" and torch.cuda.is_available())
    return "bfloat16" if gpu else "float32"


def load_draft(job: TrainJob, manifest: CollectionManifest) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The frozen draft and its tokenizer, which must be the one the data was collected with."""
    draft, path = load_model(job.models.draft, job.paths.zoo_dir, draft_dtype(job.trainer))
    tokenizer = load_tokenizer(path, revision=job.models.draft.revision)
    if tokenizer_hash(tokenizer) != manifest.tokenizer_hash:
        raise ConfigError(f"the draft's tokenizer ({path}) differs from the one the data was collected with")
    return draft, tokenizer


class LastCheckpoint(Checkpoint):
    """``last.ckpt`` with ``trainer.checkpoint_every_n_steps``: every ``every`` optimiser steps, but at an epoch's last
    batch after the epoch (its validation, the best checkpoint chosen) instead. Resumed from a checkpoint of an epoch's
    last batch, Lightning skips that epoch's validation (and the best checkpoint it would choose; the state it restores
    may name a best file since deleted) and, resumed again later, trains one epoch too many. A ``Checkpoint``:
    Lightning runs it after the other callbacks (the best checkpoint's first)."""

    def __init__(self, path: Path, every: int) -> None:
        self.path, self.every, self.saved, self.epoch_done = path, every, -1, False

    def _save(self, trainer: L.Trainer) -> None:
        if not trainer.fast_dev_run:
            trainer.save_checkpoint(self.path)
            self.saved = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.epoch_done = batch_idx + 1 >= trainer.num_training_batches
        if not self.epoch_done and trainer.global_step % self.every == 0 and trainer.global_step != self.saved:
            self._save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.epoch_done:  # not when max_steps stopped the run mid-epoch: its step's checkpoint stands
            self._save(trainer)
            self.epoch_done = False


def resolve_checkpoint(ckpt_path: str | None, checkpoint_dir: Path) -> str | None:
    """``last`` → this job's ``last.ckpt`` (a fresh start, with a warning, when there is none yet)."""
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        last = checkpoint_dir / "last.ckpt"
        if last.is_file():
            return str(last)
        warnings.warn(f"ckpt_path=last: no {last} yet; starting from scratch", stacklevel=2)
        return None
    if not Path(ckpt_path).is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint")
    return ckpt_path


def build_trainer(t: TrainerConfig, logger: LoggerConfig, name: str, out_dir: Path, callbacks: list[Callback],
                  **overrides: Any) -> L.Trainer:
    """A Lightning Trainer from ``trainer`` logging run ``name`` under ``out_dir``."""
    kwargs: dict[str, Any] = dict(
        accelerator=t.accelerator, devices=t.devices, strategy=t.strategy, num_nodes=t.num_nodes,
        precision=t.precision, max_epochs=t.max_epochs, max_steps=t.max_steps,
        accumulate_grad_batches=t.accumulate_grad_batches, gradient_clip_val=t.gradient_clip_val,
        log_every_n_steps=t.log_every_n_steps, fast_dev_run=t.fast_dev_run,
        logger=make_logger(logger, out_dir, name),
        callbacks=callbacks, default_root_dir=str(out_dir), enable_model_summary=False,
        plugins=[CheckpointBeside()],  # a killed run never leaves a half-copied last.ckpt
    )
    if t.val_check_interval is not None:
        kwargs["val_check_interval"] = t.val_check_interval
    kwargs.update(overrides)
    return L.Trainer(**kwargs)


def head_architecture(head: HeadTrainConfig, hidden_size: int, depths: int = 1, vocab_size: int = 0) -> HeadConfig:
    """The decode-side head config for ``head.timing`` / ``head.use_companion`` / ``head.candidate_features`` /
    ``head.markov_rank`` (over ``vocab_size`` tokens) / ``head.request_feature`` / ``head.top_k_features`` /
    ``head.round_feature``; labels at ``depths > 1`` of a round (a feature draft's) add the candidate's depth to its
    features."""
    if head.timing == "post" and head.use_companion:
        raise ConfigError("head.use_companion=true needs head.timing=pre (a post head reads the hidden state only)")
    if head.round_feature and depths == 1:
        raise ConfigError("head.round_feature reads a round's earlier candidates at their depths: train on a feature "
                          "draft's data labelled at several depths (collect.depths > 1) or drop head.round_feature")
    pre = head.timing == "pre"
    features: tuple[str, ...] = ()
    if pre:
        features = (*(PRE_FEATURES if head.candidate_features else ()), *((DEPTH_FEATURE,) if depths > 1 else ()),
                    *((PREVIOUS_TOKEN,) if head.markov_rank else ()),
                    *((REQUEST_FEATURE,) if head.request_feature else ()),
                    *(TOP_K_FEATURES if head.top_k_features else ()),
                    *((ROUND_FEATURE,) if head.round_feature else ()))
    return HeadConfig(hidden_size=hidden_size, depth=head.depth, timing=head.timing, features=features,
                      companion_features=pre and head.use_companion, depths=depths, markov_rank=head.markov_rank,
                      vocab_size=vocab_size if head.markov_rank else 0)


def check_round_head(head: HeadTrainConfig, kind: str) -> None:
    """A depth-dependent draft's head is a ``pre`` head on the target's own prefix (its rounds are its candidates'
    prefix)."""
    if head.timing != "pre" or head.mixing_r != 1:
        raise ConfigError(f"a {kind} draft's head reads the state that produced q at each depth of a round, along "
                          "the target's own prefix: set head.timing=pre and head.mixing_r=1")


def load_head_weights(head: AcceptanceHead, checkpoint: str) -> None:
    """Copy the head's weights from a Lightning checkpoint of :class:`HeadModule` (``weights_only`` load)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    head.load_state_dict({k.removeprefix("head."): v for k, v in state.items() if k.startswith("head.")})


@dataclass
class HeadRun:
    """Everything a head training job builds before fitting."""

    ctx: DataContext
    draft: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    head: AcceptanceHead
    encoder: DraftFeatures
    datamodule: AcceptanceDataModule
    module: HeadModule


def prepare_head_run(job: TrainJob) -> HeadRun:
    """Load data context and draft, build the head (seeded), the datamodule and the LightningModule."""
    ctx = data_context(job)
    L.seed_everything(job.seed, workers=True, verbose=False)
    draft, tokenizer = load_draft(job, ctx.manifest)
    kind = drafter_of(draft)
    depths = 1
    if kind.depth_dependent:
        check_round_head(job.head, kind.name)
        depths = label_depths(job.paths.data_dir, ctx.rule)
    arch = head_architecture(job.head, draft.config.get_text_config(decoder=True).hidden_size, depths,
                             ctx.manifest.vocab_size)
    head = AcceptanceHead(arch)
    feature_sampling = ctx.rule.transform(ctx.sampling)
    dtype = draft_dtype(job.trainer)
    target = load_model(job.models.target, job.paths.zoo_dir, dtype)[0] if kind.reads_target else None
    encoder = head_encoder(draft, arch, feature_sampling, ctx.manifest.vocab_size, target)
    cache = None
    if job.trainer.feature_cache:
        cache = {"draft": job.models.draft.id, "revision": job.models.draft.revision,
                 **({"target": job.models.target.id} if kind.reads_target else {}),
                 "dtype": dtype, "arch": {**arch.to_dict(), "depth": None},
                 "feature_sampling": feature_sampling.to_dict(), "candidate_rule": ctx.rule.name,
                 "mixing_r": job.head.mixing_r, "loss_everywhere": loss_everywhere(arch.timing),
                 "seed": job.seed, "data": ctx.manifest_sha256, "vocab": ctx.manifest.vocab_size}
    datamodule = AcceptanceDataModule(
        job.paths.data_dir, ctx.rule, job.head, seed=job.seed, batch_size=job.optim.batch_size,
        num_workers=job.trainer.num_workers, cache_description=cache, encoder=encoder, depths=depths,
    )
    module = HeadModule(head, None if cache else encoder, job.loss, job.optim, datamodule.mean_train_label())
    return HeadRun(ctx, draft, tokenizer, head, encoder, datamodule, module)


def train_head(job: TrainJob) -> HeadOutcome | None:
    """Train a SpecDec++ head and export it (its goodput term at the prices ``loss.goodput_prices`` names, recorded in
    its metadata); returns paths and dev metrics (rank 0)."""
    job = replace(job, loss=priced_loss(job))
    run = prepare_head_run(job)
    ctx, draft, head, datamodule, module = run.ctx, run.draft, run.head, run.datamodule, run.module
    out_dir = work_dir(job.paths, job.head)
    checkpoint_dir = out_dir / "checkpoints"
    best = ModelCheckpoint(dirpath=checkpoint_dir, filename="step_{step:06d}", auto_insert_metric_name=False,
                           monitor="val/binary_kl", mode="min", save_top_k=1)
    every = job.trainer.checkpoint_every_n_steps
    last = (ModelCheckpoint(dirpath=checkpoint_dir, save_top_k=0, save_last=True) if every is None
            else LastCheckpoint(checkpoint_dir / "last.ckpt", every))
    callbacks: list[Callback] = [best, last]
    if job.trainer.early_stopping_patience is not None:
        callbacks.append(EarlyStopping("val/binary_kl", patience=job.trainer.early_stopping_patience))
    trainer = build_trainer(job.trainer, job.logger, job.head.name or job.exp_name, out_dir, callbacks)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resolve_checkpoint(job.ckpt_path, checkpoint_dir))
    if best.best_model_path:
        load_head_weights(head, best.best_model_path)
    validated = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    dev_metrics = {k: None if math.isnan(float(v)) else float(v) for k, v in validated.items()}  # None: undefined
    if not trainer.is_global_zero:
        return None
    head.eval()
    fold_prior_shift(head, job.loss)  # from here on the head predicts acceptance probabilities
    common = common_metadata(job, ctx.manifest, ctx.manifest_sha256, ctx.rule, ctx.sampling)
    path = artifact_dir(job.paths, job.head) / "head.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_head(head.cpu(), path, head_metadata(common, job, head.config, dev_metrics))
    load_head(path, draft=draft, tokenizer=run.tokenizer, sampling=ctx.sampling, rule=ctx.rule)
    result = HeadOutcome(
        name=job.head.name or job.exp_name, head_path=str(path), checkpoint_dir=str(checkpoint_dir),
        timing=head.config.timing, depth=head.config.depth, rule=ctx.rule.spec(), dev_metrics=dev_metrics,
        global_step=trainer.global_step, best_checkpoint=best.best_model_path or None,
        round_depths=head.config.depths,
    )
    print_head_summary(result)
    return result


def fit_profile(job: TrainJob) -> ProfileOutcome | None:
    """Fit, measure and export an SV profile; returns paths, bins and information gain (rank 0)."""
    ctx = data_context(job)
    if job.models.companion is None or ctx.manifest.model("companion") is None:
        raise ConfigError("head=sv_profile needs data collected with a companion model (models.companion)")
    head = job.head
    tables = {s: load_positions(job.paths.data_dir, s, ctx.rule, seed=job.seed, with_companion=True)
              for s in ("train", "dev")}
    x_edges = equal_frequency_edges(tables["train"].companion[:, 0], head.x_bins)
    y_edges = equal_frequency_edges(tables["train"].companion[:, 1], head.y_bins)
    fitter = ProfileFitter(x_edges, y_edges, head.a_bins)
    out_dir = work_dir(job.paths, job.head)
    trainer = build_trainer(job.trainer, job.logger, job.head.name or job.exp_name, out_dir, [],
                            enable_checkpointing=False)
    trainer.validate(fitter, dataloaders=[position_loader(tables["train"]), position_loader(tables["dev"])],
                     verbose=False)
    information = {split: information_gain(metric.compute()["joint"])
                   for split, metric in (("train", fitter.train_bins), ("dev", fitter.dev_bins))}
    if not trainer.is_global_zero:
        return None
    target, _ = load_model(job.models.target, job.paths.zoo_dir)
    device = trainer.strategy.root_device
    if getattr(target, "hf_device_map", None) is None:
        target.to(device)
    prompts = sorted(tables["dev"].prompts, key=len)
    typical = prompts[len(prompts) // 2].tolist()
    latency = verification_latency(target, typical, head.k_max, head.latency_repeats)
    batched = (batch_latency_table(target, head.latency_batches, head.k_max, len(typical), head.latency_repeats)
               if head.latency_batches else None)
    profile = build_profile(fitter, head.min_bin_count, latency, batched)
    latency_device = device_description(target.device) + f", prompt of {len(typical)} tokens"
    common = common_metadata(job, ctx.manifest, ctx.manifest_sha256, ctx.rule, ctx.sampling)
    path = artifact_dir(job.paths, job.head) / "profile.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_profile(profile, path, profile_metadata(common, job.head, profile.bins, information, latency_device))
    load_profile(path, sampling=ctx.sampling, rule=ctx.rule)
    result = ProfileOutcome(
        name=job.head.name or job.exp_name, profile_path=str(path),
        bins=profile.bins,
        requested_bins=(head.x_bins, head.y_bins),
        backed_off_bins=int((profile.counts < head.min_bin_count).sum()),
        information=information, latency=profile.latency.tolist(), latency_device=latency_device,
        batch_sizes=batched[0] if batched else None, batch_latency=batched[1].tolist() if batched else None,
    )
    print_profile_summary(result)
    return result


def train(job: TrainJob) -> HeadOutcome | ProfileOutcome | None:
    """Train the configured acceptance predictor and export it; None on ranks other than 0."""
    if job.head.kind == "sv_profile":
        return fit_profile(job)
    return train_head(job)


def swept_keys(arguments: list[str]) -> set[str]:
    """Keys that a multirun command line sweeps (``a=1,2``, ``choice(...)``, ``range(...)``)."""
    parser = OverridesParser.create()
    overrides = parser.parse_overrides([a for a in arguments if not a.startswith("-")])
    return {o.key_or_group for o in overrides if o.is_sweep_override()}


def job_name(num: int, job_overrides: list[str], swept: set[str]) -> str:
    """Artifact directory of a multirun job: its number and its values of the swept keys."""
    kept = [o for o in job_overrides if o.split("=", 1)[0].lstrip("+~") in swept]
    text = re.sub(r"[^A-Za-z0-9._=,+-]", "_", ",".join(sorted(kept)))[:120]
    return f"{num:03d}_{text}" if text else f"{num:03d}"


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN and cfg.head.name is None:
        cfg.head.name = job_name(hydra_cfg.job.num, list(hydra_cfg.overrides.task), swept_keys(sys.argv[1:]))
    run_entry(cfg, "accept_heads.train", lambda config: train(config.train_job()), check_prompt_choices)


if __name__ == "__main__":
    main()
