"""A length policy's interface, what building one may need, and the interface of a batch's joint decisions
(DESIGN §6, §7).

The decoder drives drafting and consults the policy at fixed points of each round:
:meth:`Policy.after_propose` once a candidate ``y_i`` is sampled (before it is fed to the draft),
:meth:`Policy.after_feed` once ``y_i`` has been fed (the draft then also produced ``q_{i+1}``),
and :meth:`Policy.verification_length` when drafting ends. Only policies with ``dynamic = True``
are consulted per step (those force one host sync per drafted token).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

import torch
from typing_extensions import Self

from decode.batch_costs import BatchCosts
from decode.costs import CostModel
from decode.draft_round import Decision, DraftRound
from decode.head import AcceptanceHead
from decode.profile import SVProfile
from decode.rules import Rule

CompanionUse = Literal["step", "round"] | None
Named = TypeVar("Named", bound=type)
#: The most candidates a round drafts unless told otherwise: SpecDec++'s range 1..20 (DESIGN §2), every policy's
#: default, a head's where it records none, and the evaluation's (``head.k_max``).
DEFAULT_K_MAX = 20


def registrar(registry: dict[str, Any], what: str) -> Callable[[Named], Named]:
    """A class decorator that adds a class to ``registry`` under its ``name``, after the ones there (a name another
    class holds is refused); ``what``: what the registry holds, for that refusal."""
    def register(cls: Named) -> Named:
        if cls.name in registry and registry[cls.name] is not cls:
            raise ValueError(f"{what} {cls.name!r} is already registered by {registry[cls.name].__name__}")
        registry[cls.name] = cls
        return cls

    return register


@dataclass(frozen=True)
class PolicyInputs:
    """What building a policy may need: the heads and profiles by name, the cost models and the K range.

    ``k_min`` / ``k_max`` apply where a head's metadata does not carry the range it was calibrated with.
    """

    heads: Mapping[str, AcceptanceHead] = field(default_factory=dict)
    profiles: Mapping[str, SVProfile] = field(default_factory=dict)
    costs: CostModel | None = None  # the goodput stop's cost model at batch size 1
    batch_costs: BatchCosts | None = None  # measured batch costs: the goodput stop and SV decide at a batch's prices
    k_min: int = 1
    k_max: int = DEFAULT_K_MAX

    def goodput_costs(self, kind: str) -> tuple[CostModel, BatchCosts | None]:
        """The costs a goodput stop of ``kind`` decides by: the measured batch costs' batch-1 model with them,
        else :attr:`costs`."""
        if self.batch_costs is not None:
            return self.batch_costs.batch_one(), self.batch_costs
        if self.costs is None:
            raise ValueError(f"a {kind} policy needs the cost model it stops by (PolicyInputs.costs)")
        return self.costs, None


class Policy:
    """Base class: draft ``k_cap()`` candidates and verify them all."""

    dynamic: ClassVar[bool] = False
    needs_hidden: ClassVar[bool] = False
    #: An analysis bound, never a serving policy: the decoder gives it each candidate's true acceptance
    #: probability from an uncounted target forward (:class:`~decode.draft_round.Hindsight`).
    needs_hindsight: ClassVar[bool] = False
    companion: CompanionUse = None

    def validate(self, rule: Rule, has_companion: bool) -> None:
        """Raise ``ValueError`` when the policy makes no sense with this rule / companion."""
        if self.companion is not None and not has_companion:
            raise ValueError(f"policy {self!r} needs a companion model: pass companion=... to the decoder")

    def reset(self) -> None:
        """Forget state carried between rounds (called at the start of every generation)."""

    def fresh(self) -> Self:
        """An independent copy in its initial state, for one row of a batch (models are shared, not copied).

        A shallow copy: per-generation state must live in attributes that are reassigned, never
        mutated in place (true of every policy here).
        """
        policy = copy.copy(self)
        policy.reset()
        return policy

    def to(self, device: torch.device) -> Self:
        """Move any model the policy holds to ``device``."""
        return self

    def k_cap(self) -> int:
        """Maximum number of candidates to draft this round."""
        raise NotImplementedError

    def start_round(self) -> None:
        """Called before the first candidate of each round."""

    def after_propose(self, state: DraftRound) -> Decision:
        """Check after ``y_i`` is sampled (``dynamic`` policies only)."""
        return Decision.CONTINUE

    def after_feed(self, state: DraftRound) -> Decision:
        """Check after ``y_i`` was fed to the draft (``dynamic`` policies only)."""
        return Decision.CONTINUE

    def verification_length(self, state: DraftRound) -> int:
        """How many of the drafted candidates to verify."""
        return state.i

    def end_round(self, drafted: int, verified: int, accepted: int) -> None:
        """Feedback after verification."""

    def round_estimates(self) -> list[float]:
        """The acceptance estimates ``P̂`` this round's candidates were judged by, in order (none by default): the
        decoder pairs them with their outcomes (:meth:`decode.stats.DecodeStats.record_estimates`)."""
        return []

    @property
    def price_key(self) -> str | None:
        """The key its acceptance source's compute is priced by (:meth:`decode.costs.CostModel.price`; None: it has
        no source the cost model prices: a schedule whose reads of ``q`` are part of the draft's step, or a bound)."""
        return None

    def take_source_calls(self) -> tuple[int, int]:
        """The estimates its source made and the rounds it folded since the last call ``(estimates, folds)``, which
        it then forgets: what the decoder counts (:class:`decode.stats.DecodeStats` ``source_calls``)."""
        return 0, 0

    def batch_plan(self) -> BatchPlan[Self]:
        """How the rows of a batch decoded with this policy decide together (default: each as alone)."""
        return BatchPlan()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


#: The policy type of a batch's rows, as a plan reads them (each row is a :meth:`Policy.fresh` copy of one policy).
Row = TypeVar("Row", bound=Policy, contravariant=True)


class BatchPlan(Generic[Row]):
    """The decisions a batch's rows take together, hooks of the batched loop (DESIGN §7).

    The defaults leave every decision to each row's own policy, so a row decodes as it would alone.
    A plan may decide whether a round drafts at all, stop the rows' drafting together, choose the
    rows' verification lengths jointly and learn from each round; only lengths, never a row's
    tokens' distribution, may depend on the other rows.
    """

    def opens_round(self, rows: list[Row]) -> bool:
        """Whether this round drafts (False: a target-only step); called after each row's ``start_round``."""
        return True

    def drafting(self, rows: list[Row], i: int, batch: int, after: Literal["propose", "feed"]) -> list[bool]:
        """Which of the ``rows`` still drafting draft on after ``i`` steps (at the point ``after``) of a ``batch``-row
        round (default: all, each row's own policy deciding)."""
        return [True] * len(rows)

    def verification_lengths(self, rows: list[Row], states: list[DraftRound]) -> list[int]:
        """How many candidates each row verifies."""
        return [policy.verification_length(state) if state.i else 0 for policy, state in zip(rows, states)]

    def end_round(self, batch: int, emitted: int, draft_steps: int, verified: int) -> None:
        """A round of ``batch`` rows ended: ``emitted`` tokens, ``draft_steps`` draft forwards, ``verified``
        candidates."""
