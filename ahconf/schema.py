"""Structured config schemas shared by every entry point, registered in Hydra's ConfigStore.

The YAML tree under ``conf/`` is merged onto these dataclasses in struct mode, so a mistyped
key fails at compose time. ``OmegaConf.to_object`` turns a composed config into these
dataclass instances, which runs the ``__post_init__`` cross-checks: library code receives
typed objects, never a ``DictConfig``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from decode.policies.base import DEFAULT_K_MAX
from decode.policy_specs import policy_kind, policy_kinds, source_stop_aliases
from decode.rules import RULES, from_spec

ZOO_PREFIX = "zoo:"
REAL_PREFIX = "real:"  # real:<pair>/<role>, a real pair installed by data_gen.real
ROLES = ("target", "draft", "companion")
FEATURE_DRAFT_ROLE = "feature_draft"  # a real pair's EAGLE-style draft (data_gen.real.feature)
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
    trio) or ``real:<pair>/<role>`` (a real pair, ``python -m data_gen.real``)."""

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
class CollectConfig:
    """Data collection: target responses and per-token labels."""

    splits: List[str] = field(default_factory=lambda: ["train", "dev"])
    max_new_tokens: int = 128
    batch_size: int = 16
    shard_size: int = 64  # prompts per shard (the unit of resumption)
    overwrite: bool = False
    depths: int = 4  # a feature draft's labels per depth in a round, 1..depths (other drafts' q has no depth)

    def __post_init__(self) -> None:
        for split in self.splits:
            _choice("collect.splits", split, SPLITS)
        if min(self.max_new_tokens, self.batch_size, self.shard_size, self.depths) < 1:
            raise ConfigError("collect.max_new_tokens, batch_size, shard_size and depths must be >= 1")


@dataclass
class RegenerateConfig:
    """``python -m data_gen.regenerate``: the run's prompts through OpenAI-compatible servers (``/v1/completions``)."""

    servers: List[str] = field(default_factory=list)  # base URLs (http://host:port); prompts are dealt across them
    engine: str = "vllm"  # vllm | sglang | tgi | transformers: which sampling parameters its API takes
    served_model: Optional[str] = None  # the name the servers serve the target under; null = its id (zoo: its path)
    concurrency: int = 8  # requests in flight per server
    retries: int = 5  # per request, with exponential backoff (connection errors, 429 and 5xx)
    timeout_s: float = 600.0  # per request
    out: str = "${paths.run_dir}/responses.jsonl"  # JSONL, appended as responses arrive (resumable)

    def __post_init__(self) -> None:
        _choice("regenerate.engine", self.engine, ENGINES)
        for url in self.servers:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"regenerate.servers: {url!r} is not a base URL; write it as http://host:port")
        if self.concurrency < 1 or self.retries < 0 or self.timeout_s <= 0:
            raise ConfigError("regenerate.concurrency must be >= 1, retries >= 0 and timeout_s > 0")


