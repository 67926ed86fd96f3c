"""Where a loaded trio runs: every model on one device, unless a device map placed it."""

from __future__ import annotations

import torch

from runtime.models import Trio


def place(trio: Trio, device: str | torch.device | None = None) -> str:
    """Put the models in eval mode on ``device`` (default: the GPU when there is one, else the CPU), leaving any
    model a device map placed where it is; returns the device."""
    device = str(device) if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    for model in (trio.target, trio.draft, trio.companion):
        if model is not None:
            model.eval()
            if getattr(model, "hf_device_map", None) is None:
                model.to(device)
    return device
