"""The evaluation stage's config: ``accept_heads.evaluate`` (and the levers it tries)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ahconf.schema.common import ConfigError, _choice, _rule_check, rule_names
from decode.policy_specs import policy_kind, policy_kinds, source_stop_aliases
from decode.rules import RULES

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