@dataclass
class HeadTrainConfig:
    """The acceptance predictor: a SpecDec++ ResNet head or an SV binning profile."""

    kind: str = "specdecpp"
    timing: str = "pre"  # post: state after consuming y_i (paper, +1 draft call); pre: state producing q_i + features
    depth: int = 3  # residual blocks before the logit (0: a linear head)
    candidate_features: bool = True  # a pre head reads y_i's log q, entropy and top probability (DSpark: none)
    # a pre head's low-rank embedding of the token that produced q_i (DSpark's Markov head; 0 = none)
    markov_rank: int = 0
    # what it learns: the rule's label of the candidate, or the acceptance expected before the draw (DSpark's soft
    # 1 - TV(p, q) under the speculative rule; a y-independent rule's own label; DESIGN §2)
    target: str = "label"
    use_companion: bool = False  # add the companion indicators X, Y as features
    rule: str = "speculative"  # which label column to train on (fuzzy T and divergence, ensemble kind: rules.*)
    mixing_r: float = 0.15  # probability of keeping the target token in token mixing (pre: 1 = true prefix)
    # the stop thresholds h the head's h is chosen from on dev after training (accept_heads.threshold) and that the
    # evaluation decodes it and the perfect predictor at on dev
    thresholds: List[float] = field(default_factory=lambda: [0.3, 0.5, 0.7, 0.85, 0.95])
    k_min: int = 1
    k_max: int = DEFAULT_K_MAX
    x_bins: int = 20  # SV profile bins on X
    y_bins: int = 10  # SV profile bins on Y
    min_bin_count: int = 20  # sparser SV bins back off to their row marginal
    a_bins: int = 10  # equal-width bins of the acceptance A for H(A) and H(A | X, Y)
    latency_repeats: int = 5  # SV latency profile: median of this many timed verifications per L
    # SV profile: batch sizes of the t_t(B, T) table measured with it (batched SV's joint lengths; empty = none)
    latency_batches: List[int] = field(default_factory=lambda: [1, 8, 32])
    # choose h after training on the evaluation's dev prompts (evaluate.prompts.dev x evaluate.max_new_tokens) and
    # record it in the head; false: none recorded (the evaluation then chooses one on dev)
    calibrate: bool = True
    name: Optional[str] = None  # artifact subdirectory under paths.head_dir (multirun: set per job); null = head_dir

    def __post_init__(self) -> None:
        _choice("head.kind", self.kind, HEAD_KINDS)
        _choice("head.timing", self.timing, TIMINGS)
        _choice("head.rule", self.rule, rule_names())
        _choice("head.target", self.target, ("label", "expected"))
        if self.depth < 0 or self.markov_rank < 0:
            raise ConfigError("head.depth and head.markov_rank must be >= 0")
        if self.timing == "post" and (self.markov_rank or not self.candidate_features):
            raise ConfigError("head.markov_rank and head.candidate_features shape a pre head's input: set "
                              "head.timing=pre (a post head reads the hidden state only)")
        if not 0 <= self.mixing_r <= 1:
            raise ConfigError("head.mixing_r must be in [0, 1]")
        if self.kind == "specdecpp" and self.timing == "post" and self.mixing_r == 1:
            raise ConfigError("head.timing=post takes its loss at draft-token positions (probability 1 - r); "
                              "head.mixing_r=1 leaves none: use r < 1 (paper: 0.15)")
        if not 1 <= self.k_min <= self.k_max:
            raise ConfigError("need 1 <= head.k_min <= head.k_max")
        if not self.thresholds or any(not 0 < h < 1 for h in self.thresholds):
            raise ConfigError("head.thresholds needs at least one h, each in (0, 1)")
        if min(self.x_bins, self.y_bins, self.a_bins, self.latency_repeats, *self.latency_batches) < 1:
            raise ConfigError("head.x_bins, y_bins, a_bins, latency_repeats and latency_batches must be >= 1")


@dataclass
class LossConfig:
    """Weighted BCE with soft labels (DESIGN §2)."""

    w_acc: float = 1.0
    w_rej: float = 6.0

    def __post_init__(self) -> None:
        if self.w_acc <= 0 or self.w_rej <= 0:
            raise ConfigError("loss.w_acc and loss.w_rej must be > 0")


@dataclass
class OptimConfig:
    """AdamW with linear warm-up then cosine decay."""

    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    batch_size: int = 32  # sequences per optimiser step before accumulation
    min_lr_ratio: float = 0.0  # the cosine decays to lr * min_lr_ratio at the last step

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.batch_size < 1 or self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError("need optim.lr > 0, batch_size >= 1, warmup_steps >= 0, 0 <= min_lr_ratio <= 1")


@dataclass
class TrainerConfig:
    """Lightning Trainer settings; presets live in conf/trainer/."""

    accelerator: str = "cpu"
    devices: Any = 1
    strategy: str = "auto"
    num_nodes: int = 1
    precision: str = "32-true"
    max_epochs: int = 3
    max_steps: int = -1
    accumulate_grad_batches: int = 1
    gradient_clip_val: Optional[float] = 1.0
    log_every_n_steps: int = 10
    val_check_interval: Optional[float] = None
    fast_dev_run: bool = False
    early_stopping_patience: Optional[int] = None  # validations without val/binary_kl improvement; null = off
    num_workers: int = 0
    checkpoint_every_n_steps: Optional[int] = None  # also write last.ckpt every N optimiser steps (null: at validation)
    draft_dtype: str = "auto"  # frozen draft's dtype: auto = bfloat16 on GPU, float32 on CPU
    feature_cache: bool = False  # precompute draft states for one fixed mixing draw under <data_dir>/feature_cache/

    def __post_init__(self) -> None:
        _choice("trainer.draft_dtype", self.draft_dtype, ("auto", "float32", "bfloat16", "float16"))
        if self.checkpoint_every_n_steps is not None and self.checkpoint_every_n_steps < 1:
            raise ConfigError("trainer.checkpoint_every_n_steps must be >= 1 or null")


