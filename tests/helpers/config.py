"""Composing the real config tree in a test, and the overrides that shrink each stage to the micro models."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from ahconf.entry import CONF_DIR, to_config
from ahconf.schema import Config

#: Collection on the micro trio: 8 train and 4 dev prompts, 16 new tokens each.
DATA_OVERRIDES = [
    "prompts.sizes={train: 8, dev: 4}",
    "prompts.max_prompt_tokens=40",
    "prompts.truncation=left",
    "collect.max_new_tokens=16",
    "collect.batch_size=8",
    "collect.shard_size=8",
]
#: The h grid of every source under the h stop (a head's, the perfect predictor's, the training-free ones').
H_GRIDS = [f"+evaluate.grids.{kind}=[0.5,0.9]" for kind in ("confidence-h", "margin", "vllm-h", "head", "head-online",
                                                                 "perfect")]
#: A head trained in seconds on that data (and the evaluations of it: h chosen on 2 dev prompts).
TRAIN_OVERRIDES = [
    "optim.batch_size=2",
    "optim.warmup_steps=2",
    "trainer.max_epochs=2",
    "trainer.log_every_n_steps=1",
    *H_GRIDS,
    "decoding.prompts={dev: 2, test: 2, ood: 2}",  # an evaluation chooses h on 2 dev prompts x 8 tokens
    "decoding.max_new_tokens=8",
    "head.k_max=4",
]
#: An evaluation of every family on 2 prompts per set, 8 tokens each, in one process.
EVAL_OVERRIDES = [
    "decoding.prompts={dev: 2, test: 2, ood: 2}",
    "decoding.max_new_tokens=8",
    "+evaluate.grids.fixed=[1,3]",
    "+evaluate.grids.confidence=[0.4]",
    *H_GRIDS,
    "evaluate.rule_grids.fuzzy=[0.1,0.6]",
    "evaluate.calibration_rows=2",
    "evaluate.latency.lengths=5",
    "decoding.repeats=2",
    "evaluate.workers=1",
    "head.k_max=4",
    "cost.t_companion=null",  # the measured companion price (the SV experiment's); the tiny default configures it
]


def model_overrides(micro_trio: dict[str, Path]) -> list[str]:
    """The micro trio as ``models.<role>.id`` overrides."""
    return [f"models.{role}.id={path}" for role, path in micro_trio.items()]


def compose_config(*overrides: str) -> Config:
    """The real config tree composed with ``overrides``, as the entry points see it."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_config(compose(config_name="config", overrides=list(overrides)))
