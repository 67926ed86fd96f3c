"""The fields a head or an SV profile's metadata carries that decoding reads, through one typed accessor.

Training writes the metadata (``accept_heads.export``) and :func:`decode.artifacts.serialization.load_head` /
``load_profile`` attach it to the artifact as ``.metadata``; everything that decodes with an artifact reads it
through :meth:`ArtifactMetadata.of` instead of looking keys up itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from decode.rules import Rule, from_spec


class HasMetadata(Protocol):
    metadata: dict[str, Any]


@dataclass(frozen=True)
class ArtifactMetadata:
    """What decoding reads of an artifact's metadata; ``None`` where the artifact does not record it."""

    rule: dict[str, Any] | None  # {"name": ..., "params": {...}}: the rule its labels were made under
    k_min: int | None  # the drafting range the head was calibrated with (an SV profile: its k_max only)
    k_max: int | None
    threshold: float | None  # the stop threshold chosen at calibration

    @classmethod
    def of(cls, artifact: HasMetadata) -> ArtifactMetadata:
        meta = artifact.metadata or {}
        threshold = meta.get("threshold")
        return cls(rule=meta.get("rule"), k_min=_int(meta.get("k_min")), k_max=_int(meta.get("k_max")),
                   threshold=None if threshold is None else float(threshold))

    def k_range(self, k_min: int, k_max: int) -> tuple[int, int]:
        """The recorded drafting range, ``k_min`` / ``k_max`` where none is recorded."""
        return (k_min if self.k_min is None else self.k_min, k_max if self.k_max is None else self.k_max)

    def build_rule(self) -> Rule | None:
        """The recorded rule, rebuilt (None where none is recorded)."""
        if not isinstance(self.rule, dict):
            return None
        return from_spec(self.rule["name"], **self.rule.get("params", {}))


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
