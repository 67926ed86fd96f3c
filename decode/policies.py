"""Length policies: how many candidates to draft, and how many of them to verify.

The decoder drives drafting and consults the policy at fixed points of each round:
:meth:`Policy.after_propose` once a candidate ``y_i`` is sampled (before it is fed to the draft),
:meth:`Policy.after_feed` once ``y_i`` has been fed (the draft then also produced ``q_{i+1}``),
and :meth:`Policy.verification_length` when drafting ends. Only policies with ``dynamic = True``
are consulted per step (those force one host sync per drafted token).
"""

from __future__ import annotations

import copy
import sys
from typing import ClassVar, Literal, cast

import numpy as np
import torch
from torch import Tensor

from decode.batch_costs import BatchCosts
from decode.costs import CostModel
from decode.draft_round import Decision, DraftRound
from decode.head import AcceptanceHead, head_features
from decode.metadata import recorded_k_range
from decode.profile import BatchLatency, SVProfile, companion_indicators, joint_goodput_lengths
from decode.rules import Rule
from decode.stop_rules import Goodput, StopRule, Threshold, batch_drafting_pays, batch_opening_pays

CompanionUse = Literal["step", "round"] | None


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

    def fresh(self) -> Policy:
        """An independent copy in its initial state, for one row of a batch (models are shared, not copied).

        A shallow copy: per-generation state must live in attributes that are reassigned, never
        mutated in place (true of every policy here).
        """
        policy = copy.copy(self)
        policy.reset()
        return policy

    def to(self, device: torch.device) -> Policy:
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

    def batch_plan(self) -> BatchPlan:
        """How the rows of a batch decoded with this policy decide together (default: each as alone)."""
        return BatchPlan()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class BatchPlan:
    """The decisions a batch's rows take together, hooks of the batched loop (DESIGN §7).

    The defaults leave every decision to each row's own policy, so a row decodes as it would alone.
    A plan may decide whether a round drafts at all, stop the rows' drafting together, choose the
    rows' verification lengths jointly and learn from each round; only lengths, never a row's
    tokens' distribution, may depend on the other rows.
    """

    def opens_round(self, rows: list[Policy]) -> bool:
        """Whether this round drafts (False: a target-only step); called after each row's ``start_round``."""
        return True

    def drafting(self, rows: list[Policy], i: int, batch: int, after: Literal["propose", "feed"]) -> list[bool]:
        """Which of the ``rows`` still drafting draft on after ``i`` steps (at the point ``after``) of a ``batch``-row
        round (default: all, each row's own policy deciding)."""
        return [True] * len(rows)

    def verification_lengths(self, rows: list[Policy], states: list[DraftRound]) -> list[int]:
        """How many candidates each row verifies."""
        return [policy.verification_length(state) if state.i else 0 for policy, state in zip(rows, states)]

    def end_round(self, batch: int, emitted: int, draft_steps: int, verified: int) -> None:
        """A round of ``batch`` rows ended: ``emitted`` tokens, ``draft_steps`` draft forwards, ``verified`` candidates."""


class Fixed(Policy):
    """Always draft ``k`` candidates."""


    def __init__(self, k: int = 5) -> None:
        if k < 1:
            raise ValueError(f"Fixed(k) needs k >= 1, got {k}")
        self.k = k

    def k_cap(self) -> int:
        return self.k

    def __repr__(self) -> str:
        return f"Fixed(k={self.k})"


