"""A feature-conditioned draft (EAGLE-style): it reads the target's hidden states as well as the tokens.

At position ``t`` its input is the embedding of token ``t`` and a feature of position ``t − 1``: the target's
(``feature_layers`` of the target's ``hidden_states``, concatenated, then fused to one hidden width) where the
target has read that position, else the draft's own output there. A projection ``fc`` maps the pair to one
hidden state, then Llama decoder layers, the final norm and an output layer (the target's tied embeddings, or a
:class:`decode.subset_vocab.SubsetVocabHead`, full or low-rank: ``q = 0`` off the subset, lossless). With
``feature_norm`` (EAGLE-3.1) each of the target's layers is RMS-normalised before they are fused, and so is
every feature the draft reads, the target's or its own fed back (``docs/design.md`` §8). Its own output at ``t`` (the
output layer's input) is trained to be the target's feature at ``t`` (``docs/design.md`` §8), so it feeds the
next drafting step. It keeps its own KV cache like any causal LM; :mod:`decode.drafts.feature` feeds it (its kind).

Its first layer is this project's (``first_layer="fc"``: ``fc`` into a Llama layer, as above) or EAGLE-3's as vLLM and
speculators load it (``"eagle3"``, :class:`Eagle3FirstLayer`): attention reads the token's normalised embedding beside
the normalised feature, the residual stream starts from the feature, the final norm sits in the output layer so the
fed-back output is the pre-norm one, and the prompt's first position (it has no feature) is never attended
(``docs/design.md`` §8; :mod:`decode.artifacts.export_draft` writes it as a speculators checkpoint).

``AutoModelForCausalLM`` loads it once this module is imported (:mod:`decode.artifacts.hub` does): its config's
``model_type`` is ``llama_feature_draft``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

from decode.cache_api import cache_kwargs
from decode.subset_vocab import SubsetVocabHead

MODEL_TYPE = "llama_feature_draft"
#: The record a built feature draft's directory carries (model_build.feature_draft): its recipe, its training and
#: every file's sha256, which :func:`decode.artifacts.hub.load_causal_lm` checks before loading the directory.
BUILD_RECORD = "feature_draft.json"
#: How the first layer reads a token and its feature: this project's projection, or EAGLE-3's layer.
FIRST_LAYERS = ("fc", "eagle3")


@strict
class FeatureDraftConfig(LlamaConfig):
    """A :class:`LlamaConfig` for the draft's own layers, plus what it reads of the target.

    ``feature_layers``: indices into the target's ``hidden_states`` (HF's convention: ``n`` is the output of
    the first ``n`` layers, the last index the final norm's output); ``target_hidden_size``: their width;
    ``draft_vocab_size``: how many tokens the output layer scores (None: all, through the tied embeddings);
    ``draft_head_rank``: the rank of that subset's scores (None: full); ``feature_norm``: EAGLE-3.1's norms (with
    ``first_layer="eagle3"``: one per target layer read, vLLM's ``fc_norm``); ``first_layer``: one of
    :data:`FIRST_LAYERS`; an eagle3 first layer's variants as vLLM names them: ``norm_before_residual`` (the
    residual stream starts from the normalised feature) and ``norm_output`` (the output fed back is the normalised
    one).
    """

    model_type = MODEL_TYPE

    feature_layers: list[int] | None = None
    target_hidden_size: int | None = None
    draft_vocab_size: int | None = None
    draft_head_rank: int | None = None
    feature_norm: bool = False
    first_layer: str = "fc"
    norm_before_residual: bool = False
    norm_output: bool = False


class Eagle3FirstLayer(LlamaDecoderLayer):
    """EAGLE-3's first decoder layer (vLLM's ``Eagle3LlamaForCausalLM`` with ``norm_before_residual`` off): its
    input ``[B, L, 2H]`` is the token's embedding beside the feature it reads; attention reads both normalised
    (``input_layernorm``, ``hidden_norm``; its q/k/v projections are ``2H`` wide) and the residual stream starts from
    the feature (normalised with ``norm_before_residual``)."""

    def __init__(self, config: FeatureDraftConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.norm_before_residual = config.norm_before_residual
        attention = self.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            narrow = getattr(attention, name)
            setattr(attention, name, nn.Linear(2 * config.hidden_size, narrow.out_features,
                                               bias=narrow.bias is not None))
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: Tensor, **kwargs: object) -> Tensor:
        embeds, features = hidden_states.chunk(2, dim=-1)
        normed = self.hidden_norm(features)
        reads = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        residual = normed if self.norm_before_residual else features
        hidden_states = residual + self.self_attn(hidden_states=reads, **kwargs)[0]
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class FeatureDraftForCausalLM(LlamaForCausalLM):
    """The feature draft: ``fc(embed(token_t) ⊕ feature_{t−1})`` → Llama layers → norm → output layer.

    ``forward`` takes every :class:`LlamaForCausalLM` argument plus ``features [B, L, H]``: the feature each
    input position reads (of the position before it; already fused, :meth:`fuse_features`).
    """

    config_class = FeatureDraftConfig
    _tied_weights_keys: dict[str, str] = {}

    def __init__(self, config: FeatureDraftConfig) -> None:
        super().__init__(config)
        if not config.feature_layers or config.target_hidden_size is None:
            raise ValueError("a feature draft's config names feature_layers and target_hidden_size")
        if config.first_layer not in FIRST_LAYERS:
            raise ValueError(f"unknown first_layer {config.first_layer!r}: choose one of {FIRST_LAYERS}")
        eagle3 = config.first_layer == "eagle3"
        if eagle3 and config.draft_vocab_size is None:
            raise ValueError("an eagle3 draft scores through an output layer of its own: set draft_vocab_size")
        width, hidden = len(config.feature_layers) * config.target_hidden_size, config.hidden_size
        #: Several target layers (EAGLE-3) or another width → one hidden state; None when they already are one
        #: (an eagle3 draft always has it: vLLM's ``fc``).
        self.fuse = nn.Linear(width, hidden, bias=False) if width != hidden or eagle3 else None
        self.fc = None if eagle3 else nn.Linear(2 * hidden, hidden, bias=True)
        #: EAGLE-3.1: one norm per target layer read (before fusing), one on every feature read (an eagle3 draft's
        #: first layer has its own, ``hidden_norm``).
        self.feature_norms = (nn.ModuleList(LlamaRMSNorm(config.target_hidden_size, config.rms_norm_eps)
                                            for _ in config.feature_layers) if config.feature_norm else None)
        self.read_norm = LlamaRMSNorm(hidden, config.rms_norm_eps) if config.feature_norm and not eagle3 else None
        #: the final norm sits in the output layer, so that the output fed back is the pre-norm one (EAGLE-3)
        norm_in_head = eagle3 and not config.norm_output
        if config.draft_vocab_size is not None:
            self.lm_head = SubsetVocabHead(hidden, config.vocab_size, config.draft_vocab_size, config.draft_head_rank,
                                           norm_eps=config.rms_norm_eps if norm_in_head else None)
        elif config.draft_head_rank is not None:
            raise ValueError("a low-rank output layer scores a subset: set draft_vocab_size too")
        if eagle3:
            self.model.layers[0] = Eagle3FirstLayer(config, 0)
        if norm_in_head:
            self.model.norm = nn.Identity()
        self.post_init()

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target's ``hidden_states`` it reads."""
        return tuple(self.config.feature_layers)

    def fuse_features(self, features: Tensor) -> Tensor:
        """The target's concatenated features ``[..., len(feature_layers) · H_target]`` → the draft's ``[..., H]``."""
        features = features.to(self.model.embed_tokens.weight.dtype)
        if self.feature_norms is not None:
            parts = features.split(self.config.target_hidden_size, dim=-1)
            features = torch.cat([norm(part) for norm, part in zip(self.feature_norms, parts)], dim=-1)
        return self.fuse(features) if self.fuse is not None else features

    def forward(self, input_ids: Tensor | None = None, features: Tensor | None = None, **kwargs: object
                ) -> CausalLMOutputWithPast:
        """Logits of the tokens ``input_ids [B, L]`` each read with ``features [B, L, H]`` (fused)."""
        if input_ids is None or features is None:
            raise ValueError("a feature draft reads tokens and the target's features: pass input_ids and features "
                             "(decode.SpeculativeDecoder feeds them)")
        if self.fc is None:
            kwargs["attention_mask"] = featured_keys(kwargs.get("attention_mask"), input_ids, kwargs)
        return super().forward(inputs_embeds=self.inputs(input_ids, features), **kwargs)

    def inputs(self, input_ids: Tensor, features: Tensor) -> Tensor:
        """What the first layer reads: ``fc(embed(input_ids) ⊕ features)`` ``[B, L, H]`` (features normalised first
        with ``feature_norm``; a zero feature, read where there is none, stays zero), or for an eagle3 draft the
        pair itself ``[B, L, 2H]``."""
        embeds = self.model.embed_tokens(input_ids)
        features = features.to(embeds.dtype)
        if self.fc is None:
            return torch.cat([embeds, features], dim=-1)
        if self.read_norm is not None:
            features = self.read_norm(features)
        return self.fc(torch.cat([embeds, features], dim=-1))


