"""Structured config schemas shared by every entry point, registered in Hydra's ConfigStore, one module per stage.

The YAML tree under ``conf/`` is merged onto these dataclasses in struct mode, so a mistyped
key fails at compose time. ``OmegaConf.to_object`` turns a composed config into these
dataclass instances, which runs the ``__post_init__`` cross-checks: library code receives
typed objects, never a ``DictConfig``.

:mod:`~ahconf.schema.common`: what every stage shares (models, prompts, sampling, rules, cost, paths);
:mod:`~ahconf.schema.decoding`: how the stages that decode prompts decode them (evaluate, levers, structure);
:mod:`~ahconf.schema.collect`, :mod:`~ahconf.schema.train`, :mod:`~ahconf.schema.evaluate`,
:mod:`~ahconf.schema.structure`: each stage's own;
:mod:`~ahconf.schema.root`: the root :class:`Config` and each stage's job.
"""

from ahconf.schema.collect import CollectConfig, RegenerateConfig
from ahconf.schema.common import (
    COST_SOURCES,
    ENGINES,
    FEATURE_DRAFT_ROLE,
    HEAD_KINDS,
    LOGGERS,
    PREVIOUS_FEATURE_DRAFT_ROLE,
    REAL_PREFIX,
    REAL_ROLES,
    ROLES,
    SPLITS,
    TIMINGS,
    TRUNCATION,
    ZOO_PREFIX,
    ConfigError,
    CostConfig,
    ModelsConfig,
    ModelSpec,
    PathsConfig,
    PromptsConfig,
    RulesConfig,
    SamplingConfig,
    rule_defaults,
    rule_names,
)
from ahconf.schema.decoding import DecodingConfig
from ahconf.schema.evaluate import (
    LEVER_NAMES,
    BatchAxisConfig,
    EvaluateConfig,
    HFConfig,
    LatencyConfig,
    WallclockConfig,
)
from ahconf.schema.root import (
    CollectJob,
    Config,
    EvaluateJob,
    RegenerateJob,
    StructureJob,
    TrainJob,
    register_configs,
)
from ahconf.schema.structure import StructureConfig
from ahconf.schema.train import DEFAULT_MIXING_R, HeadTrainConfig, LoggerConfig, LossConfig, OptimConfig, TrainerConfig

__all__ = [
    "COST_SOURCES", "DEFAULT_MIXING_R", "ENGINES", "FEATURE_DRAFT_ROLE", "HEAD_KINDS", "LEVER_NAMES", "LOGGERS",
    "PREVIOUS_FEATURE_DRAFT_ROLE", "REAL_PREFIX", "REAL_ROLES", "ROLES", "SPLITS", "TIMINGS",
    "TRUNCATION", "ZOO_PREFIX", "BatchAxisConfig", "CollectConfig", "CollectJob", "Config", "ConfigError",
    "CostConfig", "DecodingConfig", "EvaluateConfig", "EvaluateJob", "HFConfig", "HeadTrainConfig", "LatencyConfig",
    "LoggerConfig", "LossConfig", "ModelSpec", "ModelsConfig", "OptimConfig", "PathsConfig", "PromptsConfig",
    "RegenerateConfig", "RegenerateJob", "RulesConfig", "SamplingConfig", "StructureConfig", "StructureJob",
    "TrainJob", "TrainerConfig", "WallclockConfig", "register_configs", "rule_defaults", "rule_names",
]
