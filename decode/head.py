"""SpecDec++ acceptance-prediction head (DESIGN §2) and its input features."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from decode.digests import Loaded
from decode.head_config import (
    DEPTH_FEATURE,
    HEAD_FEATURES,
    PRE_FEATURES,
    PREVIOUS_TOKEN,
    REQUEST_FEATURE,
    ROUND_FEATURE,
    TOP_K_FEATURES,
    HeadConfig,
)
from decode.metadata import HeadMetadata


class AcceptanceHead(nn.Module):
    """``D`` residual blocks ``h ← h + SiLU(W_d h + b_d)`` (independent weights), then a linear logit."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        width = config.input_size
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(config.depth))
        self.out = nn.Linear(width, 1)
        #: DSpark's Markov embedding of the previous token (``markov_rank > 0``), else None.
        self.markov = nn.Embedding(config.vocab_size, config.markov_rank) if config.markov_rank else None
        self.metadata: HeadMetadata | None = None  # what its file records (None: made in memory)
        # its stop threshold h, chosen on dev by the evaluation (decode.artifacts.threshold_choice; None: none)
        self.threshold: float | None = None
        self.loaded: Loaded | None = None  # its file, and whether its recorded sha256 was checked (decode.load_head)

    def forward(self, hidden: Tensor, features: Tensor | None = None) -> Tensor:
        """Acceptance logits ``[...]`` from hidden states ``[..., H]`` (and features ``[..., F]``; a
        ``previous_token`` column holds token ids, embedded by :attr:`markov`)."""
        names = self.config.feature_names
        if names:
            if features is None or features.shape[-1] != len(names):
                raise ValueError(f"head expects {len(names)} features {names}")
            columns = [features]
            if self.markov is not None:
                j = names.index(PREVIOUS_TOKEN)
                tokens = features[..., j].long().clamp(0, self.markov.num_embeddings - 1)
                columns = [features[..., :j], features[..., j + 1 :], self.markov(tokens)]
            hidden = torch.cat([hidden, *(c.to(hidden.dtype) for c in columns)], dim=-1)
        for block in self.blocks:
            hidden = hidden + nn.functional.silu(block(hidden))
        return self.out(hidden).squeeze(-1)

    def predict(self, hidden: Tensor, features: Tensor | None = None) -> Tensor:
        """Predicted acceptance probabilities ``σ(logit)``."""
        return torch.sigmoid(self(hidden, features))


def candidate_log_q(q_probs: Tensor, y: Tensor) -> Tensor:
    """``log q(y)`` of candidates ``y[...]`` under ``q_probs[..., V]`` (the ``log_q`` feature; floored at 1e-30)."""
    return q_probs.gather(-1, y.unsqueeze(-1)).squeeze(-1).clamp_min(1e-30).log()


def head_features(
    q_probs: Tensor,
    y: Tensor,
    names: tuple[str, ...] = PRE_FEATURES,
    companion: tuple[Tensor, Tensor] | None = None,
    depth: Tensor | int | None = None,
    previous: Tensor | None = None,
    request: Tensor | float | None = None,
    round_log_q: Tensor | float | None = None,
) -> Tensor:
    """Scalar features ``[..., F]`` of candidates ``y[...]`` drawn from ``q_probs[..., V]`` (vectorised).

    ``log_q = log q(y)``, ``entropy = H(q)`` (nats), ``top_prob = max q`` and ``top2_prob`` .. ``top4_prob`` the next
    largest, ``depth`` the candidates' depth in their round (broadcast to ``y``'s shape; :meth:`HeadConfig.depth_of`);
    ``previous_token`` the ids ``previous`` (shaped as ``y``) of the tokens whose forwards produced ``q``;
    ``request_acceptance`` the request's running rate of accepted first candidates ``request`` and ``round_log_q``
    the round's earlier candidates' summed ``log q`` (each broadcast to ``y``'s shape;
    :data:`~decode.head_config.REQUEST_FEATURE`, :data:`~decode.head_config.ROUND_FEATURE`);
    ``companion`` is the ``(X, Y)`` pair appended when the head uses companion features.
    """
    given = {REQUEST_FEATURE: request, ROUND_FEATURE: round_log_q}
    ranked = q_probs.topk(1 + len(TOP_K_FEATURES), dim=-1).values if set(names) & set(TOP_K_FEATURES) else None
    columns: list[Tensor] = []
    for name in names:
        if name == "log_q":
            columns.append(candidate_log_q(q_probs, y))
        elif name == "entropy":
            columns.append(-torch.xlogy(q_probs, q_probs).sum(-1))
        elif name == "top_prob":
            columns.append(q_probs.max(-1).values)
        elif name in TOP_K_FEATURES:
            columns.append(ranked[..., 1 + TOP_K_FEATURES.index(name)])
        elif name == DEPTH_FEATURE:
            if depth is None:
                raise ValueError("the depth feature needs each candidate's depth in its round")
            columns.append(torch.as_tensor(depth, dtype=torch.float32, device=y.device).expand(y.shape))
        elif name in given:
            if given[name] is None:
                raise ValueError(f"the {name} feature needs its value (the request's or the round's history so far)")
            columns.append(torch.as_tensor(given[name], dtype=torch.float32, device=y.device).expand(y.shape))
        elif name == PREVIOUS_TOKEN:
            if previous is None:
                raise ValueError("the previous_token feature needs the ids of the tokens that produced q")
            columns.append(previous.expand(y.shape))
        else:
            raise ValueError(f"unknown head feature {name!r}; valid: {', '.join(HEAD_FEATURES)}")
    if companion is not None:
        columns.extend(companion)
    return torch.stack([c.float() for c in columns], dim=-1)


def dspark_tensors(head: AcceptanceHead) -> dict[str, Tensor]:
    """A DSpark-style head's tensors under the names vLLM's and SGLang's DSpark loaders read: the linear logit over
    ``[hidden ⊕ Markov embedding]`` as ``confidence_head.proj.weight [1, H + r]`` / ``.bias [1]`` and the previous
    token's embedding as ``markov_head.weight [V, r]``. Only a linear head whose one feature is ``previous_token``
    has that layout (docs/evaluation.md, "The predictor league")."""
    config = head.config
    if head.markov is None or config.depth != 0 or config.feature_names != (PREVIOUS_TOKEN,):
        raise ValueError("only a linear head on the hidden state and the previous token's Markov embedding has "
                         f"DSpark's layout; this one has depth {config.depth}, features {config.feature_names}")
    return {"confidence_head.proj.weight": head.out.weight.detach(),
            "confidence_head.proj.bias": head.out.bias.detach(),
            "markov_head.weight": head.markov.weight.detach()}
