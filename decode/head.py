"""SpecDec++ acceptance-prediction head (DESIGN §2) and its input features."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

Timing = Literal["post", "pre"]

#: Scalar features of the sampled candidate, available to a ``pre`` head without a draft call.
PRE_FEATURES: tuple[str, ...] = ("log_q", "entropy", "top_prob")
#: Companion SV indicators (DESIGN §3), optional extra features of a ``pre`` head.
COMPANION_FEATURES: tuple[str, ...] = ("companion_x", "companion_y")


@dataclass(frozen=True)
class HeadConfig:
    """Shape and input contract of an :class:`AcceptanceHead`.

    ``timing="post"``: input is the draft's final hidden state of the forward that consumed
    ``y_i``. ``timing="pre"``: input is the hidden state that produced ``q_i`` concatenated with
    ``features`` of the sampled ``y_i`` (plus the companion's ``X_i, Y_i`` when
    ``companion_features``).
    """

    hidden_size: int
    depth: int = 3
    timing: Timing = "post"
    features: tuple[str, ...] = field(default=())
    companion_features: bool = False

    def __post_init__(self) -> None:
        if self.timing not in ("post", "pre"):
            raise ValueError(f"timing must be 'post' or 'pre', got {self.timing!r}")
        if self.depth < 0 or self.hidden_size < 1:
            raise ValueError(f"need depth >= 0 and hidden_size >= 1, got {self.depth}, {self.hidden_size}")
        object.__setattr__(self, "features", tuple(self.features))
        if self.timing == "post" and (self.features or self.companion_features):
            raise ValueError("a 'post' head takes only the hidden state: no features, no companion features")
        unknown = set(self.features) - set(PRE_FEATURES)
        if unknown:
            raise ValueError(f"unknown head features {sorted(unknown)}; valid: {', '.join(PRE_FEATURES)}")

    @property
    def feature_names(self) -> tuple[str, ...]:
        """All scalar features in input order."""
        return self.features + (COMPANION_FEATURES if self.companion_features else ())

    @property
    def input_size(self) -> int:
        """Width of the blocks: hidden size plus the number of scalar features."""
        return self.hidden_size + len(self.feature_names)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (tuples become lists)."""
        data = asdict(self)
        data["features"] = list(self.features)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**data, "features": tuple(data.get("features", ()))})


class AcceptanceHead(nn.Module):
    """``D`` residual blocks ``h ← h + SiLU(W_d h + b_d)`` (independent weights), then a linear logit."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        width = config.input_size
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(config.depth))
        self.out = nn.Linear(width, 1)
        self.metadata: dict[str, Any] = {}

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
) -> Tensor:
    """Scalar features ``[..., F]`` of candidates ``y[...]`` drawn from ``q_probs[..., V]`` (vectorised).

    ``log_q = log q(y)``, ``entropy = H(q)`` (nats), ``top_prob = max q``; ``companion`` is the
    ``(X, Y)`` pair appended when the head uses companion features.
    """
    columns: list[Tensor] = []
    for name in names:
        if name == "log_q":
            columns.append(q_probs.gather(-1, y.unsqueeze(-1)).squeeze(-1).clamp_min(1e-30).log())
        elif name == "entropy":
            columns.append(-torch.xlogy(q_probs, q_probs).sum(-1))
        elif name == "top_prob":
            columns.append(q_probs.max(-1).values)
        else:
            raise ValueError(f"unknown head feature {name!r}; valid: {', '.join(PRE_FEATURES)}")
    if companion is not None:
        columns.extend(companion)
    return torch.stack([c.float() for c in columns], dim=-1)
