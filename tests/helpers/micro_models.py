"""Micro random models built in memory (no files, no network): causal LMs, feature drafts, a word tokenizer, and the
micro trio's shapes; the reference a feature draft's rounds are checked against."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

#: The micro trio's models (``micro_trio`` fixture), role: (layers, hidden, heads, seed).
MICRO_SHAPES = {
    "target": (2, 48, 4, 1),
    "draft": (1, 32, 2, 2),
    "companion": (1, 24, 2, 3),
}


def micro_lm(vocab: int, seed: int, hidden: int = 16, layers: int = 1, init: float = 0.5,
             context: int = 256) -> PreTrainedModel:
    """A random float32 LlamaForCausalLM in eval mode, without EOS/BOS/PAD tokens."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=context,
        initializer_range=init,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).eval()


def word_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """An in-memory word-level tokenizer mapping ``w{i}`` to id ``i``."""
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0")


def micro_feature_draft(target: PreTrainedModel, seed: int, hidden: int = 16, feature_layers: tuple[int, ...] | None = None,
                        subset: list[int] | None = None, init: float = 0.5, head_rank: int | None = None,
                        feature_norm: bool = False, first_layer: str = "fc", decoder_layers: int = 1,
                        **variants: bool) -> PreTrainedModel:
    """A random float32 feature draft reading ``target``'s hidden states (its final ones by default); ``head_rank``
    and ``feature_norm``: the v2 recipe's low-rank subset head and EAGLE-3.1's norms; ``first_layer="eagle3"``:
    EAGLE-3's first layer (``variants``: its ``norm_before_residual`` / ``norm_output``), every norm away from the
    identity."""
    from decode.drafts.feature_model import FeatureDraftConfig, FeatureDraftForCausalLM

    torch.manual_seed(seed)
    layers = feature_layers if feature_layers is not None else (target.config.num_hidden_layers,)
    config = FeatureDraftConfig(
        vocab_size=target.config.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=decoder_layers, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
        initializer_range=init, first_layer=first_layer, **variants,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, feature_layers=list(layers),
        target_hidden_size=target.config.hidden_size, draft_vocab_size=len(subset) if subset is not None else None,
        tie_word_embeddings=subset is None, draft_head_rank=head_rank, feature_norm=feature_norm,
    )
    model = FeatureDraftForCausalLM(config)
    # norms away from the identity, so a test sees them: EAGLE-3.1's, or every one of an EAGLE-3 first layer's draft
    norms = ([weight for name, weight in model.named_parameters() if "norm" in name] if first_layer == "eagle3"
             else [norm.weight for norm in [*model.feature_norms, model.read_norm]] if feature_norm else [])
    with torch.no_grad():
        for weight in norms:
            weight.uniform_(0.5, 1.5)
    if subset is not None:
        model.lm_head.token_ids.copy_(torch.tensor(subset))
    return model.eval()


@torch.inference_mode()
def incremental_round_logits(target: PreTrainedModel, draft: PreTrainedModel, sequence: list[int],
                             depths: int) -> list[dict[int, torch.Tensor]]:
    """Reference for a feature draft's rounds, one token per forward as decoding drafts: per depth ``d``, position
    ``u`` → the draft's logits ``[V]`` predicting token ``u + 1`` in the round started at ``u − d + 1``."""
    from transformers import DynamicCache

    from decode.cache_api import cache_kwargs, drop_last
    from decode.drafts.feature_model import target_features

    ids = torch.tensor([sequence])
    hidden_states = target(ids, output_hidden_states=True).hidden_states
    features = draft.fuse_features(target_features(hidden_states, draft.feature_layers))[0]
    reads = torch.cat([torch.zeros_like(features[:1]), features[:-1]])
    by_depth: list[dict[int, torch.Tensor]] = [{} for _ in range(depths)]
    cache = DynamicCache(config=draft.config)
    for start in range(len(sequence)):
        feature = reads[None, start:start + 1]
        for depth in range(1, depths + 1):
            position = start + depth - 1
            if position >= len(sequence):
                break
            out = draft(input_ids=ids[:, position:position + 1], features=feature, output_hidden_states=True,
                        **cache_kwargs(draft, cache))
            by_depth[depth - 1][position] = out.logits[0, -1]
            feature = out.hidden_states[-1][:, -1:]
        drop_last(cache, cache.get_seq_length() - (start + 1))
    return by_depth