def featured_keys(attention_mask: Tensor | None, input_ids: Tensor, kwargs: dict) -> Tensor:
    """An eagle3 draft's 2-D attention mask ``[B, keys]``: ``attention_mask`` (all ones where None) without each row's
    first attended position, which has no feature (vLLM's draft starts at the prompt's second token). A 4-D mask
    passes unchanged (:func:`depth_hidden` builds its own, :func:`round_mask`)."""
    if attention_mask is not None and attention_mask.dim() != 2:
        return attention_mask
    if attention_mask is None:
        cache = next((kwargs[name] for name in ("cache", "past_key_values") if kwargs.get(name) is not None), None)
        limit = -1 if cache is None else cache.get_max_length()
        # a static cache: its every column (those not written yet masked by position); else the keys so far
        keys = limit if limit > 0 else input_ids.shape[1] + (0 if cache is None else int(cache.get_seq_length()))
        attention_mask = torch.ones(input_ids.shape[0], keys, dtype=torch.long, device=input_ids.device)
    return attention_mask * ~first_attended(attention_mask)


def first_attended(attention_mask: Tensor) -> Tensor:
    """``[B, keys]``: True at each row's first attended position."""
    return (attention_mask.cumsum(-1) == 1) & attention_mask.bool()


def target_features(hidden_states: Sequence[Tensor], layers: Sequence[int]) -> Tensor:
    """The target's features ``[B, L, len(layers) · H]``: its ``hidden_states`` at ``layers``, concatenated."""
    return torch.cat([hidden_states[n] for n in layers], dim=-1)


