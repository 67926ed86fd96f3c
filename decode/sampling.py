"""The sampling transform (temperature, top-k, top-p) applied identically to every model's logits."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from decode.json_types import JSONDict


@dataclass(frozen=True)
class Sampling:
    """Temperature / top-k / top-p transform; ``temperature=0`` means greedy (one-hot argmax).

    The same transform is applied to the target's, the draft's and the companion's logits before
    any acceptance ratio is formed, and the draft samples from the transformed ``q``.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        """True when the transform collapses every distribution onto its argmax."""
        return self.temperature == 0

    def warp(self, logits: Tensor) -> Tensor:
        """Float32 logits after temperature, top-k and top-p (masked entries are ``-inf``)."""
        logits = logits.float()
        if self.temperature not in (0.0, 1.0):
            logits = logits / self.temperature
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            sorted_probs = sorted_logits.softmax(-1)
            # Drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token).
            drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= self.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits

    def probs(self, logits: Tensor) -> Tensor:
        """Post-transform probabilities over the last dimension (one-hot argmax when greedy)."""
        if self.greedy:
            return one_hot_argmax(logits)
        return self.warp(logits).softmax(-1)

    def feature_probs(self, logits: Tensor) -> Tensor:
        """Distribution used for confidence-type features (top probability, entropy, SV X/Y).

        Equal to :meth:`probs`, except under greedy decoding where one-hot distributions carry no
        information: there the untempered softmax of the raw logits is used.
        """
        if self.greedy:
            return logits.float().softmax(-1)
        return self.probs(logits)

    def to_dict(self) -> JSONDict:
        """JSON-ready description, stored in dataset and artifact metadata."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: JSONDict) -> Sampling:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


def one_hot_argmax(logits: Tensor) -> Tensor:
    """Float32 one-hot of the argmax over the last dimension."""
    out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
