"""SpecDec++ acceptance-prediction head (DESIGN §2) and its input features."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from decode.head_config import DEPTH_FEATURE, HEAD_FEATURES, PRE_FEATURES, HeadConfig
from decode.metadata import HeadMetadata


class AcceptanceHead(nn.Module):
    """``D`` residual blocks ``h ← h + SiLU(W_d h + b_d)`` (independent weights), then a linear logit."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        width = config.input_size
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(config.depth))
        self.out = nn.Linear(width, 1)
        self.metadata: HeadMetadata | None = None  # what its file records (None: made in memory)

    def forward(self, hidden: Tensor, features: Tensor | None = None) -> Tensor:
        """Acceptance logits ``[...]`` from hidden states ``[..., H]`` (and features ``[..., F]``)."""
        n_features = len(self.config.feature_names)
        if n_features:
            if features is None or features.shape[-1] != n_features:
                raise ValueError(f"head expects {n_features} features {self.config.feature_names}")
            hidden = torch.cat([hidden, features.to(hidden.dtype)], dim=-1)
        for block in self.blocks:
            hidden = hidden + nn.functional.silu(block(hidden))
        return self.out(hidden).squeeze(-1)

    def predict(self, hidden: Tensor, features: Tensor | None = None) -> Tensor:
        """Predicted acceptance probabilities ``σ(logit)``."""
        return torch.sigmoid(self(hidden, features))


def head_features(
    q_probs: Tensor,
    y: Tensor,
    names: tuple[str, ...] = PRE_FEATURES,
    companion: tuple[Tensor, Tensor] | None = None,
    depth: Tensor | int | None = None,
) -> Tensor:
    """Scalar features ``[..., F]`` of candidates ``y[...]`` drawn from ``q_probs[..., V]`` (vectorised).

    ``log_q = log q(y)``, ``entropy = H(q)`` (nats), ``top_prob = max q``, ``depth`` the candidates' depth in their
    round (broadcast to ``y``'s shape; :meth:`HeadConfig.depth_of`); ``companion`` is the ``(X, Y)`` pair appended
    when the head uses companion features.
    """
    columns: list[Tensor] = []
    for name in names:
        if name == "log_q":
            columns.append(q_probs.gather(-1, y.unsqueeze(-1)).squeeze(-1).clamp_min(1e-30).log())
        elif name == "entropy":
            columns.append(-torch.xlogy(q_probs, q_probs).sum(-1))
        elif name == "top_prob":
            columns.append(q_probs.max(-1).values)
        elif name == DEPTH_FEATURE:
            if depth is None:
                raise ValueError("the depth feature needs each candidate's depth in its round")
            columns.append(torch.as_tensor(depth, dtype=torch.float32, device=y.device).expand(y.shape))
        else:
            raise ValueError(f"unknown head feature {name!r}; valid: {', '.join(HEAD_FEATURES)}")
    if companion is not None:
        columns.extend(companion)
    return torch.stack([c.float() for c in columns], dim=-1)
