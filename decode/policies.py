"""Length policies: how many candidates to draft, and how many of them to verify.

The decoder drives drafting and consults the policy at fixed points of each round:
:meth:`Policy.after_propose` once a candidate ``y_i`` is sampled (before it is fed to the draft),
:meth:`Policy.after_feed` once ``y_i`` has been fed (the draft then also produced ``q_{i+1}``),
and :meth:`Policy.verification_length` when drafting ends. Only policies with ``dynamic = True``
are consulted per step (those force one host sync per drafted token).
"""

from __future__ import annotations

import copy
import enum
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal, cast

import torch
from torch import Tensor

from decode.batch_costs import BatchCosts
from decode.costs import CostModel
from decode.head import AcceptanceHead, head_features
from decode.profile import BatchLatency, SVProfile, companion_indicators, joint_goodput_lengths
from decode.rules import Rule
from decode.sampling import Sampling

CompanionUse = Literal["step", "round"] | None


class Decision(enum.Enum):
    """Outcome of a per-step policy check."""

    CONTINUE = "continue"
    STOP = "stop"  # keep y_i, stop drafting
    DROP = "drop"  # stop drafting, withdraw y_i and uncharge the draft call that produced q_i (hindsight policies:
    # the realised oracle, and the analysis levers that draft a candidate only to read its label)


@dataclass
class DraftRound:
    """Everything drafted so far in the current round, filled in place by the decoder.

    ``q_logits[j]`` is ``q_{j+1}`` and ``hidden[j]`` the draft's final hidden state of the forward
    that produced it — which is also the forward that consumed ``y_j``. So a ``pre`` head for
    ``y_i`` reads ``hidden[i-1]`` and a ``post`` head reads ``hidden[i]``. ``companion_logits[j]``
    is ``c_{j+1}``. For a hindsight policy (analysis bounds only) ``accept_probs[j]`` is ``y_{j+1}``'s
    true acceptance probability under the rule, from an uncounted target forward, ``expected_accepts[j]``
    the probability before ``y_{j+1}`` was drawn (:meth:`Rule.expected_accept`), and ``draws[j]``
    the uniform its verification will use, drawn with the candidate (DESIGN §5).
    """

    sampling: Sampling
    q_logits: list[Tensor] = field(default_factory=list)
    hidden: list[Tensor] = field(default_factory=list)
    tokens: list[Tensor] = field(default_factory=list)
    companion_logits: list[Tensor] = field(default_factory=list)
    accept_probs: list[float] = field(default_factory=list)
    expected_accepts: list[float] = field(default_factory=list)
    draws: list[Tensor] = field(default_factory=list)

    @property
    def i(self) -> int:
        """Index (1-based) of the latest candidate."""
        return len(self.tokens)

    def withdraw(self) -> None:
        """Take back the latest candidate (with its hindsight acceptances and draw, if any)."""
        n = len(self.tokens) - 1
        del self.tokens[n:], self.accept_probs[n:], self.expected_accepts[n:], self.draws[n:]


class Policy:
    """Base class: draft ``k_cap()`` candidates and verify them all."""

    name: ClassVar[str]
    dynamic: ClassVar[bool] = False
    needs_hidden: ClassVar[bool] = False
    #: An analysis bound, never a serving policy: the decoder gives it each candidate's true acceptance
    #: probability from an uncounted target forward (:attr:`DraftRound.accept_probs`).
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

    def stops_drafting(self, rows: list[Policy], i: int, batch: int, after: Literal["propose", "feed"]) -> bool:
        """Whether the ``rows`` still drafting stop together after ``i`` steps (at the point ``after``) of a
        ``batch``-row round."""
        return False

    def verification_lengths(self, rows: list[Policy], states: list[DraftRound]) -> list[int]:
        """How many candidates each row verifies."""
        return [policy.verification_length(state) if state.i else 0 for policy, state in zip(rows, states)]

    def end_round(self, batch: int, emitted: int, draft_steps: int, verified: int) -> None:
        """A round of ``batch`` rows ended: ``emitted`` tokens, ``draft_steps`` draft forwards, ``verified`` candidates."""


class Fixed(Policy):
    """Always draft ``k`` candidates."""

    name = "fixed"

    def __init__(self, k: int = 5) -> None:
        if k < 1:
            raise ValueError(f"Fixed(k) needs k >= 1, got {k}")
        self.k = k

    def k_cap(self) -> int:
        return self.k

    def __repr__(self) -> str:
        return f"Fixed(k={self.k})"