@dataclass
class LoggerConfig:
    """Experiment logger: CSV by default; W&B (offline unless configured) or TensorBoard."""

    kind: str = "csv"
    project: str = "accept-heads"
    wandb_mode: str = "offline"

    def __post_init__(self) -> None:
        _choice("logger.kind", self.kind, LOGGERS)


@dataclass
class CostConfig:
    """Cost model T = t_d N_d + t_c N_c + t_t N_t (DESIGN §5); defaults: the paper's 7B/70B pair.

    ``source``: ``configured`` prices at the ``t_*`` below, flat in the verified length; ``measured`` at this
    machine's stored cost profile of the models (``accept_heads.evaluation.machine_costs``, printed by
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


#: The levers ``python -m accept_heads.levers`` can try (recalibrations, a retrained head, forecasts of the next
#: candidate, and the forecast stops on the truth as a reference; accept_heads.levers).
LEVER_NAMES = ("platt", "decode-time", "retrained", "pre-draft", "pre-draft-linear", "perfect-pre-draft")


@dataclass
class EvaluateConfig:
    """``python -m accept_heads.evaluate``: every policy × rule × prompt set; defaults sized for the tiny trio.

    Selection (best fixed K, confidence τ, head threshold h, SE proposal length γ, FSD threshold T)
    is made on the dev prompts only and then applied to test and the out-of-distribution sets.
    """

    out_dir: str = "${paths.run_dir}/eval"
    rules: Optional[List[str]] = None  # rules to decode with; null = rules.names
    # prompts per set; what the default sample resolves: docs/log/figures-from-code-comments.md
    prompts: Dict[str, int] = field(default_factory=lambda: {"dev": 40, "test": 80, "ood": 40})
    max_new_tokens: int = 96
    # null: each head decodes at the h it records (chosen on dev after training), over head.thresholds on dev;
    # a list: h is chosen here on dev over it instead, for every head and the perfect predictor
    thresholds: Optional[List[float]] = None
    # the dev grid of a tuned policy kind by its name (decode.policy_specs.policy_kinds) over the one the evaluation
    # declares with the kind (accept_heads.evaluation.families: fixed K 1..10, confidence τ 0.3/0.5/0.7, the h stop
    # over the thresholds above, ...), e.g. {fixed: [1, 2, 3, 4], confidence: [0.2, 0.4]}
    grids: Dict[str, List[float]] = field(default_factory=dict)
    # the old names of grids.fixed and grids.confidence, read as them for one release (a one-line notice says so)
    fixed_k: Optional[List[int]] = None
    confidence_taus: Optional[List[float]] = None
    sweep_test: bool = False  # also decode the full sweeps on test / OOD (figures); selection stays on dev
    # analysis bounds for every rule (hindsight target calls, uncounted): the realised oracle and the perfect
    # predictor (true acceptance probabilities) under the threshold and the goodput stop
    bounds: bool = True
    # python -m accept_heads.levers: the levers it tries on each head (platt, decode-time, retrained, pre-draft,
    # pre-draft-linear, perfect-pre-draft)
    levers: List[str] = field(default_factory=lambda: list(LEVER_NAMES))
    # the dev grid of each rule's swept parameter (decode.rules.Rule.swept: fuzzy's T), decoded at the fixed K chosen
    # on dev for that rule (and on test, for the figures)
    rule_grids: Dict[str, List[float]] = field(default_factory=lambda: {"fuzzy": [0.05, 0.1, 0.2, 0.3, 0.5]})
    hf_baselines: bool = True  # HF assisted generation: constant K, heuristic, confidence 0.4
    hf_k: Optional[List[int]] = None  # HF constant-K baselines; null = the fixed K chosen on dev (per rule)
    hf_sets: List[str] = field(default_factory=lambda: ["test"])  # test and/or ood
    se_gammas: List[int] = field(default_factory=lambda: [1, 4])  # SE draft proposal lengths γ swept on dev
    calibration_rows: int = 32  # dev rows scored for the heads' reliability diagrams (0 = skip)
    latency_lengths: int = 20  # target verification latency measured for L = 1..this (longer: extrapolated)
    latency_repeats: int = 5  # timed forwards per length (median; after one warm-up)
    figures: bool = True
    threads: Optional[int] = 1  # torch CPU threads per process: 1 suits small models on a shared CPU; null = torch's default
    workers: Optional[int] = None  # decoding processes; null = one per usable CPU core on CPU, 1 on a GPU
    # prompts decoded together by one batched generate (policies the batched loop supports; 1 = each alone)
    batch_size: int = 32
    # the first this-many prompts of every run decode alone: their wall times fit the costs (a batch's are shared)
    timed_prompts: int = 1
    # batch axis: throughput per policy at each batch size B, measured and modelled at batch costs measured on
    # this device (e.g. [1, 8, 32]; empty = none); the best fixed K per B is chosen on dev
    batch_sizes: List[int] = field(default_factory=list)
    batch_prompts: int = 32  # the first this-many prompts of each set decoded at every B
    # the batch costs are measured once per machine and model set and reused (accept_heads.evaluation.machine_costs);
    # true: measure them again (and store the new table)
    batch_costs_refresh: bool = False
    batch_rules: Optional[List[str]] = None  # rules of the batch axis; null = every evaluated rule
    # wall clock at batch 1 after the selection, methods taking turns prompt by prompt in this process
    # (accept_heads.evaluation.wallclock): the roles timed (test and/or ood; empty = none), the first this-many
    # prompts of each (null = all), its rules (of speculative, greedy; those evaluated) and torch threads
    # (null = every usable core)
    wallclock_sets: List[str] = field(default_factory=list)
    wallclock_prompts: Optional[int] = None
    wallclock_rules: List[str] = field(default_factory=lambda: ["speculative", "greedy"])
    wallclock_threads: Optional[int] = None
    # static caches and compiled forwards for every decode of one prompt (decode.loops.compiled; the timed prompts
    # and the wall clock): each process compiles its graphs once (frozen graphs skip inductor's disk cache);
    # batches decode eager
    compile: bool = False

    def __post_init__(self) -> None:
        for name in self.rules or []:
            _choice("evaluate.rules", name, rule_names())
        for name in self.levers:
            _choice("evaluate.levers", name, LEVER_NAMES)
        for old, kind in (("fixed_k", "fixed"), ("confidence_taus", "confidence")):
            if getattr(self, old) is not None:
                print(f"note: evaluate.{old} is now evaluate.grids.{kind} (the old name is read for this release)",
                      file=sys.stderr)
                self.grids = {**self.grids, kind: [float(v) for v in getattr(self, old)]}
                setattr(self, old, None)
        for kind in self.grids:
            _choice("evaluate.grids", kind, (*policy_kinds(), *source_stop_aliases()))
        self.grids = {policy_kind(kind): grid for kind, grid in self.grids.items()}  # an alias names its kind
        for name, grid in self.rule_grids.items():
            _choice("evaluate.rule_grids", name, tuple(rule for rule, cls in RULES.items() if cls.swept))
            for value in grid:
                _rule_check(f"evaluate.rule_grids.{name}", name, {}, value)
        if set(self.prompts) != {"dev", "test", "ood"}:
            raise ConfigError(f"evaluate.prompts needs a count for each of dev, test, ood; got {dict(self.prompts)}")
        for key in self.hf_sets:
            _choice("evaluate.hf_sets", key, ("test", "ood"))
        for key in self.wallclock_sets:
            _choice("evaluate.wallclock_sets", key, ("test", "ood"))
        for name in self.wallclock_rules:
            _choice("evaluate.wallclock_rules", name, ("speculative", "greedy"))
        if (self.wallclock_prompts is not None and self.wallclock_prompts < 1) or (self.wallclock_threads or 1) < 1:
            raise ConfigError("evaluate.wallclock_prompts and evaluate.wallclock_threads must be >= 1 or null")
        if self.max_new_tokens < 1 or any(n < 1 for n in self.prompts.values()):
            raise ConfigError("evaluate.max_new_tokens and every evaluate.prompts count must be >= 1")
        for kind, grid in self.grids.items():
            if not grid:
                raise ConfigError(f"evaluate.grids.{kind}=[] chooses from nothing: give the values to choose from")
        if min((self.hf_k or []) + self.se_gammas, default=1) < 1:
            raise ConfigError("every evaluate.hf_k and evaluate.se_gammas value must be >= 1")
        if any(not 0 < h < 1 for h in self.thresholds or []):
            raise ConfigError("evaluate.thresholds must lie in (0, 1)")
        if self.thresholds == []:
            raise ConfigError("evaluate.thresholds=[] chooses from nothing: give the h to choose from, or null for "
                              "each head's recorded h")
        if self.calibration_rows < 0:
            raise ConfigError("evaluate.calibration_rows must be >= 0")
        if self.latency_lengths < 1 or self.latency_repeats < 1:
            raise ConfigError("evaluate.latency_lengths and evaluate.latency_repeats must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise ConfigError("evaluate.threads must be >= 1 or null")
        if self.workers is not None and self.workers < 1:
            raise ConfigError("evaluate.workers must be >= 1 or null (one per CPU core)")
        for name in self.batch_rules or []:
            _choice("evaluate.batch_rules", name, rule_names())
        if any(b < 1 for b in self.batch_sizes) or self.batch_prompts < 1:
            raise ConfigError("evaluate.batch_sizes and evaluate.batch_prompts must be >= 1 (an empty batch_sizes "
                              "turns the batch axis off)")
        if self.batch_size < 1 or self.timed_prompts < 1:
            raise ConfigError("evaluate.batch_size and evaluate.timed_prompts must be >= 1 (the cost fit times "
                              "generations decoded alone)")


@dataclass
class PathsConfig:
    """Where artifacts go. ``zoo_dir`` null = the default cache (or $ACCEPT_HEADS_ZOO_DIR)."""

    root: str = "runs"
    zoo_dir: Optional[str] = None
    run_dir: str = "${paths.root}/${exp_name}"
    data_dir: str = "${paths.run_dir}/data"
    head_dir: str = "${paths.run_dir}/heads"


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
    """What ``python -m accept_heads.train`` reads: the data's models and rule, the head and its training recipe
    (``prompts``, ``evaluate``: the dev prompts its ``h`` is chosen on, as the evaluation decodes them)."""

    models: ModelsConfig
    prompts: PromptsConfig
    sampling: SamplingConfig
    rules: RulesConfig
    head: HeadTrainConfig
    loss: LossConfig
    optim: OptimConfig
    trainer: TrainerConfig
    logger: LoggerConfig
    cost: CostConfig
    evaluate: EvaluateConfig
    paths: PathsConfig
    seed: int
    exp_name: str
    ckpt_path: Optional[str]


@dataclass(frozen=True)
class EvaluateJob:
    """What ``python -m accept_heads.evaluate`` reads (``head``: the K range and mixing ``r`` heads default to, and
    the ``h`` grid)."""

    models: ModelsConfig
    prompts: PromptsConfig
    sampling: SamplingConfig
    rules: RulesConfig
    head: HeadTrainConfig
    cost: CostConfig
    evaluate: EvaluateConfig
    paths: PathsConfig
    seed: int
    exp_name: str

    @property
    def thresholds(self) -> list[float]:
        """The stop thresholds ``h`` decoded on dev: ``evaluate.thresholds`` (an override: ``h`` is then chosen here),
        else ``head.thresholds`` (the grid each head's recorded ``h`` was chosen from)."""
        grid = self.evaluate.thresholds if self.evaluate.thresholds is not None else self.head.thresholds
        return [float(h) for h in grid]


@dataclass
class Config:
    """Root config of every entry point (collect, train, evaluate); each stage reads its job (``*_job()``)."""

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
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
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
        return TrainJob(self.models, self.prompts, self.sampling, self.rules, self.head, self.loss, self.optim,
                        self.trainer, self.logger, self.cost, self.evaluate, self.paths, self.seed, self.exp_name,
                        self.ckpt_path)

    def evaluate_job(self) -> EvaluateJob:
        """The groups ``accept_heads.evaluate`` reads."""
        return EvaluateJob(self.models, self.prompts, self.sampling, self.rules, self.head, self.cost, self.evaluate,
                           self.paths, self.seed, self.exp_name)


def register_configs() -> None:
    """Register the root schema in Hydra's ConfigStore (``conf/config.yaml`` extends it)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="config_schema", node=Config)