def feature_reads(features: Tensor, attention_mask: Tensor) -> Tensor:
    """What each position reads ``[B, L, H]``: the feature of the position before it, zero where that is padding or
    there is none (the first token)."""
    before = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
    known = torch.cat([torch.zeros_like(attention_mask[:, :1]), attention_mask[:, :-1]], dim=1)
    return before * known[..., None].to(before.dtype)


def round_mask(attention_mask: Tensor, depth: int, dtype: torch.dtype, first_keys: bool = True) -> Tensor:
    """The additive attention mask ``[B, 1, L, depth · L]`` of pass ``depth`` of :func:`depth_hidden`.

    Query position ``t`` at depth ``d`` is a round started at ``s = t − d + 1``: it sees pass 1 (the target-fed
    positions) up to ``s`` and pass ``j`` at ``s + j − 1`` alone, for ``j = 2 .. d`` (the round's own steps); without
    ``first_keys`` no query sees a row's first position (an eagle3 draft's, :func:`featured_keys`).
    """
    length = attention_mask.shape[1]
    t = torch.arange(length, device=attention_mask.device)
    blocks = [t[None, :] <= (t[:, None] - depth + 1)]
    blocks += [t[None, :] == (t[:, None] - depth + j) for j in range(2, depth + 1)]
    allowed = torch.cat(blocks, dim=1)[None] & attention_mask.bool().repeat(1, depth)[:, None, :]  # [B, L, d·L]
    if not first_keys:  # an eagle3 draft never attends the first position, which has no feature
        allowed[:, :, :length] &= ~first_attended(attention_mask)[:, None, :]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def depth_hidden(draft: FeatureDraftForCausalLM, input_ids: Tensor, attention_mask: Tensor, reads: Tensor,
                 depths: int) -> list[Tensor]:
    """The draft's outputs (its output layer's input) ``[B, L, H]`` at depths ``1 .. depths`` of a round, along
    ``input_ids`` (teacher-forced), as decoding computes them (``docs/design.md`` §8).

    Depth ``d`` at position ``t`` is the step of a round that started by feeding position ``t − d + 1`` with the
    target's feature (``reads``, :func:`feature_reads`) and then fed the next ``d − 1`` tokens each with the draft's
    own output before it. One forward per depth over the whole batch, every pass appended to one KV cache and
    masked by :func:`round_mask`, so each step attends to exactly the keys an incremental round has. Gradients flow
    (training's training-time test unrolls through it); callers that only read wrap it in ``torch.no_grad``.
    """
    positions = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    cache = DynamicCache(config=draft.config)
    outputs: list[Tensor] = []
    fed = reads
    for depth in range(1, depths + 1):
        mask = round_mask(attention_mask, depth, draft.dtype, first_keys=draft.fc is not None)
        out = draft.model(inputs_embeds=draft.inputs(input_ids, fed), attention_mask=mask, position_ids=positions,
                          **cache_kwargs(draft.model, cache))
        outputs.append(out.last_hidden_state)
        fed = torch.cat([torch.zeros_like(out.last_hidden_state[:, :1]), out.last_hidden_state[:, :-1]], dim=1)
    return outputs


@torch.no_grad()
def teacher_forced_rounds(target: PreTrainedModel, draft: FeatureDraftForCausalLM, input_ids: Tensor,
                          attention_mask: Tensor, depths: int) -> list[Tensor]:
    """:func:`depth_hidden` along ``input_ids [B, L]`` (any padding), the target's features read from one forward."""
    positions = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    out = target(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                 output_hidden_states=True, logits_to_keep=1)
    features = draft.fuse_features(target_features(out.hidden_states, draft.feature_layers))
    return depth_hidden(draft, input_ids, attention_mask, feature_reads(features, attention_mask), depths)


AutoConfig.register(MODEL_TYPE, FeatureDraftConfig, exist_ok=True)
AutoModelForCausalLM.register(FeatureDraftConfig, FeatureDraftForCausalLM, exist_ok=True)