class Heuristic(Policy):
    """HF's ``heuristic`` schedule: ``k += 2`` after a fully accepted round, else ``k = max(1, k − 1)``.

    Starts at ``k0 = 5`` on every generation (HF's ``num_assistant_tokens`` defaults to 20 and is
    carried across calls; a fixed restart keeps generations reproducible) and is capped at ``k_max``.
    """

    name = "heuristic"

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


class Confidence(Policy):
    """Stop drafting after ``y_i`` when the draft's top probability ``max q_i < tau`` (``y_i`` is kept)."""

    name = "confidence"
    dynamic = True

    def __init__(self, tau: float = 0.4, k_max: int = 20) -> None:
        if not 0.0 <= tau <= 1.0 or k_max < 1:
            raise ValueError(f"Confidence needs tau in [0, 1] and k_max >= 1, got tau={tau}, k_max={k_max}")
        self.tau, self.k_max = tau, k_max

    def k_cap(self) -> int:
        return self.k_max

    def after_propose(self, state: DraftRound) -> Decision:
        top = state.sampling.feature_probs(state.q_logits[state.i - 1]).max()
        return Decision.STOP if float(top) < self.tau else Decision.CONTINUE

    def __repr__(self) -> str:
        return f"Confidence(tau={self.tau}, k_max={self.k_max})"


class Head(Policy):
    """SpecDec++ threshold rule: keep drafting while ``1 − Π_{j≤i} P̂_j ≤ threshold``.

    A ``post`` head scores ``y_i`` from the draft forward that consumed it, so a round that stops
    early costs one draft call more than fixed-K drafting; a ``pre`` head scores it from the state
    that produced ``q_i`` plus features of ``y_i`` and costs no extra call.
    """

    name = "head"
    dynamic = True
    needs_hidden = True

    def __init__(self, head: AcceptanceHead, threshold: float = 0.5, k_min: int = 1, k_max: int = 20) -> None:
        self._init_stop(threshold, k_min, k_max)
        self.head: AcceptanceHead | None = head.eval()
        self.companion = "step" if head.config.companion_features else None

    def _init_stop(self, threshold: float, k_min: int, k_max: int) -> None:
        if not 0.0 <= threshold <= 1.0 or not 1 <= k_min <= k_max:
            raise ValueError(
                f"{type(self).__name__} needs threshold in [0, 1] and 1 <= k_min <= k_max, got {threshold}, "
                f"{k_min}, {k_max}"
            )
        self.threshold, self.k_min, self.k_max = threshold, k_min, k_max
        self._keep_prob = 1.0

    def to(self, device: torch.device) -> Head:
        self.head.to(device)
        return self

    def k_cap(self) -> int:
        return self.k_max

    def start_round(self) -> None:
        self._keep_prob = 1.0

    def _decide(self, state: DraftRound, hidden: Tensor, features: Tensor | None) -> Decision:
        with torch.no_grad():
            accept = float(self.head.predict(hidden.float(), features))
        return self._stop(state, accept)

    def _stop(self, state: DraftRound, accept: float) -> Decision:
        """The stop rule, given the latest candidate's acceptance estimate ``accept``."""
        self._keep_prob *= accept
        stop = state.i >= self.k_min and 1.0 - self._keep_prob > self.threshold
        return Decision.STOP if stop else Decision.CONTINUE

    @property
    def decides_after(self) -> Literal["propose", "feed"]:
        """When the head reads its input: a ``pre`` head after proposing ``y_i``, a ``post`` head after feeding it."""
        return "propose" if self.head.config.timing == "pre" else "feed"

    def after_propose(self, state: DraftRound) -> Decision:
        config = self.head.config
        if config.timing != "pre":
            return Decision.CONTINUE
        i, y = state.i, state.tokens[-1]
        q = state.sampling.feature_probs(state.q_logits[i - 1])
        companion = None
        if config.companion_features:
            indicators = companion_indicators(state.sampling, state.q_logits[i - 1], state.companion_logits[i - 1], y)
            companion = (indicators.x, indicators.y)
        features = head_features(q, y, config.features, companion)
        return self._decide(state, state.hidden[i - 1], features)

    def after_feed(self, state: DraftRound) -> Decision:
        if self.head.config.timing != "post":
            return Decision.CONTINUE
        return self._decide(state, state.hidden[state.i], None)

    def __repr__(self) -> str:
        return (
            f"Head(timing={self.head.config.timing}, threshold={self.threshold}, "
            f"k_min={self.k_min}, k_max={self.k_max})"
        )


