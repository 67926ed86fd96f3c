"""Where a training run's artifacts go, and the metadata written into exported heads and profiles.

Layout (``<name>`` = ``head.name``, set per job in a multirun; absent otherwise)::

    <paths.head_dir>[/<name>]/head.safetensors         the head (decode.load_head validates it)
    <paths.head_dir>[/<name>]/head.h_choice.json       its stop threshold h and the dev runs it was chosen from,
                                                       written by accept_heads.evaluate
                                                       (decode.artifacts.threshold_choice.ThresholdChoice)
    <paths.head_dir>[/<name>]/profile.safetensors      an SV profile (decode.load_profile)
    <paths.head_dir>[/<name>]/README.md                the model card of both, from their metadata
                                                       (decode.artifacts.serialization.write_card); the folder
                                                       is a hub repo as it stands: python -m accept_heads.push_head
    <paths.run_dir>/train/<kind>[/<name>]/checkpoints/ last.ckpt + the best step_XXXXXX.ckpt (head only)
    <paths.run_dir>/train/<kind>[/<name>]/csv/         logs (or tensorboard/, wandb/)
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from accept_heads.training.metrics import prior_shift
from ahconf.schema import HeadTrainConfig, PathsConfig, TrainJob
from data_gen.manifest import CollectionManifest
from decode.head import HeadConfig
from decode.metadata import (
    ArtifactMetadata,
    HeadMetadata,
    InformationGain,
    ProfileMetadata,
    TrainingData,
)
from decode.rules import Rule
from decode.sampling import Sampling


def artifact_dir(paths: PathsConfig, head: HeadTrainConfig) -> Path:
    """Directory of the exported head / profile."""
    root = Path(paths.head_dir)
    return root / head.name if head.name else root


def run_relative(paths: PathsConfig, path: str) -> str:
    """``path`` relative to the run directory (``paths.run_dir``), as an artifact records it: never absolute, so an
    exported folder names nothing of the machine it was trained on."""
    return Path(os.path.relpath(Path(path).resolve(), Path(paths.run_dir).resolve())).as_posix()


def work_dir(paths: PathsConfig, head: HeadTrainConfig) -> Path:
    """Directory of checkpoints and logs of this training job."""
    root = Path(paths.run_dir) / "train" / head.kind
    return root / head.name if head.name else root


def common_metadata(
    job: TrainJob, manifest: CollectionManifest, manifest_sha256: str, rule: Rule, sampling: Sampling
) -> ArtifactMetadata:
    """What heads and profiles share: models, tokenizer, rule, sampling, training data."""
    draft, target, companion = (manifest.model(role) for role in ("draft", "target", "companion"))
    return ArtifactMetadata(
        draft=job.models.draft.id if draft is None else draft.id,
        draft_revision=None if draft is None else draft.revision,
        companion=None if companion is None else companion.id,
        target=None if target is None else target.id,
        tokenizer_hash=manifest.tokenizer_hash,
        rule=rule.spec(),
        sampling=sampling,
        training_data=TrainingData(
            manifest_sha256=manifest_sha256,
            data_dir=run_relative(job.paths, job.paths.data_dir),
            exp_name=manifest.exp_name,
            positions=manifest.positions(),
        ),
        seed=job.seed,
    )


def head_metadata(
    common: ArtifactMetadata,
    job: TrainJob,
    config: HeadConfig,
    dev_metrics: dict[str, float | None],
) -> HeadMetadata:
    """Everything ``decode.load_head`` validates plus the training recipe and dev metrics."""
    return HeadMetadata.extending(
        common,
        head_config=config,
        train_config={"head": asdict(job.head), "loss": asdict(job.loss), "optim": asdict(job.optim)},
        probability=f"acceptance: the weighted loss's prior shift log(w_rej / w_acc) = "
                    f"{prior_shift(job.loss.w_acc, job.loss.w_rej):.4f} is folded into the output bias",
        dev_metrics=dev_metrics,
        k_min=job.head.k_min,
        k_max=job.head.k_max,
    )


def profile_metadata(common: ArtifactMetadata, head: HeadTrainConfig, bins: tuple[int, int],
                     information: dict[str, InformationGain], latency_device: str) -> ProfileMetadata:
    """Profile fields: its bins and the requested ones, back-off rule, information gain, where latency was measured."""
    return ProfileMetadata.extending(
        common,
        bins=bins,
        requested_bins=(head.x_bins, head.y_bins),
        min_bin_count=head.min_bin_count,
        a_bins=head.a_bins,
        information=information,
        latency_device=latency_device,
        k_max=head.k_max,
        latency_batches=tuple(head.latency_batches),
    )
