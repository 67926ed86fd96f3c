"""Micro collected data shared by the accept_heads tests (collected once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from ahconf.entry import CONF_DIR, to_config
from ahconf.schema import Config


def model_overrides(micro_trio: dict[str, Path]) -> list[str]:
    return [f"models.{role}.id={path}" for role, path in micro_trio.items()]


def compose_config(*overrides: str) -> Config:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_config(compose(config_name="config", overrides=list(overrides)))


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


DATA_OVERRIDES = [
    "prompts.sizes={train: 8, dev: 4}",
    "prompts.max_prompt_tokens=40",
    "prompts.truncation=left",
    "collect.max_new_tokens=16",
    "collect.batch_size=8",
    "collect.shard_size=8",
]

TRAIN_OVERRIDES = [
    "optim.batch_size=2",
    "optim.warmup_steps=2",
    "trainer.max_epochs=2",
    "trainer.log_every_n_steps=1",
    "head.thresholds=[0.5,0.9]",
    "evaluate.prompts={dev: 2, test: 2, ood: 2}",  # h is chosen on 2 dev prompts x 8 tokens
    "evaluate.max_new_tokens=8",
    "head.k_max=4",
]


@pytest.fixture(scope="session")
def train_overrides(micro_trio, micro_root) -> list[str]:
    """Overrides for a fast head training run on the micro data (add ``paths.root=...`` or keep this one)."""
    return [*model_overrides(micro_trio), *DATA_OVERRIDES, *TRAIN_OVERRIDES, f"paths.root={micro_root}"]
