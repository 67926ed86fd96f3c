"""Fitting a lever on the rounds a head visits: a logistic recalibration or forecast, or the head retrained."""

from __future__ import annotations

import copy

import numpy as np
import torch

from accept_heads.levers.lever_policies import FEATURES, FORECASTS, LEVERS, Recalibration, VisitedCandidate
from decode.head import AcceptanceHead


def labelled(log: list[VisitedCandidate], lever: str) -> tuple[list[VisitedCandidate], list[float]]:
    """The visits a lever learns from and their labels: the candidate's own acceptance, or for a forecast the next
    candidate's acceptance before it was drawn (visits where none was drafted are left out)."""
    if lever in FORECASTS:
        visits = [v for v in log if v.next_accept is not None]
        return visits, [float(v.next_accept) for v in visits]
    return log, [v.accept for v in log]


def fit(lever: str, log: list[VisitedCandidate]) -> Recalibration:
    """Soft-label logistic regression of the lever's label (:func:`labelled`) on its features (L-BFGS, a little L2)."""
    used = torch.tensor([name in LEVERS[lever] for name in FEATURES], dtype=torch.float64)
    log, labels = labelled(log, lever)
    x = torch.tensor(np.stack([v.x for v in log]), dtype=torch.float64)
    y = torch.tensor(labels, dtype=torch.float64)
    scale = x.abs().amax(0).clamp_min(1.0)  # features of order one
    weights = torch.zeros(len(FEATURES), dtype=torch.float64)
    weights[FEATURES.index("logit")] = 1.0
    weights.requires_grad_(True)
    optimiser = torch.optim.LBFGS([weights], max_iter=200, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        optimiser.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits((x / scale) @ (weights * used), y)
        value = value + 1e-6 * (weights * used).pow(2).sum()
        value.backward()
        return value

    optimiser.step(loss)
    return Recalibration(lever, tuple(float(w) for w in (weights * used / scale).detach()))


def retrain(head: AcceptanceHead, log: list[VisitedCandidate], seed: int, epochs: int = 40,
            lever: str = "retrained") -> tuple[AcceptanceHead, dict]:
    """A copy of ``head`` fine-tuned on the visited candidates against the lever's label (:func:`labelled`;
    soft-label BCE, Adam); the epoch with the lowest held-out loss (a fifth of the candidates) is kept. Returns the
    head and its held-out losses before and after."""
    model = copy.deepcopy(head).train()
    log, label_list = labelled(log, lever)
    hidden = torch.stack([v.hidden for v in log])
    features = torch.stack([v.features for v in log]) if log[0].features is not None else None
    labels = torch.tensor(label_list)
    order = torch.randperm(len(log), generator=torch.Generator().manual_seed(seed))
    held, used = order[: len(log) // 5], order[len(log) // 5 :]

    def loss(rows: torch.Tensor) -> torch.Tensor:
        logits = model(hidden[rows], None if features is None else features[rows])
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[rows])

    optimiser = torch.optim.Adam(model.parameters(), lr=3e-4, weight_decay=1e-4)
    with torch.no_grad():
        before = best = float(loss(held))
    state = copy.deepcopy(model.state_dict())
    for _ in range(epochs):
        for rows in used[torch.randperm(len(used), generator=torch.Generator().manual_seed(seed + _))].split(256):
            optimiser.zero_grad()
            loss(rows).backward()
            optimiser.step()
        with torch.no_grad():
            held_loss = float(loss(held))
        if held_loss < best:
            best, state = held_loss, copy.deepcopy(model.state_dict())
    model.load_state_dict(state)
    model.metadata = head.metadata
    return model.eval(), {"held_out_bce_before": before, "held_out_bce_after": best, "held_out": len(held)}
