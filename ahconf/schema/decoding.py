"""How the stages that decode prompts decode them (``decoding:``): the evaluation (each head's ``h`` chosen on its dev
rows too), the structure of acceptance and the levers read the same group."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

from ahconf.schema.common import ConfigError


@dataclass
class DecodingConfig:
    """``decoding``: prompts per set, their token budget, batching, torch threads, compiled forwards and timings."""

    # prompts per set; what the default sample resolves: docs/log/figures-from-code-comments.md
    prompts: Dict[str, int] = field(default_factory=lambda: {"dev": 40, "test": 80, "ood": 40})
    max_new_tokens: int = 96
    # torch CPU threads per process: 1 suits small models on a shared CPU; null = torch's default
    threads: Optional[int] = 1
    # prompts decoded together by one batched generate (policies the batched loop supports; 1 = each alone)
    batch_size: int = 32
    # the first this-many prompts of every run decode alone: their wall times fit the costs (a batch's are shared)
    timed_prompts: int = 1
    # static caches and compiled forwards for every decode of one prompt (the timed prompts and the wall clock;
    # decode.compile): graphs built once per machine and kept in its graph store; batches decode eager
    compile: bool = False
    repeats: int = 5  # timed forwards per latency measured (per length, per model; median after one warm-up)
    # check every head, SV profile and built draft against the sha256 it records before use; false loads artifacts
    # edited on purpose, and each decode's stats name them (unverified_files)
    verify: bool = True

    def __post_init__(self) -> None:
        if set(self.prompts) != {"dev", "test", "ood"}:
            raise ConfigError(f"decoding.prompts needs a count for each of dev, test, ood; got {dict(self.prompts)}")
        if self.max_new_tokens < 1 or any(n < 1 for n in self.prompts.values()):
            raise ConfigError("decoding.max_new_tokens and every decoding.prompts count must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise ConfigError("decoding.threads must be >= 1 or null")
        if self.batch_size < 1 or self.timed_prompts < 1:
            raise ConfigError("decoding.batch_size and decoding.timed_prompts must be >= 1 (the cost fit times "
                              "generations decoded alone)")
        if self.repeats < 1:
            raise ConfigError("decoding.repeats must be >= 1")
