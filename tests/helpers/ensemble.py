"""The Speculative Ensemble's references, written independently of decode.ensemble: its members in order, the
ensemble function of each kind, ``r`` from warped logits, and greedy argmax ``r`` from full forwards."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from decode import EnsembleFn

#: Per number of models: the weighted kind's weights and the contrastive kind's μ (one per amateur).
WEIGHTS = {2: (0.3, 0.7), 3: (0.2, 0.3, 0.5)}
MUS = {2: 0.5, 3: (0.5, 0.3)}
#: Proposal lengths per mode; models are ordered [draft, (companion,) target].
GAMMAS = {("sd", 2): [2, 1], ("sd", 3): [2, 1, 1], ("alternate", 2): [1, 2], ("alternate", 3): [1, 2, 1]}


def members(models: dict, n: int) -> list:
    """The ensemble's ``n`` models in order: draft, (companion,) target."""
    return [models["draft"], models["target"]] if n == 2 else [models["draft"], models["companion"], models["target"]]


def make_fn(kind: str, n: int) -> EnsembleFn:
    """The ensemble function of ``kind`` over ``n`` models at :data:`WEIGHTS` / :data:`MUS`."""
    return EnsembleFn("weighted", weights=WEIGHTS[n]) if kind == "weighted" else EnsembleFn("contrastive", mu=MUS[n])


def reference_mix(kind: str, n: int) -> Callable[[list[Tensor]], Tensor]:
    """``r`` from warped logits, written independently of decode.ensemble_fn."""
    if kind == "weighted":
        return lambda logits: sum(w * l.softmax(-1) for w, l in zip(WEIGHTS[n], logits))
    mus = MUS[n] if isinstance(MUS[n], tuple) else (MUS[n],)
    return lambda logits: (logits[-1] - sum(m * l for m, l in zip(mus, logits[:-1]))).softmax(-1)


def reference_greedy(models: list, kind: str, prompt: Tensor, max_new: int) -> Tensor:
    """argmax r from full (uncached) forwards of every model, one token at a time."""
    n, ids = len(models), prompt
    for _ in range(max_new):
        with torch.no_grad():
            logits = [model(ids).logits[0, -1].double() for model in models]
        if kind == "weighted":
            scores = sum(w * l.softmax(-1) for w, l in zip(WEIGHTS[n], logits))
        else:
            mus = MUS[n] if isinstance(MUS[n], tuple) else (MUS[n],)
            scores = logits[-1] - sum(m * l for m, l in zip(mus, logits[:-1]))
        ids = torch.cat([ids, scores.argmax().view(1, 1)], dim=1)
    return ids
