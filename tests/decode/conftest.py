"""Micro random Llama models for the decoder tests (built in memory by tests.helpers.micro_models)."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from tests.helpers.micro_models import micro_feature_draft, micro_lm, word_tokenizer


@pytest.fixture(scope="session", autouse=True)
def _single_thread() -> None:
    """Tiny models run fastest single-threaded (and the test machines share their cores)."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny() -> dict[str, PreTrainedModel]:
    """Vocabulary-4 target / draft / companion for exact-distribution checks by enumeration."""
    return {
        "target": micro_lm(4, seed=11, init=0.3),
        "draft": micro_lm(4, seed=12, init=0.3),
        "companion": micro_lm(4, seed=13, init=0.3),
    }


@pytest.fixture(scope="session")
def wide() -> dict[str, PreTrainedModel]:
    """Vocabulary-96 target / draft / companion that disagree often (greedy, cache and stats checks)."""
    return {
        "target": micro_lm(96, seed=21, hidden=32, layers=2, init=0.3),
        "draft": micro_lm(96, seed=22, hidden=16, init=0.3),
        "companion": micro_lm(96, seed=23, hidden=16, init=0.3),
    }


@pytest.fixture
def make_tokenizer():
    """Factory fixture: ``make_tokenizer(vocab)`` builds a :func:`word_tokenizer`."""
    return word_tokenizer


@pytest.fixture
def make_lm():
    """Factory fixture: ``make_lm(vocab, seed, ...)`` builds a :func:`micro_lm`."""
    return micro_lm


@pytest.fixture
def make_feature_draft():
    """Factory fixture: ``make_feature_draft(target, seed, ...)`` builds a :func:`micro_feature_draft`."""
    return micro_feature_draft
