"""A Llama causal LM whose output layer scores a subset of the vocabulary: a reduced-vocabulary draft.

A draft's output layer over a real vocabulary (576 × 49,152 for SmolLM2) can cost as much as its
layers; EAGLE-3 and FR-Spec score only the tokens the target actually writes. Here the subset is a
buffer of the head (``lm_head.token_ids``, the draft → target id map) and the model still returns
logits over the *whole* vocabulary: every token outside the subset gets the dtype's lowest finite
value, so its draft probability is exactly zero after ``softmax``. Every consumer (the decoders, the
rules, collection, HF assisted generation) therefore sees an ordinary model whose ``q`` vanishes
off the subset, and speculative sampling stays lossless: a token the draft cannot propose is still
reached through the residual ``max(p − q, 0)`` (``docs/design.md`` §1).

``AutoModelForCausalLM`` loads it once this module is imported (:mod:`decode.artifacts.hub` does):
its config's ``model_type`` is ``llama_subset_vocab``.
"""

from __future__ import annotations

import torch
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

MODEL_TYPE = "llama_subset_vocab"


class SubsetVocabHead(nn.Module):
    """``logits[..., token_ids] = x @ weight.T``; every other token of ``vocab_size`` gets the lowest finite logit.

    With a ``rank`` the subset's scores are low-rank (SlimSpec): ``x`` is first projected to ``rank`` dimensions
    (``down``), and ``weight`` is ``[subset, rank]``. With ``norm_eps`` ``x`` is RMS-normalised first (``norm``: the
    model's final norm, kept here so that its hidden state is the pre-norm one, as an EAGLE-3 draft feeds back).
    """

    def __init__(self, hidden_size: int, vocab_size: int, subset_size: int, rank: int | None = None,
                 norm_eps: float | None = None) -> None:
        super().__init__()
        self.in_features = hidden_size
        self.out_features = vocab_size  # the width of the logits, as for nn.Linear
        self.norm = LlamaRMSNorm(hidden_size, eps=norm_eps) if norm_eps is not None else None
        self.down = nn.Linear(hidden_size, rank, bias=False) if rank is not None else None  # [rank, H]
        self.weight = nn.Parameter(torch.empty(subset_size, rank or hidden_size))  # [subset, rank or H]
        self.register_buffer("token_ids", torch.arange(subset_size, dtype=torch.long))  # [subset] target ids
        nn.init.normal_(self.weight, std=0.02)

    def scores(self, hidden: Tensor) -> Tensor:
        """The subset's logits ``[..., subset]`` of hidden states ``[..., H]`` (column ``i``: ``token_ids[i]``)."""
        if self.norm is not None:
            hidden = self.norm(hidden)
        return nn.functional.linear(self.down(hidden) if self.down is not None else hidden, self.weight)

    def forward(self, hidden: Tensor) -> Tensor:
        """``[..., vocab_size]`` logits of hidden states ``[..., H]``."""
        scored = self.scores(hidden)
        logits = scored.new_full((*scored.shape[:-1], self.out_features), torch.finfo(scored.dtype).min)
        return logits.index_copy_(-1, self.token_ids, scored)


@strict
class SubsetVocabLlamaConfig(LlamaConfig):
    """A :class:`LlamaConfig` plus ``draft_vocab_size``: how many tokens the output layer scores."""

    model_type = MODEL_TYPE

    draft_vocab_size: int = 32000


class SubsetVocabLlamaForCausalLM(LlamaForCausalLM):
    """:class:`LlamaForCausalLM` with a :class:`SubsetVocabHead` (never tied to the input embeddings)."""

    config_class = SubsetVocabLlamaConfig
    _tied_weights_keys: dict[str, str] = {}

    def __init__(self, config: SubsetVocabLlamaConfig) -> None:
        super().__init__(config)
        self.lm_head = SubsetVocabHead(config.hidden_size, config.vocab_size, config.draft_vocab_size)
        self.post_init()

    @property
    def subset(self) -> Tensor:
        """The target ids the output layer scores ``[draft_vocab_size]``."""
        return self.lm_head.token_ids


AutoConfig.register(MODEL_TYPE, SubsetVocabLlamaConfig, exist_ok=True)
AutoModelForCausalLM.register(SubsetVocabLlamaConfig, SubsetVocabLlamaForCausalLM, exist_ok=True)


def plain_llama(model: SubsetVocabLlamaForCausalLM) -> LlamaForCausalLM:
    """``model`` as a stock :class:`LlamaForCausalLM`, for engines that load only stock architectures (vLLM).

    Its output layer scores the whole vocabulary: the subset's rows are the draft's, every other row is zero, so a
    token off the subset gets logit 0 rather than the lowest value. The greedy proposal is the draft's wherever its
    best subset logit is positive (:func:`plain_greedy_agreement` counts it); a verifier keeps the output exact
    either way.
    """
    fields = {key: value for key, value in model.config.to_dict().items()
              if key not in ("draft_vocab_size", "model_type", "architectures", "auto_map")}
    plain = LlamaForCausalLM(LlamaConfig(**fields)).to(dtype=model.dtype, device=model.device).eval()
    state = {name: value for name, value in model.state_dict().items() if not name.startswith("lm_head.")}
    head = model.lm_head.weight.new_zeros(model.config.vocab_size, model.config.hidden_size)  # [V, H]
    head[model.subset] = model.lm_head.weight.detach()
    plain.load_state_dict({**state, "lm_head.weight": head})
    return plain


def plain_greedy_agreement(model: SubsetVocabLlamaForCausalLM, input_ids: Tensor) -> float:
    """The share of positions of ``input_ids [B, n]`` where :func:`plain_llama`'s greedy token is ``model``'s."""
    with torch.no_grad():
        best = model(input_ids=input_ids).logits.amax(-1)  # [B, n]: the best subset logit (the rest are the lowest)
    # off the subset the export scores 0: its argmax is the draft's where the best subset logit is above 0
    return (best > 0).float().mean().item()
