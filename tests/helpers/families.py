"""Tiny random-init models of every family the experiments name, built from configs (no hub): Llama, Qwen2,
Mistral (a sliding window on every layer), Gemma-2/3 (a local and a global layer), Phi-3, GPT-2."""

from __future__ import annotations

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

VOCAB = 64
HIDDEN = 16
WINDOW = 8
HYBRID = ["sliding_attention", "full_attention"]
#: family: (config class, model class, family-specific config arguments)
FAMILIES: dict[str, tuple[type, type, dict]] = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": WINDOW}),
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, {"sliding_window": WINDOW, "head_dim": 8, "layer_types": HYBRID}),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, {"sliding_window": WINDOW, "head_dim": 8, "layer_types": HYBRID}),
    "phi3": (Phi3Config, Phi3ForCausalLM, {}),
    "gpt2": (GPT2Config, GPT2LMHeadModel, {}),
}


def build(family: str, seed: int = 1, vocab: int = VOCAB, window: int = WINDOW, init: float = 0.3) -> PreTrainedModel:
    """A random 2-layer float32 model of ``family`` in eval mode, without BOS/EOS/PAD (``window`` if it slides)."""
    config_class, model_class, extra = FAMILIES[family]
    extra = {**extra, "sliding_window": window} if "sliding_window" in extra else extra
    config = config_class(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128, initializer_range=init,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra,
    )
    torch.manual_seed(seed)
    return model_class(config).eval()
