"""Lightning checkpoints written beside their path and renamed over it (both trainers: heads and feature drafts)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins import TorchCheckpointIO


class CheckpointBeside(TorchCheckpointIO):
    """Each checkpoint written beside its path and renamed over it. Lightning's own write stages it in ``$TMPDIR``
    and, where that is another filesystem, copies it over ``last.ckpt`` in place: a kill mid-copy would leave a
    truncated checkpoint, and the rerun could not resume."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        torch.save(checkpoint, partial)
        os.replace(partial, path)
