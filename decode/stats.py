"""Per-generation counters and the derived metrics of DESIGN §5."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from decode.compile.config import CompileConfig
from decode.costs import CostModel


@dataclass
class DecodeStats:
    """Counts of one generation.

    Identities: ``drafted == accepted + discarded`` with ``discarded == rejected + unverified``
    (``unverified`` covers candidates never verified: SV discards and candidates after an
    accepted EOS); ``generated == accepted + target_emitted`` (residual / bonus tokens).
    """

    generated: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    companion_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    unverified: int = 0
    target_emitted: int = 0
    accepted_per_round: list[int] = field(default_factory=list)
    verified_per_round: list[int] = field(default_factory=list)  # candidates the target verified, per round
    position_offered: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    # a length policy's acceptance estimate P̂ of each candidate whose outcome verification observed (those up to
    # and including the first rejection) and that it estimated (a post head reads none for a round's last candidate
    # at k_max), and that outcome (1: accepted); empty for policies without estimates
    estimates: list[float] = field(default_factory=list)
    estimate_outcomes: list[int] = field(default_factory=list)
    # the policy's acceptance source as the cost model prices it (its price_key; None: no source, or a bound's
    # hindsight), the estimates it made and the verified rounds it folded into an online fit
    source_key: str | None = None
    source_calls: int = 0
    source_updates: int = 0
    wall_time_s: float = 0.0
    # compiled forwards (``compile=True``): the settings they ran with (None: eager, wholly or for a model whose
    # compilation failed), and why a decode asked to compile ran eager (one line; None: it did not)
    compile: CompileConfig | None = None
    eager_reason: str | None = None
    # the files of the models, head and profile this decode used that were loaded with ``verify=False`` (their
    # recorded sha256 unchecked: decode.digests.Loaded); empty: every artifact was checked or made in memory
    unverified_files: list[str] = field(default_factory=list)

    @property
    def discarded(self) -> int:
        """Candidates drafted but not emitted (rejected or never verified)."""
        return self.rejected + self.unverified

    @property
    def rounds(self) -> int:
        """Number of verification rounds."""
        return len(self.accepted_per_round)

    @property
    def per_position_acceptance(self) -> list[float]:
        """Acceptance rate of the candidate at index ``i`` among those that were verified there."""
        return [a / o if o else float("nan") for a, o in zip(self.position_accepted, self.position_offered)]

    @property
    def discard_rate(self) -> float:
        """Discarded candidates per generated token."""
        return self.discarded / self.generated if self.generated else 0.0

    @property
    def verification_rate(self) -> float:
        """Target calls per generated token."""
        return self.target_calls / self.generated if self.generated else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Generated tokens per target call."""
        return self.generated / self.target_calls if self.target_calls else 0.0

    def modelled_time(self, t_draft: float, t_target: float, t_companion: float | None = None) -> float:
        """``CostModel(t_draft, t_target, t_companion).time(self)``: flat verification latency.

        ``t_companion`` defaults to ``t_draft`` (the DESIGN §5 pair measures no companion); with a
        measured companion cost or latency shape build a :class:`~decode.costs.CostModel`.
        """
        return CostModel(t_draft, t_target, t_draft if t_companion is None else t_companion).time(self)

    def record_round(self, verified: int, accepted: int) -> None:
        """Per-position counts for a round whose first ``verified`` candidates met the target."""
        offered = min(verified, accepted + 1)
        grow = offered - len(self.position_offered)
        if grow > 0:
            self.position_offered.extend([0] * grow)
            self.position_accepted.extend([0] * grow)
        for index in range(offered):
            self.position_offered[index] += 1
            self.position_accepted[index] += index < accepted
        self.accepted_per_round.append(accepted)
        self.verified_per_round.append(verified)

    def record_estimates(self, estimates: list[float], verified: int, accepted: int) -> None:
        """Pair a round's estimates (``estimates[j]`` of candidate ``j + 1``) with the outcomes verification observed."""
        observed = min(verified, accepted + 1, len(estimates))
        self.estimates.extend(estimates[:observed])
        self.estimate_outcomes.extend(int(j < accepted) for j in range(observed))


class CallCounter:
    """Counts a model's forward calls via a forward hook (HF ``generate`` baselines, benchmarks)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self._handle = model.register_forward_hook(self._hook)

    def _hook(self, *args: object) -> None:
        self.calls += 1

    def remove(self) -> None:
        self._handle.remove()
