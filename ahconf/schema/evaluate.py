"""The evaluation stage's config: ``accept_heads.evaluate`` (and the levers it tries).

:class:`EvaluateConfig` nests one sub-config per part of the evaluation that has several settings
(``evaluate.wallclock.*``, ``evaluate.batch_axis.*``, ``evaluate.latency.*``, ``evaluate.hf.*``, ``evaluate.grids``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ahconf.schema.common import ConfigError, _choice, _rule_check, rule_names
from decode.policy_specs import policy_kind, policy_kinds, source_stop_aliases
from decode.rules import RULES

#: The levers ``python -m accept_heads.levers`` can try (recalibrations, a retrained head, forecasts of the next
#: candidate, and the forecast stops on the truth as a reference; accept_heads.levers).
LEVER_NAMES = ("platt", "decode-time", "retrained", "pre-draft", "pre-draft-linear", "perfect-pre-draft")
TEST_SETS = ("test", "ood")  # the roles decoded after the dev selection
WALLCLOCK_RULES = ("speculative", "greedy")
DEV_SEARCHES = ("climb", "grid")  # evaluate.dev_search


@dataclass
class WallclockConfig:
    """``evaluate.wallclock``: wall clock at batch 1 after the selection, methods taking turns prompt by prompt in
    this process (accept_heads.evaluation.wallclock)."""

    sets: List[str] = field(default_factory=list)  # the roles timed (test and/or ood; empty = none)
    prompts: Optional[int] = None  # the first this-many prompts of each (null = all)
    rules: List[str] = field(default_factory=lambda: list(WALLCLOCK_RULES))  # of speculative, greedy: those evaluated
    threads: Optional[int] = None  # torch threads (null = every usable core)

    def __post_init__(self) -> None:
        for key in self.sets:
            _choice("evaluate.wallclock.sets", key, TEST_SETS)
        for name in self.rules:
            _choice("evaluate.wallclock.rules", name, WALLCLOCK_RULES)
        if (self.prompts is not None and self.prompts < 1) or (self.threads or 1) < 1:
            raise ConfigError("evaluate.wallclock.prompts and evaluate.wallclock.threads must be >= 1 or null")


@dataclass
class BatchAxisConfig:
    """``evaluate.batch_axis``: throughput per policy at each batch size B, measured and modelled at batch costs
    measured on this device; the best fixed K per B is chosen on dev (accept_heads.evaluation.batch_axis)."""

    sizes: List[int] = field(default_factory=list)  # the batch sizes B (e.g. [1, 8, 32]; empty = no batch axis)
    prompts: int = 32  # the first this-many prompts of each set decoded at every B
    # the batch costs are measured once per machine and model set and reused (accept_heads.measure.machine_costs);
    # true: measure them again (and store the new table)
    costs_refresh: bool = False
    rules: Optional[List[str]] = None  # rules of the batch axis; null = every evaluated rule

    def __post_init__(self) -> None:
        for name in self.rules or []:
            _choice("evaluate.batch_axis.rules", name, rule_names())
        if any(b < 1 for b in self.sizes) or self.prompts < 1:
            raise ConfigError("evaluate.batch_axis.sizes and evaluate.batch_axis.prompts must be >= 1 (an empty "
                              "sizes turns the batch axis off)")


@dataclass
class LatencyConfig:
    """``evaluate.latency``: the target's verification latency, measured on this device at the start (each length
    ``decoding.repeats`` times)."""

    lengths: int = 20  # measured for L = 1..this (longer: extrapolated)

    def __post_init__(self) -> None:
        if self.lengths < 1:
            raise ConfigError("evaluate.latency.lengths must be >= 1")


@dataclass
class HFConfig:
    """``evaluate.hf``: HF assisted generation baselines (constant K, heuristic, confidence 0.4)."""

    baselines: bool = True
    k: Optional[List[int]] = None  # constant-K baselines; null = the fixed K chosen on dev (per rule)
    sets: List[str] = field(default_factory=lambda: ["test"])  # test and/or ood

    def __post_init__(self) -> None:
        for key in self.sets:
            _choice("evaluate.hf.sets", key, TEST_SETS)
        if min(self.k or [], default=1) < 1:
            raise ConfigError("every evaluate.hf.k value must be >= 1")


@dataclass
class EvaluateConfig:
    """``python -m accept_heads.evaluate``: every policy × rule × prompt set; defaults sized for the tiny trio (the
    prompts and how they decode: ``decoding``).

    Selection (best fixed K, confidence τ, head threshold h, SE proposal length γ, FSD threshold T)
    is made on the dev prompts only and then applied to test and the out-of-distribution sets.
    """

    out_dir: str = "${paths.run_dir}/eval"
    rules: Optional[List[str]] = None  # rules to decode with; null = rules.names
    # the dev grid of a tuned policy kind by its name (decode.policy_specs.policy_kinds) over the one the evaluation
    # declares with the kind (accept_heads.measure.families: fixed K 1..10, confidence τ 0.3/0.5/0.7, h 0.3/0.5/0.7/
    # 0.85/0.95 for every source under the h stop, a head's too, ...), e.g. {fixed: [1, 2, 3, 4], head: [0.5, 0.7]}
    grids: Dict[str, List[float]] = field(default_factory=dict)
    # how the dev runs cover each grid: climb (from its middle value to its best one, decoding the neighbours of the
    # best so far; exact where throughput is unimodal along the grid) or grid (every value)
    dev_search: str = "climb"
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
    hf: HFConfig = field(default_factory=HFConfig)
    se_gammas: List[int] = field(default_factory=lambda: [1, 4])  # SE draft proposal lengths γ swept on dev
    calibration_rows: int = 32  # dev rows scored for the heads' reliability diagrams (0 = skip)
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    figures: bool = True
    workers: Optional[int] = None  # decoding processes; null = one per usable CPU core on CPU, 1 on a GPU
    batch_axis: BatchAxisConfig = field(default_factory=BatchAxisConfig)
    wallclock: WallclockConfig = field(default_factory=WallclockConfig)

    def __post_init__(self) -> None:
        for name in self.rules or []:
            _choice("evaluate.rules", name, rule_names())
        _choice("evaluate.dev_search", self.dev_search, DEV_SEARCHES)
        for name in self.levers:
            _choice("evaluate.levers", name, LEVER_NAMES)
        for kind in self.grids:
            _choice("evaluate.grids", kind, (*policy_kinds(), *source_stop_aliases()))
        self.grids = {policy_kind(kind): grid for kind, grid in self.grids.items()}  # an alias names its kind
        for name, grid in self.rule_grids.items():
            _choice("evaluate.rule_grids", name, tuple(rule for rule, cls in RULES.items() if cls.swept))
            for value in grid:
                _rule_check(f"evaluate.rule_grids.{name}", name, {}, value)
        for kind, grid in self.grids.items():
            if not grid:
                raise ConfigError(f"evaluate.grids.{kind}=[] chooses from nothing: give the values to choose from")
        if min(self.se_gammas, default=1) < 1:
            raise ConfigError("every evaluate.se_gammas value must be >= 1")
        if self.calibration_rows < 0:
            raise ConfigError("evaluate.calibration_rows must be >= 0")
        if self.workers is not None and self.workers < 1:
            raise ConfigError("evaluate.workers must be >= 1 or null (one per CPU core)")

