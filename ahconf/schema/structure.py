"""The structure stage's config: ``accept_heads.structure``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from ahconf.schema.common import _choice, rule_names


@dataclass
class StructureConfig:
    """``structure``: the structure of acceptance along the target's test and out-of-distribution responses."""

    rules: Optional[List[str]] = None  # rules to measure; null = rules.names

    def __post_init__(self) -> None:
        for name in self.rules or []:
            _choice("structure.rules", name, rule_names())