class GoodputHead(Head):
    """A head with a stop rule derived from the costs instead of a swept threshold ``h`` (DESIGN §2, goodput stop).

    Drafting ``y_{i+1}`` pays while the expected tokens it adds, ``Π_i·P̂``, exceed the throughput ``λ``
    achieved so far times its marginal cost (:func:`drafting_pays`). In a batch with measured
    ``batch_costs`` the rule is taken for the batch as a whole (:func:`batch_drafting_pays`,
    :func:`batch_opening_pays`; DESIGN §7); without them rows decide as alone.
    """

    name = "head-goodput"

    def __init__(self, head: AcceptanceHead, costs: CostModel, k_min: int = 1, k_max: int = 20,
                 batch_costs: BatchCosts | None = None) -> None:
        super().__init__(head, threshold=1.0, k_min=k_min, k_max=k_max)
        self._init_goodput(costs, batch_costs)

    def _init_goodput(self, costs: CostModel, batch_costs: BatchCosts | None) -> None:
        self.costs = costs
        self.batch_costs = batch_costs
        self._tokens, self._seconds = 0, 0.0
        self._in_batch = False  # decoding inside the batched loop (which stops the rows together)
        #: In a batch: this row's running keep-probability and latest ``P̂`` (read by :func:`batch_drafting_pays`).
        self.outlook: tuple[float, float] = (0.0, 0.0)
        self._first_sum, self._first_count = 0.0, 0
        self._fed_past_stop = False  # this round's post decision stopped after the draft consumed y_i

    def reset(self) -> None:
        self._tokens, self._seconds = 0, 0.0
        self._in_batch = False
        self.outlook = (0.0, 0.0)
        self._first_sum, self._first_count = 0.0, 0
        self._fed_past_stop = False

    def start_round(self) -> None:
        super().start_round()
        self._fed_past_stop = False

    def after_feed(self, state: DraftRound) -> Decision:
        """A ``post`` head decides after the draft has consumed ``y_i``: a stop there leaves that call made."""
        decision = super().after_feed(state)
        self._fed_past_stop = decision is Decision.STOP
        return decision

    @property
    def forecast(self) -> float | None:
        """The mean ``P̂`` of this generation's first candidates so far (None before the first): the forecast of
        the next round's first ``P̂`` before it is drafted (:func:`batch_opening_pays`)."""
        return self._first_sum / self._first_count if self._first_count else None

    def join_batch(self) -> None:
        """Leave the stop to the batch (:class:`BatchGoodput`) for this generation."""
        self._in_batch = True

    def batch_plan(self) -> BatchPlan:
        return BatchGoodput(self.batch_costs) if self.batch_costs is not None else BatchPlan()

    @property
    def throughput(self) -> float:
        """``λ``: tokens per modelled second so far in this generation (``1 / t_t`` before the first round)."""
        return self._tokens / self._seconds if self._seconds > 0 else 1.0 / self.costs.t_target

    def _step_cost(self) -> float:
        """Draft (and companion) seconds per drafted candidate."""
        return self.costs.t_draft + (self.costs.t_companion if self.companion is not None else 0.0)

    def _marginal_cost(self, i: int) -> float:
        shape = self.costs.latency
        return self._step_cost() + self.costs.t_target * float(shape(i + 1) - shape(i))

    def _stop(self, state: DraftRound, accept: float) -> Decision:
        self._keep_prob *= accept
        if state.i == 1:
            self._first_sum, self._first_count = self._first_sum + accept, self._first_count + 1
        if self.batch_costs is not None and self._in_batch:
            self.outlook = (self._keep_prob, accept)
            return Decision.CONTINUE  # the batched loop stops the rows together (batch_drafting_pays)
        stop = state.i >= self.k_min and not drafting_pays(
            [(self._keep_prob, accept)], state.i, self.k_max, self.throughput, self._marginal_cost)
        return Decision.STOP if stop else Decision.CONTINUE

    def end_round(self, drafted: int, verified: int, accepted: int) -> None:
        """Charge the round's calls as the decoder counts them: one draft (and companion) call per candidate,
        plus the call a ``post`` head's stop read (the draft consumed ``y_i`` before deciding)."""
        self._tokens += accepted + 1
        self._seconds += (drafted * self._step_cost() + self._fed_past_stop * self.costs.t_draft
                          + self.costs.t_target * float(self.costs.latency(verified)))

    def __repr__(self) -> str:
        return f"GoodputHead(timing={self.head.config.timing}, k_min={self.k_min}, k_max={self.k_max})"


