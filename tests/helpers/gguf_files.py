"""Writing a Llama as a GGUF file with the ``gguf`` package's writer, as llama.cpp's converter lays it out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from transformers import LlamaForCausalLM


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary layout of q / k rows (its converter's ``permute``; transformers undoes it on load)."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def write_gguf(model: LlamaForCausalLM, tokenizer_dir: Path, path: Path, architecture: str = "llama") -> Path:
    """``model`` and its byte-level BPE tokenizer as an F32 GGUF file, named as llama.cpp's converter names them."""
    config = model.config
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
    special = {added["id"] for added in spec["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([3 if index in special else 1 for _, index in vocab])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_pad_token_id(config.pad_token_id)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for layer in range(config.num_hidden_layers):
        for ours, theirs in names.items():
            weights = state[f"model.layers.{layer}.{ours}.weight"]
            if theirs == "attn_q":
                weights = _permute(weights, config.num_attention_heads)
            elif theirs == "attn_k":
                weights = _permute(weights, config.num_key_value_heads)
            writer.add_tensor(f"blk.{layer}.{theirs}.weight", weights)
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    if not config.tie_word_embeddings:
        writer.add_tensor("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
