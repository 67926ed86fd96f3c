"""Shared fixtures. Every test runs offline: no model hub, no dataset hub, no W&B."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["WANDB_MODE"] = "disabled"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# imported after the environment is set: huggingface_hub reads it when it is first imported
from pathlib import Path

import pytest

from tests.helpers.micro_models import MICRO_SHAPES


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _private_costs_store(tmp_path_factory) -> None:
    """Batch costs measured and graphs compiled by a test are stored in its session's temp dir, never in the user's
    cache."""
    os.environ["ACCEPT_HEADS_COSTS_DIR"] = str(tmp_path_factory.mktemp("batch-costs"))
    os.environ["ACCEPT_HEADS_COMPILED_DIR"] = str(tmp_path_factory.mktemp("compiled"))


@pytest.fixture(scope="session")
def micro_trio(tmp_path_factory) -> dict[str, Path]:
    """Target / draft / companion micro Llamas sharing a small BPE tokenizer, saved with save_pretrained.

    Built in seconds from the stdlib corpus; random weights (untrained) so draft and target disagree.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from data_gen.corpus import modules_in
    from model_build.zoo.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("micro_trio")
    texts = [m.read() for m in modules_in("train")[:40]]
    tokenizer = train_tokenizer(texts, vocab_size=320, context=192)
    paths = {}
    for role, (layers, hidden, heads, seed) in MICRO_SHAPES.items():
        torch.manual_seed(seed)
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=192,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = LlamaForCausalLM(config)
        paths[role] = root / role
        model.save_pretrained(paths[role])
        tokenizer.save_pretrained(paths[role])
    return paths


@pytest.fixture(scope="session")
def micro_feature_draft(micro_trio, tmp_path_factory) -> Path:
    """A random micro feature draft (EAGLE-3 style: it fuses both layers of the micro target) saved beside the trio."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from decode.drafts.feature_model import FeatureDraftConfig, FeatureDraftForCausalLM

    target = AutoConfig.from_pretrained(micro_trio["target"])
    torch.manual_seed(4)
    config = FeatureDraftConfig(
        vocab_size=target.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=target.max_position_embeddings, feature_layers=[1, 2],
        target_hidden_size=target.hidden_size, bos_token_id=target.bos_token_id, eos_token_id=target.eos_token_id,
        pad_token_id=target.pad_token_id,
    )
    path = tmp_path_factory.mktemp("micro_feature_draft") / "feature_draft"
    FeatureDraftForCausalLM(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(micro_trio["target"]).save_pretrained(path)
    return path
