"""The training stage's config: ``accept_heads.train`` (the head, its loss, optimiser, trainer and logger)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from ahconf.schema.common import HEAD_KINDS, LOGGERS, TIMINGS, ConfigError, _choice, rule_names
from decode.policies.base import DEFAULT_K_MAX

#: Where the goodput loss's prices come from (loss.goodput_prices).
GOODPUT_PRICES = ("configured", "measured")

#: Token mixing's probability of keeping the target token, the one default of ``head.mixing_r``: 1 keeps the true
#: prefix, which suits pre heads (chosen on the tiny-code dev split: docs/log/figures-behind-the-defaults.md); a
#: post head needs r < 1 (the SpecDec++ paper's 0.15, which its experiments set).
DEFAULT_MIXING_R = 1.0


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
    # a pre head also reads the request so far: its running rate of accepted first candidates (docs/design.md §10)
    request_feature: bool = False
    # a pre head also reads the draft's second to fourth largest probabilities (how its mass spreads beyond the top)
    top_k_features: bool = False
    # a pre head also reads the round so far: its earlier candidates' summed log q (a feature draft's depth labels)
    round_feature: bool = False
    rule: str = "speculative"  # which label column to train on (fuzzy T and divergence, ensemble kind: rules.*)
    mixing_r: float = DEFAULT_MIXING_R  # probability of keeping the target token in token mixing
    k_min: int = 1
    k_max: int = DEFAULT_K_MAX
    x_bins: int = 20  # SV profile bins on X
    y_bins: int = 10  # SV profile bins on Y
    min_bin_count: int = 20  # sparser SV bins back off to their row marginal
    a_bins: int = 10  # equal-width bins of the acceptance A for H(A) and H(A | X, Y)
    latency_repeats: int = 5  # SV latency profile: median of this many timed verifications per L
    # SV profile: batch sizes of the t_t(B, T) table measured with it (batched SV's joint lengths; empty = none)
    latency_batches: List[int] = field(default_factory=lambda: [1, 8, 32])
    name: Optional[str] = None  # artifact subdirectory under paths.head_dir (multirun: set per job); null = head_dir

    def __post_init__(self) -> None:
        _choice("head.kind", self.kind, HEAD_KINDS)
        _choice("head.timing", self.timing, TIMINGS)
        _choice("head.rule", self.rule, rule_names())
        _choice("head.target", self.target, ("label", "expected"))
        if self.depth < 0 or self.markov_rank < 0:
            raise ConfigError("head.depth and head.markov_rank must be >= 0")
        if self.timing == "post" and (self.markov_rank or not self.candidate_features or self.request_feature
                                      or self.top_k_features or self.round_feature):
            raise ConfigError("head.markov_rank, candidate_features, request_feature, top_k_features and round_feature "
                              "shape a pre head's input: set head.timing=pre (a post head reads the hidden state only)")
        if not 0 <= self.mixing_r <= 1:
            raise ConfigError("head.mixing_r must be in [0, 1]")
        if self.kind == "specdecpp" and self.timing == "post" and self.mixing_r == 1:
            raise ConfigError("head.timing=post takes its loss at draft-token positions (probability 1 - r); "
                              "head.mixing_r=1 leaves none: use r < 1 (paper: 0.15)")
        if not 1 <= self.k_min <= self.k_max:
            raise ConfigError("need 1 <= head.k_min <= head.k_max")
        if min(self.x_bins, self.y_bins, self.a_bins, self.latency_repeats, *self.latency_batches) < 1:
            raise ConfigError("head.x_bins, y_bins, a_bins, latency_repeats and latency_batches must be >= 1")


@dataclass
class LossConfig:
    """Weighted BCE with soft labels, plus (``goodput_weight > 0``) the goodput a soft goodput stop reaches on the
    training rounds at the priced costs below (DESIGN §2, "A loss for the stop")."""

    w_acc: float = 1.0
    w_rej: float = 6.0
    goodput_weight: float = 0.0  # weight of −log(goodput) beside the BCE (0: the BCE alone)
    goodput_k: int = 6  # the longest round it prices (a feature draft's: at most its labelled depths)
    goodput_temperature: float = 0.1  # of the soft choice of a round's length, in units of log goodput
    # where its prices come from: configured (the two below) or measured (this machine's stored cost profile of the
    # data's models at decoding.threads, compiled forwards where decoding.compile: the prices cost.source=measured
    # decides at; measured once per machine and model set, accept_heads.training.prices)
    goodput_prices: str = "configured"
    # the configured prices, in target calls verifying one candidate: a draft step, and T(L) / T(1) for L = 1..
    # (beyond the table it grows linearly); defaults: the configured cost pair's (cost.t_draft / cost.t_target, flat)
    goodput_draft_cost: float = 0.21
    goodput_verify_shape: List[float] = field(default_factory=lambda: [1.0])

    def __post_init__(self) -> None:
        if self.w_acc <= 0 or self.w_rej <= 0:
            raise ConfigError("loss.w_acc and loss.w_rej must be > 0")
        _choice("loss.goodput_prices", self.goodput_prices, GOODPUT_PRICES)
        if (self.goodput_weight < 0 or self.goodput_k < 1 or self.goodput_temperature <= 0
                or self.goodput_draft_cost < 0):
            raise ConfigError("need loss.goodput_weight >= 0, goodput_k >= 1, goodput_temperature > 0 and "
                              "goodput_draft_cost >= 0")
        if not self.goodput_verify_shape or self.goodput_verify_shape[0] != 1.0:
            raise ConfigError("loss.goodput_verify_shape is T(L) / T(1) from L = 1: it starts with 1.0")


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
