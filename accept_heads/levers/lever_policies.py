"""The levers' length policies: a head's stop fed a recalibration or a forecast of its estimate, the rounds it
visits logged, and the pre-draft stop on the truth (a reference). The levers: :mod:`accept_heads.levers`."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from decode.draft_round import Decision, DraftRound
from decode.head import AcceptanceHead, head_features
from decode.policies.sources import HeadEstimate, TrueAcceptance
from decode.policies.stop_policy import StopPolicy
from decode.policies.stops import StopRule

#: Round features of a candidate, in the order of a recalibration's weights.
FEATURES = ("bias", "logit", "position", "log_keep", "previous_accepted", "entropy", "entropy_change")
#: Which features each lever's logistic regression uses (the others keep weight 0).
LEVERS = {"platt": ("bias", "logit"), "decode-time": FEATURES, "pre-draft-linear": FEATURES}
#: Levers that forecast the next candidate's acceptance before it is drafted
#: (fitted to ``VisitedCandidate.next_accept``).
FORECASTS = ("pre-draft", "pre-draft-linear")

@dataclass(frozen=True)
class VisitedCandidate:
    """A candidate the decoder drafted: its round features, its true acceptance, the head's inputs, and the next
    candidate's acceptance probability before it was drawn (None where no next candidate was drafted)."""

    x: np.ndarray
    accept: float
    hidden: torch.Tensor
    features: torch.Tensor | None
    next_accept: float | None = None


@dataclass(frozen=True)
class Recalibration:
    """``σ(w · x)`` over the round features ``x`` (:data:`FEATURES`) of a candidate."""

    lever: str
    weights: tuple[float, ...]

    def __call__(self, x: np.ndarray) -> float:
        return 1.0 / (1.0 + math.exp(-float(np.dot(self.weights, x))))


Forecaster = Recalibration | AcceptanceHead


class LeverPolicy(StopPolicy[HeadEstimate, StopRule]):
    """A head's stop with one lever: each candidate's round features are computed, recorded with its true acceptance
    probability and the next one's (``log``; needs hindsight), and the stop rule is fed the ``recalibration`` of the
    head's estimate instead of the estimate — or, with a ``forecaster``, drafts ``y_{i+1}`` while the rule says the
    forecast ``F̂_{i+1}`` of its acceptance pays (:meth:`~decode.policies.stops.StopRule.next_pays`)."""

    def __init__(self, head: AcceptanceHead, stop: StopRule, recalibration: Recalibration | None = None,
                 log: list | None = None, forecaster: Forecaster | None = None) -> None:
        super().__init__(HeadEstimate(head), stop)
        self.recalibration, self.log, self.forecaster = recalibration, log, forecaster
        self.needs_hindsight = log is not None
        self._last_accepted, self._previous_entropy = 0, 0.0
        self._peeking, self._open_visit = False, False

    def start_round(self) -> None:
        super().start_round()
        self._previous_entropy = 0.0
        self._peeking, self._open_visit = False, False

    def after_propose(self, state: DraftRound) -> Decision:
        if self.log is not None and self._open_visit:  # the previous candidate's visit learns what came next
            self.log[-1] = replace(self.log[-1], next_accept=state.latest.hindsight.expected_accept)
            self._open_visit = False
        if self._peeking:  # drafted only to read that label: withdrawn, its call uncounted
            self._peeking = False
            return Decision.DROP
        return super().after_propose(state)

    def end_round(self, drafted: int, verified: int, accepted: int) -> None:
        super().end_round(drafted, verified, accepted)
        self._last_accepted = accepted

    def estimate(self, state: DraftRound) -> float:
        """The head's ``P̂_i``, its inputs kept for the log and the forecaster."""
        source = self.source
        self._inputs = source.inputs(state)
        return source.predict(*self._inputs)

    def decide(self, state: DraftRound, accept: float) -> Decision:
        hidden, features = self._inputs
        inputs = (hidden.float().cpu(), None if features is None else features.float().cpu())
        q = state.sampling.feature_probs(state.latest.step.q_logits)
        entropy = float(head_features(q, state.latest.token, ("entropy",))[0])  # the pre heads' H(q), nats
        clipped = min(max(accept, 1e-6), 1 - 1e-6)
        x = np.array([1.0, math.log(clipped / (1 - clipped)), state.i, math.log(max(self.keep, 1e-12)),
                      self._last_accepted, entropy, entropy - self._previous_entropy if state.i > 1 else 0.0])
        self._previous_entropy = entropy
        if self.forecaster is not None:
            self.observe(accept)
            pays = self.stop.next_pays(state.i, self.keep, self._forecast(x, inputs))
            decision = Decision.STOP if state.i >= self.k_min and not pays else Decision.CONTINUE
        else:
            decision = super().decide(state, self.recalibration(x) if self.recalibration else accept)
        if self.log is not None:
            self.log.append(VisitedCandidate(x, state.latest.hindsight.accept_prob, *inputs))
            self._open_visit = state.i < self.k_max
            if decision is Decision.STOP and self._open_visit:  # draft one more to read its label (withdrawn)
                self._peeking, decision = True, Decision.CONTINUE
        return decision

    def _forecast(self, x: np.ndarray, inputs: tuple[torch.Tensor, torch.Tensor | None]) -> float:
        """``F̂_{i+1}``: the forecaster's acceptance of the next, undrafted candidate."""
        if isinstance(self.forecaster, Recalibration):
            return self.forecaster(x)
        with torch.no_grad():
            return float(self.forecaster.predict(*inputs))


class PerfectPreDraft(StopPolicy[TrueAcceptance, StopRule]):
    """The forecast stop fed the truth (a reference): whether ``y_i`` is drafted is decided on its true acceptance
    probability before its draw (read in hindsight from the drafted candidate, which is withdrawn with its draft
    call uncounted when the stop says it should not have been, as the realised oracle's; DESIGN §5), and the drafted
    candidates' true acceptance enters ``Π``. The decision never reads ``y_i`` or a verification draw, so every
    rule stays lossless. The head's companion use (and its price in a goodput stop) is kept."""

    def __init__(self, head: AcceptanceHead, stop: StopRule) -> None:
        super().__init__(TrueAcceptance(), stop)
        self.companion = HeadEstimate(head).companion

    def after_propose(self, state: DraftRound) -> Decision:
        hindsight = state.latest.hindsight
        if state.i > self.k_min and not self.stop.next_pays(state.i - 1, self.keep, hindsight.expected_accept):
            return Decision.DROP
        self.observe(hindsight.accept_prob)
        return Decision.CONTINUE