def drafting_pays(outlooks: list[tuple[float, float]], i: int, k_max: int, throughput: float,
                  step_cost: Callable[[int], float]) -> bool:
    """Whether drafting on from ``i`` to some ``j ≤ k_max`` adds more expected tokens than ``λ`` × its cost.

    ``outlooks``: per drafting row, its keep-probability ``Π_i`` and latest ``P̂``; its candidate ``m``
    after ``i`` is kept with ``Π_i·P̂^m`` (``P̂`` standing in for the unseen ones). ``step_cost(n)``
    is the price of the ``(n+1)``-th drafting step. Looking past the next step matters where
    verification costs are not convex in the length (a CPU's forward often costs the same for 3 and
    for 8 tokens); with costs linear in the length it is the one-step rule.
    """
    gain, cost = 0.0, 0.0
    keeps = [keep for keep, _ in outlooks]
    for n in range(i, k_max):
        keeps = [keep * accept for keep, (_, accept) in zip(keeps, outlooks)]
        gain += sum(keeps)
        cost += step_cost(n)
        if gain >= throughput * cost:
            return True
    return False


def batch_drafting_pays(rows: list[GoodputHead], i: int, batch: int, throughput: float) -> bool:
    """The batch-level stop of :class:`GoodputHead` rows with ``batch_costs`` after ``i`` drafting steps.

    A step costs a draft forward of the ``len(rows)`` drafting rows plus one more verification
    column for all ``batch`` live rows, ``t_v(B, B·(n+1)) − t_v(B, B·n)``; the rows' ``k_min`` is
    honoured (the batch drafts on while ``i`` is below it).
    """
    first = rows[0]
    if i < first.k_min:
        return True
    costs = first.batch_costs

    def step_cost(n: int) -> float:
        return costs.draft_time(len(rows)) + batch * costs.marginal_candidate(batch, n)

    return drafting_pays([row.outlook for row in rows], i, first.k_max, throughput, step_cost)


def batch_opening_pays(rows: list[GoodputHead], batch: int, throughput: float) -> bool:
    """Whether a batch of :class:`GoodputHead` rows with ``batch_costs`` drafts at all this round.

    The first step costs a draft forward of the rows plus the first verification column over the
    target alone's step (``t_v(B, B) − t_t(B, B)``), later steps as in :func:`batch_drafting_pays`;
    each row's candidates are forecast by its :attr:`GoodputHead.forecast`. A row without a forecast
    yet (its first round) makes the batch draft.
    """
    forecasts = [row.forecast for row in rows]
    if any(forecast is None for forecast in forecasts):
        return True
    costs = rows[0].batch_costs

    def step_cost(n: int) -> float:
        return costs.draft_time(len(rows)) + batch * costs.marginal_candidate(batch, n)

    return drafting_pays([(1.0, forecast) for forecast in forecasts], 0, rows[0].k_max, throughput, step_cost)


class BatchGoodput(BatchPlan):
    """The goodput stop of :class:`GoodputHead` rows taken for the batch at measured ``batch_costs`` (DESIGN §7).

    Tracks the batch's modelled throughput ``λ_B`` (tokens per modelled second so far; before the
    first round the target alone's at the batch size), opens a round only where drafting pays
    (:func:`batch_opening_pays`) and stops the rows together (:func:`batch_drafting_pays`).
    """

    def __init__(self, costs: BatchCosts) -> None:
        self.costs = costs
        self.tokens, self.seconds = 0, 0.0
        self.throughput = 0.0  # λ_B at the start of the current round

    def opens_round(self, rows: list[Policy]) -> bool:
        batch = len(rows)
        alone = batch / self.costs.target_time(batch, batch)
        self.throughput = self.tokens / self.seconds if self.seconds > 0 else alone
        heads = cast(list[GoodputHead], rows)  # a batch's rows are copies of one policy (Policy.fresh)
        for head in heads:
            head.join_batch()
        return batch_opening_pays(heads, batch, max(self.throughput, alone))

    def stops_drafting(self, rows: list[Policy], i: int, batch: int, after: Literal["propose", "feed"]) -> bool:
        heads = cast(list[GoodputHead], rows)
        if not heads or heads[0].decides_after != after:
            return False
        return not batch_drafting_pays(heads, i, batch, self.throughput)

    def end_round(self, batch: int, emitted: int, draft_steps: int, verified: int) -> None:
        self.tokens += emitted
        self.seconds += draft_steps * self.costs.draft_time(batch) + self.costs.verify_time(batch, verified)


