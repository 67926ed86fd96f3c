"""Micro collected data shared by the accept_heads tests (collected once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.config import DATA_OVERRIDES, TRAIN_OVERRIDES, compose_config, model_overrides


@pytest.fixture(scope="session")
def make_config():
    """``compose(*overrides) -> Config`` against the real config tree."""
    return compose_config


@pytest.fixture(scope="session", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def micro_root(micro_trio, tmp_path_factory) -> Path:
    """``paths.root`` holding micro data collected at ``<root>/tiny/data`` (train 8, dev 4 prompts)."""
    from data_gen.collect import collect

    root = tmp_path_factory.mktemp("accept_heads")
    collect(compose_config(*model_overrides(micro_trio), *DATA_OVERRIDES, f"paths.root={root}").collect_job())
    return root


@pytest.fixture(scope="session")
def train_overrides(micro_trio, micro_root) -> list[str]:
    """Overrides for a fast head training run on the micro data (add ``paths.root=...`` or keep this one)."""
    return [*model_overrides(micro_trio), *DATA_OVERRIDES, *TRAIN_OVERRIDES, f"paths.root={micro_root}"]