class TargetOnly(Policy):
    """Draft nothing: every round is a target-only step. The target alone decoded by this project's own loop (its
    caches, batching and sampling), the baseline a batched method is timed against without HF ``generate``'s
    per-step overhead (``K = 0`` among the fixed lengths)."""

    def k_cap(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "TargetOnly()"


class Heuristic(Policy):
    """HF's ``heuristic`` schedule: ``k += 2`` after a fully accepted round, else ``k = max(1, k − 1)``.

    Starts at ``k0 = 5`` on every generation (HF's ``num_assistant_tokens`` defaults to 20 and is
    carried across calls; a fixed restart keeps generations reproducible) and is capped at ``k_max``.
    """


    def __init__(self, k0: int = 5, k_max: int = 20) -> None:
        if not 1 <= k0 <= k_max:
            raise ValueError(f"Heuristic needs 1 <= k0 <= k_max, got k0={k0}, k_max={k_max}")
        self.k0, self.k_max = k0, k_max
        self.k = k0

    def reset(self) -> None:
        self.k = self.k0

    def k_cap(self) -> int:
        return self.k

    def end_round(self, drafted: int, verified: int, accepted: int) -> None:
        self.k = min(self.k_max, self.k + 2) if accepted == verified else max(1, self.k - 1)

    def __repr__(self) -> str:
        return f"Heuristic(k0={self.k0}, k_max={self.k_max})"


def draft_top_probability(state: DraftRound) -> float:
    """``max q_i`` of the latest candidate's draft distribution (:meth:`Sampling.feature_probs`)."""
    return float(state.sampling.feature_probs(state.latest.step.q_logits).max())


class Confidence(Policy):
    """Stop drafting after ``y_i`` when the draft's top probability ``max q_i < tau`` (``y_i`` is kept)."""

    dynamic = True

    def __init__(self, tau: float = 0.4, k_max: int = 20) -> None:
        if not 0.0 <= tau <= 1.0 or k_max < 1:
            raise ValueError(f"Confidence needs tau in [0, 1] and k_max >= 1, got tau={tau}, k_max={k_max}")
        self.tau, self.k_max = tau, k_max
        self.tops: list[float] = []  # this round's max q_i, in candidate order

    def k_cap(self) -> int:
        return self.k_max

    def start_round(self) -> None:
        self.tops: list[float] = []

    def round_estimates(self) -> list[float]:
        return self.tops

    def after_propose(self, state: DraftRound) -> Decision:
        top = draft_top_probability(state)
        self.tops = [*self.tops, top]
        return Decision.STOP if top < self.tau else Decision.CONTINUE

    def __repr__(self) -> str:
        return f"Confidence(tau={self.tau}, k_max={self.k_max})"


class AcceptanceSource:
    """Where an estimate-driven policy's ``P̂_i`` comes from, and when it is read (DESIGN §2)."""

    decides_after: Literal["propose", "feed"] = "propose"
    needs_hidden = False
    needs_hindsight = False
    companion: CompanionUse = None

    def estimate(self, state: DraftRound) -> float:
        """``P̂_i`` of the latest candidate ``y_i``."""
        raise NotImplementedError

    def end_round(self, verified: int, accepted: int) -> None:
        """Feedback after verification: ``accepted`` of the ``verified`` candidates were accepted."""

    def fresh(self) -> AcceptanceSource:
        """The source for one row of a batch (default: this one; a source with per-round state copies it)."""
        return self

    def to(self, device: torch.device) -> None:
        """Move any model it holds to ``device``."""


class HeadEstimate(AcceptanceSource):
    """A trained head's ``P̂_i``. A ``pre`` head reads the state that produced ``q_i`` plus features of ``y_i``,
    once ``y_i`` is proposed (no extra draft call); a ``post`` head reads the draft forward that consumed ``y_i``,
    so a round it stops costs one draft call more than fixed-K drafting."""

    needs_hidden = True

    def __init__(self, head: AcceptanceHead) -> None:
        self.head = head.eval()
        self.decides_after = "propose" if head.config.timing == "pre" else "feed"
        self.companion = "step" if head.config.companion_features else None

    def to(self, device: torch.device) -> None:
        self.head.to(device)

    def inputs(self, state: DraftRound) -> tuple[Tensor, Tensor | None]:
        """The head's input for ``y_i``: the draft's hidden state and (``pre``) the candidate's features."""
        config = self.head.config
        if config.timing != "pre":
            return state.next.hidden, None
        candidate = state.latest
        q_logits, y = candidate.step.q_logits, candidate.token
        q = state.sampling.feature_probs(q_logits)
        companion = None
        if config.companion_features:
            indicators = companion_indicators(state.sampling, q_logits, candidate.companion_logits, y)
            companion = (indicators.x, indicators.y)
        return candidate.step.hidden, head_features(q, y, config.features, companion, config.depth_of(state.i),
                                                    candidate.step.input_token)

    def predict(self, hidden: Tensor, features: Tensor | None) -> float:
        """``P̂`` from the head's inputs (:meth:`inputs`)."""
        with torch.no_grad():
            return float(self.head.predict(hidden.float(), features))

    def estimate(self, state: DraftRound) -> float:
        return self.predict(*self.inputs(state))


class TrueAcceptance(AcceptanceSource):
    """Each candidate's true acceptance probability, read in hindsight once it is proposed (an analysis bound: what
    a perfectly calibrated head could reach with a stop rule; DESIGN §5). It needs no head and no hidden state, and
    stopping on ``p`` and ``q`` alone keeps every rule lossless."""

    needs_hindsight = True

    def estimate(self, state: DraftRound) -> float:
        return state.latest.hindsight.accept_prob


class StopPolicy(Policy):
    """A length policy composed of an acceptance source and a stop rule (:mod:`decode.stop_rules`).

    After each candidate it reads ``P̂_i`` from its source at the source's point of the round, updates the running
    keep-probability ``Π_i = Π_{j≤i} P̂_j`` (here only) and asks its rule whether to stop.
    """

    dynamic = True

    def __init__(self, source: AcceptanceSource, stop: StopRule) -> None:
        self.source, self.stop = source, stop
        self.needs_hidden, self.needs_hindsight = source.needs_hidden, source.needs_hindsight
        self.companion = source.companion
        self.keep = 1.0
        self.estimates: list[float] = []  # this round's P̂, in candidate order
        self._fed_past_stop = False  # this round's stop was read after the draft consumed y_i

    @property
    def k_min(self) -> int:
        return self.stop.k_min

    @property
    def k_max(self) -> int:
        return self.stop.k_max

    def fresh(self) -> StopPolicy:
        """A copy with its own stop-rule state and its source's :meth:`~AcceptanceSource.fresh` (models are shared)."""
        policy = copy.copy(self)
        policy.stop = copy.copy(self.stop)
        policy.source = self.source.fresh()
        policy.reset()
        return policy

    def to(self, device: torch.device) -> StopPolicy:
        self.source.to(device)
        return self

    def reset(self) -> None:
        self.stop.reset()

    def k_cap(self) -> int:
        return self.stop.k_max

    def start_round(self) -> None:
        self.keep = 1.0
        self.estimates = []
        self._fed_past_stop = False

    def observe(self, accept: float) -> None:
        """Take the latest candidate's acceptance estimate into ``Π``."""
        self.keep *= accept
        self.estimates = [*self.estimates, accept]

    def round_estimates(self) -> list[float]:
        return self.estimates

    def estimate(self, state: DraftRound) -> float:
        """The source's ``P̂_i`` of the latest candidate."""
        return self.source.estimate(state)

    def decide(self, state: DraftRound, accept: float) -> Decision:
        """The rule's decision after ``y_i`` with estimate ``accept``."""
        self.observe(accept)
        return Decision.STOP if self.stop.stops(state.i, self.keep, accept) else Decision.CONTINUE

    def after_propose(self, state: DraftRound) -> Decision:
        if self.source.decides_after != "propose":
            return Decision.CONTINUE
        return self.decide(state, self.estimate(state))

    def after_feed(self, state: DraftRound) -> Decision:
        if self.source.decides_after != "feed":
            return Decision.CONTINUE
        decision = self.decide(state, self.estimate(state))
        self._fed_past_stop = decision is Decision.STOP
        return decision

    def end_round(self, drafted: int, verified: int, accepted: int) -> None:
        self.source.end_round(verified, accepted)
        self.stop.end_round(drafted, verified, accepted, self._fed_past_stop)

    def batch_plan(self) -> BatchPlan:
        if isinstance(self.stop, Goodput) and self.stop.batch_costs is not None:
            return BatchGoodput(self.stop.batch_costs)
        if isinstance(self.stop, SurvivalStop):
            return SurvivalBudget(self.stop.costs)
        return BatchPlan()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(source={type(self.source).__name__}, stop={self.stop!r})"


class Head(StopPolicy):
    """SpecDec++ threshold rule on a trained head: keep drafting while ``1 − Π_{j≤i} P̂_j ≤ threshold``.

    Left out, ``threshold`` and the K range are the ones the head records (``h`` chosen on dev after training,
    DESIGN §5; the range 1..20 where none is recorded)."""


    def __init__(self, head: AcceptanceHead, threshold: float | None = None, k_min: int | None = None,
                 k_max: int | None = None) -> None:
        recorded = head.metadata
        if threshold is None:
            if recorded is None or recorded.threshold is None:
                raise ValueError("this head records no stop threshold h (trained with head.calibrate=false): pass "
                                 "Head(head, threshold=h)")
            threshold = recorded.threshold
        low, high = recorded_k_range(recorded, 1, 20)
        super().__init__(HeadEstimate(head), Threshold(threshold, low if k_min is None else k_min,
                                                       high if k_max is None else k_max))

    @property
    def head(self) -> AcceptanceHead:
        return cast(HeadEstimate, self.source).head

    @property
    def threshold(self) -> float:
        return cast(Threshold, self.stop).threshold

    def __repr__(self) -> str:
        return (f"Head(timing={self.head.config.timing}, threshold={self.threshold}, "
                f"k_min={self.k_min}, k_max={self.k_max})")


class GoodputHead(StopPolicy):
    """A trained head with the goodput stop instead of a swept threshold ``h`` (DESIGN §2, goodput stop;
    :class:`~decode.stop_rules.Goodput`). In a batch with measured ``batch_costs`` the rule is taken for the
    batch as a whole (:class:`BatchGoodput`; DESIGN §7); without them rows decide as alone."""


    def __init__(self, head: AcceptanceHead, costs: CostModel, k_min: int = 1, k_max: int = 20,
                 batch_costs: BatchCosts | None = None) -> None:
        source = HeadEstimate(head)
        super().__init__(source, Goodput(costs, k_min, k_max, batch_costs, companion=source.companion is not None))

    @property
    def head(self) -> AcceptanceHead:
        return cast(HeadEstimate, self.source).head

    def __repr__(self) -> str:
        return f"GoodputHead(timing={self.head.config.timing}, k_min={self.k_min}, k_max={self.k_max})"


class BatchGoodput(BatchPlan):
    """The goodput stop of a batch's rows taken for the batch at measured ``batch_costs`` (DESIGN §7).

    Tracks the batch's modelled throughput ``λ_B`` (tokens per modelled second so far; before the
    first round the target alone's at the batch size), opens a round only where drafting pays
    (:func:`~decode.stop_rules.batch_opening_pays`) and stops the rows together
    (:func:`~decode.stop_rules.batch_drafting_pays`).
    """

    def __init__(self, costs: BatchCosts) -> None:
        self.costs = costs
        self.tokens, self.seconds = 0, 0.0
        self.throughput = 0.0  # λ_B at the start of the current round

    @staticmethod
    def _stops(rows: list[Policy]) -> list[Goodput]:
        # a batch's rows are copies of one goodput policy (Policy.fresh)
        return [cast(Goodput, cast(StopPolicy, row).stop) for row in rows]

    def opens_round(self, rows: list[Policy]) -> bool:
        batch = len(rows)
        alone = batch / self.costs.target_time(batch, batch)
        self.throughput = self.tokens / self.seconds if self.seconds > 0 else alone
        stops = self._stops(rows)
        for stop in stops:
            stop.join_batch()
        return batch_opening_pays(stops, batch, max(self.throughput, alone))

    def drafting(self, rows: list[Policy], i: int, batch: int, after: Literal["propose", "feed"]) -> list[bool]:
        if not rows or cast(StopPolicy, rows[0]).source.decides_after != after:
            return [True] * len(rows)
        return [batch_drafting_pays(self._stops(rows), i, batch, self.throughput)] * len(rows)

    def end_round(self, batch: int, emitted: int, draft_steps: int, verified: int) -> None:
        self.tokens += emitted
        self.seconds += draft_steps * self.costs.draft_time(batch) + self.costs.verify_time(batch, verified)


class SurvivalStop(StopRule):
    """The stop of a row whose batch decides for it (:class:`SurvivalBudget`, at measured ``costs``): alone it never
    stops before ``k_max``."""

    def __init__(self, costs: BatchCosts, k_min: int = 1, k_max: int = 20) -> None:
        super().__init__(k_min, k_max)
        self.costs = costs

    def stops(self, i: int, keep: float, accept: float) -> bool:
        return False

    def next_pays(self, i: int, keep: float, forecast: float) -> bool:
        return True


class SurvivalBudget(BatchPlan):
    """vLLM's verification budget as a stopping time (DESIGN §7, "Survival budget"): after each drafting step the
    rows still drafting are ranked by the survival ``Π_{j≤i} P̂_j · P̂_i`` their next candidate is forecast to
    reach, and the top ``n`` draft on, ``n`` maximising the round's expected tokens (one per row plus every drafted
    candidate's survival) over its modelled seconds at the measured ``t_d(B)`` and ``t_t(B, T)``; ``n = 0`` ends
    drafting. A round opens (each row drafts its first candidate) unless the rows' first-candidate forecasts, the mean
    ``P̂_1`` of their generation so far, say a target-only step is faster. Decisions read only what was drafted, so
    every rule stays lossless.
    """

    def __init__(self, costs: BatchCosts) -> None:
        self.costs = costs
        self.batch: list[StopPolicy] = []
        self.draft_seconds = 0.0  # this round's draft forwards so far
        self.first_sum, self.first_count = 0.0, 0  # P̂_1 of the generation's rounds so far (the opening forecast)

    def opens_round(self, rows: list[Policy]) -> bool:
        self.batch = [cast(StopPolicy, row) for row in rows]
        batch = len(rows)
        self.draft_seconds = self.costs.draft_time(batch)  # the forward that produces every row's q_1
        if not self.first_count:
            return True
        forecast = self.first_sum / self.first_count
        alone = batch / self.costs.target_time(batch, batch)
        drafted = batch * (1 + forecast) / (self.draft_seconds + self.costs.verify_time(batch, batch))
        return drafted > alone

    def drafting(self, rows: list[Policy], i: int, batch: int, after: Literal["propose", "feed"]) -> list[bool]:
        policies = [cast(StopPolicy, row) for row in rows]
        if not policies or policies[0].source.decides_after != after:
            return [True] * len(rows)
        if i == 1:
            firsts = [p.estimates[0] for p in self.batch if p.estimates]
            self.first_sum, self.first_count = self.first_sum + sum(firsts), self.first_count + len(firsts)
        if i < policies[0].k_min:
            self.draft_seconds += self.costs.draft_time(len(rows))
            return [True] * len(rows)
        drafted = sum(len(p.estimates) for p in self.batch)
        tokens = len(self.batch) + sum(float(np.prod(p.estimates[: j + 1])) for p in self.batch
                                       for j in range(len(p.estimates)))
        seconds = self.draft_seconds + self.costs.verify_time(len(self.batch), drafted)
        forecasts = [p.keep * p.estimates[-1] for p in policies]
        order = sorted(range(len(rows)), key=lambda r: -forecasts[r])
        best, best_rate, gain = 0, tokens / seconds, 0.0
        for n, r in enumerate(order, start=1):
            gain += forecasts[r]
            cost = self.costs.draft_time(n) + self.costs.verify_time(len(self.batch), drafted + n)
            if (tokens + gain) / (self.draft_seconds + cost) > best_rate:
                best, best_rate = n, (tokens + gain) / (self.draft_seconds + cost)
        if best:
            self.draft_seconds += self.costs.draft_time(best)
        chosen = set(order[:best])
        return [r in chosen for r in range(len(rows))]


class SV(Policy):
    """Speculative Verification: draft ``k``, score with the companion, verify a goodput-optimal prefix.

    Candidates beyond the chosen length are discarded unverified. The length is a stopping time
    (DESIGN §1 pitfalls): whether ``y_{L+1}`` is verified uses the full ``α = profile(X, Y)`` of
    ``y_1..y_L`` but only ``X_{L+1}`` for ``y_{L+1}`` (:meth:`SVProfile.verification_length`), so
    lossless rules stay lossless.
    """

    companion = "round"

    def __init__(self, profile: SVProfile, k: int = 6, batch_latency: BatchLatency | None = None) -> None:
        if k < 1:
            raise ValueError(f"SV(k) needs k >= 1, got {k}")
        self.profile, self.k = profile, k
        #: ``t_t(B, T)`` for batched decoding (:meth:`batch_verification_lengths`); default from the profile.
        self.batch_latency = batch_latency if batch_latency is not None else profile.batch_latency

    def k_cap(self) -> int:
        return self.k

    def verification_length(self, state: DraftRound) -> int:
        n = state.i
        if n == 0:
            return 0
        indicators = companion_indicators(state.sampling, state.q_logits(), state.companion_logits(), state.tokens())
        return self.profile.verification_length(indicators.x, indicators.y)

    def batch_verification_lengths(self, states: list[DraftRound]) -> list[int]:
        """Verification lengths of a batch's rows, chosen jointly (:func:`~decode.profile.joint_goodput_lengths`)."""
        alpha, alpha_next = [], []
        for state in states:
            if state.i:
                indicators = companion_indicators(state.sampling, state.q_logits(), state.companion_logits(),
                                                  state.tokens())
                alpha.append(self.profile.alpha(indicators.x, indicators.y))
                alpha_next.append(self.profile.alpha_given_x(indicators.x))
            else:
                alpha.append(torch.empty(0))
                alpha_next.append(torch.empty(0))
        return joint_goodput_lengths(alpha, alpha_next, self.batch_latency)

    def batch_plan(self) -> BatchPlan:
        return JointVerification(self)

    def __repr__(self) -> str:
        return f"SV(k={self.k})"


class JointVerification(BatchPlan):
    """SV's batch scheduling: the rows' verification lengths chosen jointly (DESIGN §3)."""

    def __init__(self, policy: SV) -> None:
        self.policy = policy

    def verification_lengths(self, rows: list[Policy], states: list[DraftRound]) -> list[int]:
        return self.policy.batch_verification_lengths(states)


class Oracle(Policy):
    """The realised oracle, for every rule (an analysis bound): stop exactly before the first rejection.

    Each candidate's verification uniform ``u_i`` is drawn when it is proposed and its acceptance
    probability ``a_i`` computed from an uncounted target forward (:attr:`needs_hindsight`); the
    round drops ``y_i`` at the first ``u_i ≥ a_i`` and the target verifies the rest with those same
    uniforms, so nothing it verifies is rejected (up to float ties between the hindsight forward and
    the verification forward). This couples the randomness: the rounds accept exactly the prefixes a
    policy drafting without limit would get accepted with the same draws, without paying for the
    rejected candidate. It peeks at the future and is not lossless (the token after the prefix comes
    from the bonus distribution, not the residual) — a bound to count against. Draft calls follow
    SpecDec++ Thm 4.1 (DESIGN §5): the forward that produced ``q_i`` for the dropped ``y_i`` is
    hindsight too and is not charged (a stop before ``y_i`` never needs ``q_i``), so
    ``draft_calls = accepted``. For greedy this is the Thm 4.1 oracle.
    """

    dynamic = True
    needs_hindsight = True

    def __init__(self, k_max: int | None = None) -> None:
        if k_max is not None and k_max < 1:
            raise ValueError(f"Oracle(k_max) needs k_max >= 1 or None, got {k_max}")
        self.k_max = k_max

    def k_cap(self) -> int:
        return self.k_max if self.k_max is not None else sys.maxsize

    def after_propose(self, state: DraftRound) -> Decision:
        hindsight = state.latest.hindsight
        return Decision.DROP if float(hindsight.draw) >= hindsight.accept_prob else Decision.CONTINUE

    def __repr__(self) -> str:
        return f"Oracle(k_max={self.k_max})"


class PerfectHead(StopPolicy):
    """:class:`Head`'s threshold stop (``1 − Π a_j > threshold``) on the true acceptance probabilities ``a_j``."""


    def __init__(self, threshold: float = 0.5, k_min: int = 1, k_max: int = 20) -> None:
        super().__init__(TrueAcceptance(), Threshold(threshold, k_min, k_max))

    @property
    def threshold(self) -> float:
        return cast(Threshold, self.stop).threshold

    def __repr__(self) -> str:
        return f"PerfectHead(threshold={self.threshold}, k_min={self.k_min}, k_max={self.k_max})"


class PerfectGoodput(StopPolicy):
    """:class:`GoodputHead`'s goodput stop on the true acceptance probabilities (batch size 1)."""


    def __init__(self, costs: CostModel, k_min: int = 1, k_max: int = 20) -> None:
        super().__init__(TrueAcceptance(), Goodput(costs, k_min, k_max))

    def __repr__(self) -> str:
        return f"PerfectGoodput(k_min={self.k_min}, k_max={self.k_max})"