class SV(Policy):
    """Speculative Verification: draft ``k``, score with the companion, verify a goodput-optimal prefix.

    Candidates beyond the chosen length are discarded unverified. The length is a stopping time
    (DESIGN §1 pitfalls): whether ``y_{L+1}`` is verified uses the full ``α = profile(X, Y)`` of
    ``y_1..y_L`` but only ``X_{L+1}`` for ``y_{L+1}`` (:meth:`SVProfile.verification_length`), so
    lossless rules stay lossless.
    """

    name = "sv"
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
        indicators = companion_indicators(
            state.sampling,
            torch.stack(state.q_logits[:n]),
            torch.stack(state.companion_logits[:n]),
            torch.stack(state.tokens),
        )
        return self.profile.verification_length(indicators.x, indicators.y)

    def batch_verification_lengths(self, states: list[DraftRound]) -> list[int]:
        """Verification lengths of a batch's rows, chosen jointly (:func:`~decode.profile.joint_goodput_lengths`)."""
        alpha, alpha_next = [], []
        for state in states:
            if state.i:
                indicators = companion_indicators(
                    state.sampling,
                    torch.stack(state.q_logits[: state.i]),
                    torch.stack(state.companion_logits[: state.i]),
                    torch.stack(state.tokens),
                )
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

    name = "oracle"
    dynamic = True
    needs_hindsight = True

    def __init__(self, k_max: int | None = None) -> None:
        if k_max is not None and k_max < 1:
            raise ValueError(f"Oracle(k_max) needs k_max >= 1 or None, got {k_max}")
        self.k_max = k_max

    def k_cap(self) -> int:
        return self.k_max if self.k_max is not None else sys.maxsize

    def after_propose(self, state: DraftRound) -> Decision:
        return Decision.DROP if float(state.draws[-1]) >= state.accept_probs[-1] else Decision.CONTINUE

    def __repr__(self) -> str:
        return f"Oracle(k_max={self.k_max})"


class Hindsight:
    """A head policy's stop rule fed each candidate's true acceptance probability instead of ``P̂`` (an analysis
    bound: what a perfectly calibrated head could reach with that stop rule; DESIGN §5).

    It decides once ``y_i`` is proposed (as a ``pre`` head: no extra draft call) and needs no head and no
    hidden state. Stopping on ``p`` and ``q`` alone keeps every rule lossless.
    """

    needs_hidden = False
    needs_hindsight = True
    head = None
    companion = None

    def to(self, device: torch.device) -> Policy:
        return cast(Policy, self)

    def after_propose(self, state: DraftRound) -> Decision:
        return cast(Head, self)._stop(state, state.accept_probs[-1])

    def after_feed(self, state: DraftRound) -> Decision:
        return Decision.CONTINUE


class PerfectHead(Hindsight, Head):
    """:class:`Head`'s threshold stop (``1 − Π a_j > threshold``) on the true acceptance probabilities ``a_j``."""

    name = "perfect"

    def __init__(self, threshold: float = 0.5, k_min: int = 1, k_max: int = 20) -> None:
        self._init_stop(threshold, k_min, k_max)

    def __repr__(self) -> str:
        return f"PerfectHead(threshold={self.threshold}, k_min={self.k_min}, k_max={self.k_max})"


class PerfectGoodput(Hindsight, GoodputHead):
    """:class:`GoodputHead`'s goodput stop on the true acceptance probabilities (batch size 1)."""

    name = "perfect-goodput"

    def __init__(self, costs: CostModel, k_min: int = 1, k_max: int = 20) -> None:
        self._init_stop(1.0, k_min, k_max)
        self._init_goodput(costs, None)

    def __repr__(self) -> str:
        return f"PerfectGoodput(k_min={self.k_min}, k_max={self.k_max})"
