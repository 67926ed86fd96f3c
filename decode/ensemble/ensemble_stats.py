"""Per-generation counters of :class:`decode.ensemble.decoder.EnsembleDecoder`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from decode.compile.config import CompileConfig


@dataclass
class EnsembleStats:
    """Counts of one ensemble generation; list fields are indexed by model (the order of ``models``).

    Every emitted token is an accepted proposal, a residual sample after a rejection, or a direct
    sample of ``r`` (plain mode, and the position after a fully accepted ``sd`` round):
    ``generated == accepted + rejected + from_r``. Every proposal (including alternate-mode bonus
    tokens) is accepted, rejected or discarded unverified: ``proposed == accepted + rejected + discarded``.
    """

    mode: str
    calls: list[int]
    proposed: list[int]
    accepted_by: list[int]
    rejected_by: list[int]
    generated: int = 0
    from_r: int = 0
    discarded: int = 0
    scored: list[int] = field(default_factory=list)
    wall_time_s: float = 0.0
    # as :class:`decode.stats.DecodeStats`: the compiled forwards' settings (None: eager) and why a decode asked to
    # compile ran eager (None: it did not)
    compile: CompileConfig | None = None
    eager_reason: str | None = None
    unverified_files: list[str] = field(default_factory=list)  # as DecodeStats': loaded with verify=False

    @classmethod
    def empty(cls, mode: str, n: int) -> EnsembleStats:
        """Zeroed counters for ``n`` models."""
        return cls(mode, [0] * n, [0] * n, [0] * n, [0] * n, scored=[0] * n)

    @property
    def total_calls(self) -> int:
        """Forward calls of all models together."""
        return sum(self.calls)

    @property
    def accepted(self) -> int:
        """Proposals accepted (all proposers)."""
        return sum(self.accepted_by)

    @property
    def rejected(self) -> int:
        """Proposals rejected (each followed by one residual token)."""
        return sum(self.rejected_by)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / verified proposals."""
        verified = self.accepted + self.rejected
        return self.accepted / verified if verified else float("nan")

    @property
    def tokens_per_call(self) -> float:
        """Generated tokens per model call (plain mode: ``1 / n``)."""
        return self.generated / self.total_calls if self.total_calls else 0.0

    def modelled_time(self, per_model_seconds: Sequence[float]) -> float:
        """Cost-model time ``Σ_i t_i · calls_i`` for per-call times ``t_i`` (one per model)."""
        if len(per_model_seconds) != len(self.calls):
            raise ValueError(f"need {len(self.calls)} per-model times, got {len(per_model_seconds)}")
        return sum(t * c for t, c in zip(per_model_seconds, self.calls))
