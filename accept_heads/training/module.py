"""LightningModule training a SpecDec++ acceptance head on top of a frozen draft model."""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor

from accept_heads.training.features import DraftFeatures
from accept_heads.training.metrics import AcceptanceMetrics, prior_shift, weighted_bce
from accept_heads.training.training_data import labelled_positions
from ahconf.schema import LossConfig, OptimConfig
from data_gen.schedule import warmup_cosine
from decode.head import AcceptanceHead


class HeadModule(L.LightningModule):
    """Trains ``head`` with the weighted BCE; only the head's parameters are optimised and checkpointed.

    ``encoder`` runs the frozen draft on mixed batches (``None`` when training from a feature
    cache, whose batches already hold ``hidden`` / ``features``). ``constant`` is the mean train
    label, reported as the constant predictor's dev binary KL.
    """

    def __init__(
        self,
        head: AcceptanceHead,
        encoder: DraftFeatures | None,
        loss: LossConfig,
        optim: OptimConfig,
        constant: float,
    ) -> None:
        super().__init__()
        self.head = head
        self.encoder = encoder
        self.loss_config, self.optim_config = loss, optim
        self.train_metrics = AcceptanceMetrics("train/", loss.w_acc, loss.w_rej, auroc_thresholds=200)
        self.val_metrics = AcceptanceMetrics("val/", loss.w_acc, loss.w_rej, constant=constant)

    def inputs(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        """``(hidden, features, labels, outcomes)`` at the batch's loss positions (and depths: labelled ones only)."""
        if "hidden" in batch:
            return labelled_positions(batch["hidden"], batch.get("features"), batch["label"], batch["outcome"])
        self.encoder.to(self.device)
        hidden, features = self.encoder(batch)
        mask = batch["loss_mask"]
        return labelled_positions(hidden, features, batch["label"][mask], batch["outcome"][mask])

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Float logits, labels and outcomes of a batch."""
        hidden, features, labels, outcomes = self.inputs(batch)
        return self.head(hidden, features).float(), labels, outcomes

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        logits, labels, outcomes = self(batch)
        loss = weighted_bce(logits, labels, self.loss_config.w_acc, self.loss_config.w_rej)
        self.train_metrics.update(logits, labels, outcomes)
        self.log("train/loss", loss, prog_bar=True, batch_size=max(1, labels.numel()))
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=1)
        return loss

    def on_train_epoch_end(self) -> None:
        self.log_dict(self.train_metrics.compute(), sync_dist=True)  # already synced: silences Lightning's hint
        self.train_metrics.reset()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits, labels, outcomes = self(batch)
        self.val_metrics.update(logits, labels, outcomes)

    def on_validation_epoch_end(self) -> None:
        values = self.val_metrics.compute()
        self.log("val/binary_kl", values.pop("val/binary_kl"), prog_bar=True, sync_dist=True)
        self.log("val/auroc", values.pop("val/auroc"), prog_bar=True, sync_dist=True)
        self.log_dict(values, sync_dist=True)
        self.val_metrics.reset()

    def configure_optimizers(self) -> dict:
        cfg = self.optim_config
        optimizer = torch.optim.AdamW(self.head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        total = int(self.trainer.estimated_stepping_batches)
        warmup = min(cfg.warmup_steps, max(0, total - 1))
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, warmup, total, cfg.min_lr_ratio)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def fold_prior_shift(head: AcceptanceHead, loss: LossConfig) -> float:
    """Make ``head`` predict acceptance probabilities: add the weighted loss's :func:`prior_shift` to
    its output bias (a no-op for ``w_acc = w_rej``); returns the shift."""
    shift = prior_shift(loss.w_acc, loss.w_rej)
    with torch.no_grad():
        head.out.bias += shift
    return shift
