"""Llama model construction for the zoo's three roles."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from .recipe import ModelShape


def llama_config(shape: ModelShape, tokenizer: PreTrainedTokenizerFast, context: int) -> LlamaConfig:
    """A small Llama configuration with tied embeddings and the tokenizer's special ids."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=context,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_model(shape: ModelShape, tokenizer: PreTrainedTokenizerFast, context: int) -> LlamaForCausalLM:
    """A freshly initialised model, seeded by ``shape.seed`` without touching the global RNG."""
    config = llama_config(shape, tokenizer, context)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(shape.seed)
        model = LlamaForCausalLM(config)
    return model


@torch.no_grad()
def fold_temperature(model: LlamaForCausalLM, temperature: float) -> None:
    """Make ``model`` emit ``logits / temperature`` by scaling its final norm's weight in place.

    The final RMSNorm feeds only the language-model head, so scaling its weight scales the logits
    exactly, also with tied input / output embeddings (where scaling the head would scale the inputs).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    model.model.norm.weight.div_(temperature)


def parameter_count(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
