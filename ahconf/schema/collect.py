"""The collection stage's config: ``data_gen.collect`` and ``data_gen.regenerate``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from ahconf.schema.common import ENGINES, SPLITS, ConfigError, _choice


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
