"""What every stage's config shares: the models, prompts, sampling transform, rules, cost pair and paths,
and the checks the stage schemas run (:func:`_choice`, :class:`ConfigError`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from decode.rules import RULES, from_spec

ZOO_PREFIX = "zoo:"
REAL_PREFIX = "real:"  # real:<pair>/<role>, a real pair installed by model_build.real
ROLES = ("target", "draft", "companion")
FEATURE_DRAFT_ROLE = "feature_draft"  # a real pair's EAGLE-style draft (model_build.real.feature)
PREVIOUS_FEATURE_DRAFT_ROLE = "feature_draft_previous"  # the one it replaced, kept installable for comparison
REAL_ROLES = (*ROLES, FEATURE_DRAFT_ROLE, PREVIOUS_FEATURE_DRAFT_ROLE)  # what real:<pair>/<role> names
TIMINGS = ("post", "pre")
HEAD_KINDS = ("specdecpp", "sv_profile")
LOGGERS = ("csv", "wandb", "tensorboard", "none")
TRUNCATION = ("skip", "left")
SPLITS = ("train", "dev", "test")
ENGINES = ("vllm", "sglang", "tgi", "transformers")  # OpenAI-compatible servers data_gen.regenerate speaks to
COST_SOURCES = ("configured", "measured")  # where the cost model's prices come from (CostConfig.source)


class ConfigError(ValueError):
    """A config value is invalid; the message names the key and the valid choices."""


def rule_names() -> tuple[str, ...]:
    """The rules decode registers (:func:`decode.rules.register_rule`), in its order."""
    return tuple(RULES)


def _choice(key: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of {', '.join(map(str, choices))}")


@dataclass
class ModelSpec:
    """One model: a hub id, a local ``save_pretrained`` directory, a ``.gguf`` file, ``zoo:<role>`` (the tiny
    trio) or ``real:<pair>/<role>`` (a real pair, ``python -m model_build.real``)."""

    id: str = MISSING
    revision: Optional[str] = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 | bfloat16-native (bf16 where computed natively)
    device_map: Optional[str] = None  # e.g. "auto" to shard a large target over GPUs

    def __post_init__(self) -> None:
        if self.id.startswith(REAL_PREFIX):
            pair, _, role = self.id[len(REAL_PREFIX):].partition("/")
            if not pair or role not in REAL_ROLES:
                raise ConfigError(f"model id {self.id!r}: write real:<pair>/<role> with a role of "
                                  f"{', '.join(REAL_ROLES)}")
        _choice("dtype", self.dtype,
                ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "bfloat16-native"))


@dataclass
class ModelsConfig:
    """The model trio: target verifies, draft proposes, optional companion (SV / ensembles)."""

    name: str = "tiny-code"
    target: ModelSpec = field(default_factory=lambda: ModelSpec(id="zoo:target"))
    draft: ModelSpec = field(default_factory=lambda: ModelSpec(id="zoo:draft"))
    companion: Optional[ModelSpec] = field(default_factory=lambda: ModelSpec(id="zoo:companion"))


@dataclass
class PromptsConfig:
    """Where prompts come from and how they become model input."""

    source: str = "builtin"  # builtin | alpaca | humaneval | gsm8k | sharegpt | /path/to/file.{jsonl,json,parquet}
    style: Optional[str] = "function"  # builtin styles: function | module
    template: str = "raw"  # raw | alpaca | chat
    # wraps each prompt's message before the template: a format string with one {message} field
    instruction: Optional[str] = None
    revision: Optional[str] = None  # dataset revision for hub sources
    text_field: str = "text"  # for local files
    sizes: Dict[str, int] = field(default_factory=lambda: {"train": 1500, "dev": 100, "test": 100})
    ood: List[str] = field(default_factory=lambda: ["builtin:module"])  # out-of-distribution test sets
    max_prompt_tokens: int = 128
    truncation: str = "skip"  # prompts over max_prompt_tokens: skip (counted) or truncate from the left

    def __post_init__(self) -> None:
        _choice("prompts.truncation", self.truncation, TRUNCATION)
        for split in self.sizes:
            _choice("prompts.sizes key", split, SPLITS)
        if self.max_prompt_tokens < 1:
            raise ConfigError("prompts.max_prompt_tokens must be >= 1")
        if self.instruction is not None and "{message}" not in self.instruction:
            raise ConfigError("prompts.instruction must contain the field {message}, where each prompt goes")


@dataclass
class SamplingConfig:
    """Sampling transform applied identically to target, draft and companion (0 = greedy)."""

    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError("sampling.temperature must be >= 0 (0 means greedy)")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError("sampling.top_p must be in (0, 1]")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError("sampling.top_k must be >= 1")


def _rule_check(key: str, name: str, params: Dict[str, Any], value: Optional[float] = None) -> None:
    """Build rule ``name`` from ``params`` (and primary ``value``) as decode would; its refusal fails ``key``."""
    try:
        rule = from_spec(name, **params)
        if value is not None:
            rule.with_value(value)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None


def rule_defaults() -> Dict[str, Dict[str, Any]]:
    """Each registered rule's declared parameters with their defaults (rules without parameters left out)."""
    return {name: rule.defaults() for name, rule in RULES.items() if rule.defaults()}


@dataclass
class RulesConfig:
    """Verification rules to label (collection) and to decode with (evaluation), and their parameters."""

    names: List[str] = field(default_factory=lambda: list(RULES))
    # each rule's parameters (collection, heads, decoding), over those its class declares (decode.rules): e.g.
    # fuzzy: {divergence: js, threshold: T}; ensemble: {kind: weighted | contrastive, weight: λ, mu: μ}
    params: Dict[str, Dict[str, Any]] = field(default_factory=rule_defaults)

    def __post_init__(self) -> None:
        for name in self.names:
            _choice("rules.names", name, rule_names())
        for name, params in self.params.items():
            _choice("rules.params", name, rule_names())
            _rule_check(f"rules.params.{name}", name, params)



@dataclass
class CostConfig:
    """Cost model T = t_d N_d + t_c N_c + t_t N_t (DESIGN §5); defaults: the paper's 7B/70B pair.

    ``source``: ``configured`` prices at the ``t_*`` below, flat in the verified length; ``measured`` at this
    machine's stored cost profile of the models (``accept_heads.measure.machine_costs``, printed by
    ``python -m benchmarks.costs``), ``t_t(L)`` as measured, and leaves the ``t_*`` below unused.
    ``t_companion`` null: ``t_d`` times the companion/draft one-call latency ratio measured on this device.
    ``t_target_alone``: what "× target alone" divides by (null: ``t_t``, which flatters by ``t_t / t_alone``).
    """

    source: str = "configured"
    t_draft: float = 0.0236
    t_target: float = 0.112
    t_companion: Optional[float] = None
    # the target decoding alone, seconds per token: the paper's target-alone step (a verification call reads
    # one more token than a target-alone step); null = t_target
    t_target_alone: Optional[float] = 0.108

    def __post_init__(self) -> None:
        _choice("cost.source", self.source, COST_SOURCES)



@dataclass
class PathsConfig:
    """Where artifacts go. ``zoo_dir`` null = the default cache (or $ACCEPT_HEADS_ZOO_DIR)."""

    root: str = "runs"
    zoo_dir: Optional[str] = None
    run_dir: str = "${paths.root}/${exp_name}"
    data_dir: str = "${paths.run_dir}/data"
    head_dir: str = "${paths.run_dir}/heads"
