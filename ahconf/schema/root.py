"""The root config every entry point composes onto, and each stage's view of it (its job: ``Config.*_job()``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ahconf.schema.collect import CollectConfig, RegenerateConfig
from ahconf.schema.common import (
    CostConfig,
    ModelsConfig,
    PathsConfig,
    PromptsConfig,
    RulesConfig,
    SamplingConfig,
)
from ahconf.schema.decoding import DecodingConfig
from ahconf.schema.evaluate import EvaluateConfig
from ahconf.schema.structure import StructureConfig
from ahconf.schema.train import HeadTrainConfig, LoggerConfig, LossConfig, OptimConfig, TrainerConfig


@dataclass(frozen=True)
class CollectJob:
    """What ``python -m data_gen.collect`` reads: the models, prompts, transform and rules it labels with."""

    models: ModelsConfig
    prompts: PromptsConfig
    sampling: SamplingConfig
    rules: RulesConfig
    collect: CollectConfig
    paths: PathsConfig
    seed: int
    exp_name: str
    responses: Optional[str] = None  # label these responses (data_gen.responses) instead of generating them


@dataclass(frozen=True)
class RegenerateJob:
    """What ``python -m data_gen.regenerate`` reads: the collection's prompts, sampling and budget, and the servers."""

    models: ModelsConfig
    prompts: PromptsConfig
    sampling: SamplingConfig
    collect: CollectConfig
    regenerate: RegenerateConfig
    paths: PathsConfig
    seed: int
    exp_name: str


@dataclass(frozen=True)
class TrainJob:
    """What ``python -m accept_heads.train`` reads: the data's models and rule, the head and its training recipe (its
    ``h`` is chosen on dev by the evaluation, DESIGN §5)."""

    models: ModelsConfig
    sampling: SamplingConfig
    rules: RulesConfig
    head: HeadTrainConfig
    loss: LossConfig
    optim: OptimConfig
    trainer: TrainerConfig
    logger: LoggerConfig
    decoding: DecodingConfig  # how the heads will decode: the threads and forwards loss.goodput_prices=measured prices
    paths: PathsConfig
    seed: int
    exp_name: str
    ckpt_path: Optional[str]


@dataclass(frozen=True)
class EvaluateJob:
    """What ``python -m accept_heads.evaluate`` reads (``head``: the K range and mixing ``r`` heads default to)."""

    models: ModelsConfig
    prompts: PromptsConfig
    sampling: SamplingConfig
    rules: RulesConfig
    head: HeadTrainConfig
    cost: CostConfig
    decoding: DecodingConfig
    evaluate: EvaluateConfig
    paths: PathsConfig
    seed: int
    exp_name: str


@dataclass(frozen=True)
class StructureJob:
    """What ``python -m accept_heads.structure`` reads: the models, the test and out-of-distribution prompts (as many
    as the collection's test split, else ``decoding.prompts.test``), the transform, the rules it measures, and the
    collection's response length and depths."""

    models: ModelsConfig
    prompts: PromptsConfig
    sampling: SamplingConfig
    rules: RulesConfig
    collect: CollectConfig
    decoding: DecodingConfig
    structure: StructureConfig
    paths: PathsConfig
    seed: int
    exp_name: str


@dataclass
class Config:
    """Root config of every entry point (collect, train, evaluate, levers, structure); each stage reads its job
    (``*_job()``)."""

    exp_name: str = "tiny"
    seed: int = 0
    dry_run: bool = False
    ckpt_path: Optional[str] = None  # "last" resumes training from the run's last checkpoint
    responses: Optional[str] = None  # data_gen.collect labels these responses (JSONL / Parquet / dataset dir)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    rules: RulesConfig = field(default_factory=RulesConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    regenerate: RegenerateConfig = field(default_factory=RegenerateConfig)
    head: HeadTrainConfig = field(default_factory=HeadTrainConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    structure: StructureConfig = field(default_factory=StructureConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)

    def collect_job(self) -> CollectJob:
        """The groups ``data_gen.collect`` reads."""
        return CollectJob(self.models, self.prompts, self.sampling, self.rules, self.collect, self.paths, self.seed,
                          self.exp_name, self.responses)

    def regenerate_job(self) -> RegenerateJob:
        """The groups ``data_gen.regenerate`` reads."""
        return RegenerateJob(self.models, self.prompts, self.sampling, self.collect, self.regenerate, self.paths,
                             self.seed, self.exp_name)

    def train_job(self) -> TrainJob:
        """The groups ``accept_heads.train`` reads."""
        return TrainJob(self.models, self.sampling, self.rules, self.head, self.loss, self.optim, self.trainer,
                        self.logger, self.decoding, self.paths, self.seed, self.exp_name, self.ckpt_path)

    def structure_job(self) -> StructureJob:
        """The groups ``accept_heads.structure`` reads."""
        return StructureJob(self.models, self.prompts, self.sampling, self.rules, self.collect, self.decoding,
                            self.structure, self.paths, self.seed, self.exp_name)

    def evaluate_job(self) -> EvaluateJob:
        """The groups ``accept_heads.evaluate`` reads."""
        return EvaluateJob(self.models, self.prompts, self.sampling, self.rules, self.head, self.cost, self.decoding,
                           self.evaluate, self.paths, self.seed, self.exp_name)


def register_configs() -> None:
    """Register the root schema in Hydra's ConfigStore (``conf/config.yaml`` extends it)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="config_schema", node=Config)
