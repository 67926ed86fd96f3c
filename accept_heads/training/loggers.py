"""Experiment loggers: CSV (default), Weights & Biases (offline unless configured), TensorBoard."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger, WandbLogger

from ahconf.schema import ConfigError, LoggerConfig


def make_logger(config: LoggerConfig, save_dir: Path, name: str) -> Logger | bool:
    """The configured Lightning logger writing under ``save_dir`` (``False`` for ``logger.kind=none``).

    W&B runs in ``logger.wandb_mode`` (offline by default) unless ``$WANDB_MODE`` is set.
    """
    if config.kind == "none":
        return False
    if config.kind == "csv":
        return CSVLogger(save_dir=str(save_dir), name="csv")
    if config.kind == "tensorboard":
        if not any(importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")):
            raise ConfigError(
                "logger=tensorboard needs the tensorboard package (`pip install tensorboard`); "
                "or use logger=csv / logger=wandb"
            )
        return TensorBoardLogger(save_dir=str(save_dir), name="tensorboard")
    save_dir.mkdir(parents=True, exist_ok=True)
    mode = os.environ.get("WANDB_MODE", config.wandb_mode)  # the environment wins (tests set "disabled")
    return WandbLogger(project=config.project, name=name, save_dir=str(save_dir), mode=mode)
