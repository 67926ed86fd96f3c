"""The learning-rate schedule every trainer of the project uses."""

from __future__ import annotations

import math


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine from 1 to ``min_ratio`` at ``total``.

    The one schedule of the project: the zoo's training (``model_build.zoo.training``) and the heads'
    (``accept_heads.training.module``).
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
