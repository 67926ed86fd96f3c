"""Acceptance sources: where an estimate-driven policy's ``P̂_i`` comes from, and when it is read (DESIGN §2).

A source gives ``P̂_i`` for the latest candidate; a :class:`~decode.policies.stop_policy.StopPolicy` keeps the running
``Π`` and asks its stop rule (:mod:`decode.policies.stops`). Trained: :class:`HeadEstimate`. In hindsight (a bound,
DESIGN §5): :class:`TrueAcceptance`. Training-free, what the engines estimate acceptance with (DESIGN §2,
"Training-free sources"):

- :class:`DraftConfidence`: the draft's top probability ``max q_i`` (HF's and llama.cpp's confidence);
- :class:`EntropyBound`: AdaEDL's entropy bound ``1 − sqrt(γ·H(q_i))``;
- :class:`VLLMEstimator`: the online logistic vLLM 0.32 released, ``σ(ω·logit(max q_i) + β_i)`` with one slope
  shared by every position, from its cold start, one damped Newton step every 100 rounds (:class:`VLLMLogistic`);
- :class:`OnlineMargin`: this project's online logistic on the draft's top-2 log-probability margin, one intercept
  and slope per position, refitted to convergence on the decoder's own verified rounds (:class:`MarginLogistic`).
"""

from __future__ import annotations

import copy
import hashlib
import math
from typing import ClassVar, Literal

import torch
from torch import Tensor

from decode.draft_round import DraftRound
from decode.head import AcceptanceHead, candidate_log_q, head_features
from decode.head_config import ROUND_FEATURE
from decode.metadata import recorded_k_range
from decode.policies.base import CompanionUse, PolicyInputs, registrar
from decode.profile import companion_indicators
from decode.sampling import Sampling


def draft_top_probability(state: DraftRound) -> float:
    """``max q_i`` of the latest candidate's draft distribution (:meth:`Sampling.feature_probs`)."""
    return float(state.sampling.feature_probs(state.latest.step.q_logits).max())


def draft_entropy(sampling: Sampling, q_logits: Tensor) -> float:
    """``H(q)`` in nats of the draft's confidence-type distribution (:meth:`Sampling.feature_probs`)."""
    q = sampling.feature_probs(q_logits)
    return float(head_features(q, q.argmax(-1), ("entropy",))[..., 0])


def top2_margin(sampling: Sampling, q_logits: Tensor) -> float:
    """``log q(top 1) − log q(top 2)`` of the draft's confidence-type distribution: its top-2 logit margin."""
    top = sampling.feature_probs(q_logits).topk(2, dim=-1).values.clamp_min(1e-30).log()
    return float(top[..., 0] - top[..., 1])


class AcceptanceSource:
    """Where an estimate-driven policy's ``P̂_i`` comes from, and when it is read (DESIGN §2).

    A registered source (:func:`register_source`) makes a policy kind with each stop rule
    (:data:`~decode.policies.stops.STOPS`): ``<name>-<stop>``, or its ``name`` alone under the stop it names.
    """

    #: Its name in policy kinds and tables.
    name: ClassVar[str]
    #: The constructor argument a kind's one parameter sets (AdaEDL's ``gamma``; None: it takes none).
    parameter: ClassVar[str | None] = None
    #: The kind of artifact it is built per (None: none).
    reads: ClassVar[Literal["head"] | None] = None
    #: The stop rule its name alone stands for as a kind (``head`` is ``head-h``; None: none).
    named_stop: ClassVar[str | None] = None
    decides_after: Literal["propose", "feed"] = "propose"
    needs_hidden = False
    needs_hindsight = False
    companion: CompanionUse = None
    #: Whether :meth:`end_round` folds the verified round into an online fit (priced per round: DESIGN §5).
    folds: ClassVar[bool] = False

    @property
    def price_key(self) -> str | None:
        """What the cost model prices its compute by (:class:`~decode.costs.SourcePrice`; None: free, a bound)."""
        return self.name

    @classmethod
    def build(cls, value: float | None, artifact: str | None, inputs: PolicyInputs) -> AcceptanceSource:
        """The source of a kind's flat form: its parameter ``value`` and the ``artifact`` it reads, from ``inputs``."""
        return cls(**({cls.parameter: value} if cls.parameter else {}))

    def k_range(self, inputs: PolicyInputs) -> tuple[int, int]:
        """The drafting range of a stop over this source: the inputs' ``k_min`` and ``k_max``."""
        return inputs.k_min, inputs.k_max

    def estimate(self, state: DraftRound) -> float:
        """``P̂_i`` of the latest candidate ``y_i``."""
        raise NotImplementedError

    def end_round(self, verified: int, accepted: int) -> None:
        """Feedback after verification: ``accepted`` of the ``verified`` candidates were accepted."""

    def reset(self) -> None:
        """Forget what it learned about one request (called at the start of every generation)."""

    def fresh(self) -> AcceptanceSource:
        """The source for one row of a batch (default: this one; a source with per-round state copies it)."""
        return self

    def to(self, device: torch.device) -> None:
        """Move any model it holds to ``device``."""


#: Every acceptance source by name, in registration order (:func:`register_source` adds to it).
SOURCES: dict[str, type[AcceptanceSource]] = {}
#: Class decorator: add an acceptance source to :data:`SOURCES` under its ``name``.
register_source = registrar(SOURCES, "acceptance source")


@register_source
class DraftConfidence(AcceptanceSource):
    """``P̂_i = max q_i``: the draft's top probability, read once ``y_i`` is proposed."""

    name = "confidence"

    def estimate(self, state: DraftRound) -> float:
        return draft_top_probability(state)


@register_source
class EntropyBound(AcceptanceSource):
    """AdaEDL's lower bound on the acceptance probability, ``P̂_i = max(0, 1 − sqrt(γ·H(q_i)))`` (``H`` in nats).

    AdaEDL stops once the bound falls below a threshold it adapts online; here the bound is a source, so the stop is
    any stop rule (a threshold on ``Π`` chosen on dev, or the goodput stop, its kind named ``adaedl``).
    """

    name = "adaedl"
    parameter = "gamma"
    named_stop = "goodput"

    def __init__(self, gamma: float = 1.0) -> None:
        if gamma <= 0:
            raise ValueError(f"EntropyBound needs gamma > 0, got {gamma}")
        self.gamma = gamma

    def estimate(self, state: DraftRound) -> float:
        return max(0.0, 1.0 - math.sqrt(self.gamma * draft_entropy(state.sampling, state.latest.step.q_logits)))


def round_log_probability(state: DraftRound) -> float:
    """``Σ_{j<i} log q_j(y_j)`` over the round's earlier candidates, under the rule's feature transform
    (:data:`~decode.head_config.ROUND_FEATURE`: what a head reads of the round so far)."""
    earlier = state.i - 1
    if not earlier:
        return 0.0
    q = state.sampling.feature_probs(state.q_logits(earlier))
    return float(candidate_log_q(q, state.tokens(earlier)).sum())


def observed_outcomes(verified: int, accepted: int) -> list[tuple[int, bool]]:
    """The candidates a verified round observed, ``(position, accepted)``: the accepted ones and the first rejected
    one; those after it are unobserved (their acceptance is conditional on the prefix's)."""
    return [(i, i <= accepted) for i in range(1, min(verified, accepted + 1) + 1)]


class PeriodicFit:
    """An online fit refitted every ``refit_every`` verified rounds (:meth:`end_round`); :meth:`refit` is its own."""

    def __init__(self, refit_every: int) -> None:
        if refit_every < 1:
            raise ValueError(f"{type(self).__name__} needs refit_every >= 1, got {refit_every}")
        self.refit_every, self.rounds_since_fit = refit_every, 0

    def end_round(self) -> None:
        """Count a verified round; refit every ``refit_every`` rounds."""
        self.rounds_since_fit += 1
        if self.rounds_since_fit >= self.refit_every:
            self.rounds_since_fit = 0
            self.refit()

    def refit(self) -> None:
        """Fit again on what was observed."""
        raise NotImplementedError


class MarginLogistic(PeriodicFit):
    """Per-position logistic regressions ``P̂_i = σ(a_i + b_i·m)`` on the top-2 margin ``m``, fitted online.

    Observations are the decoder's verified candidates: candidate ``i`` of a round is a positive when accepted, the
    first rejected one a negative, and those after it unobserved (their acceptance is conditional on the prefix's).
    Every ``refit_every`` rounds each position with ``min_count`` observations of both outcomes is refitted on all of
    its observations (Newton's method on the log-loss with a small ridge on the slope); the other positions use the
    fit pooled over every position. Before the first fit ``P̂`` is the acceptance rate observed so far, starting at ½
    (the source decides how far to draft from the first round, so it needs an estimate).
    State is kept across generations, as an engine keeps it across requests.
    """

    def __init__(self, refit_every: int = 100, min_count: int = 20, ridge: float = 1e-4) -> None:
        super().__init__(refit_every)
        if min_count < 2 or ridge < 0:
            raise ValueError(f"MarginLogistic needs min_count >= 2 and ridge >= 0, got {min_count}, {ridge}")
        self.min_count, self.ridge = min_count, ridge
        self.observations: dict[int, list[tuple[float, bool]]] = {}
        self.accepted, self.observed = 0, 0
        self.coefficients: dict[int, tuple[float, float]] = {}  # position → (a, b); 0 → the pooled fit

    def predict(self, i: int, margin: float) -> float:
        """``P̂`` of a candidate at position ``i`` with top-2 margin ``margin``."""
        a, b = self.coefficients.get(i, self.coefficients.get(0, (math.nan, 0.0)))
        if math.isnan(a):
            return (self.accepted + 1) / (self.observed + 2)
        return 1.0 / (1.0 + math.exp(-(a + b * margin)))

    def observe(self, i: int, margin: float, accepted: bool) -> None:
        """Record the outcome of a verified candidate at position ``i``."""
        self.observations.setdefault(i, []).append((margin, accepted))
        self.accepted, self.observed = self.accepted + accepted, self.observed + 1

    def refit(self) -> None:
        """Fit every position with enough observations of both outcomes, and the pooled fit."""
        pooled = [obs for column in self.observations.values() for obs in column]
        fitted = {0: pooled} | self.observations
        for i, column in fitted.items():
            if len(column) >= self.min_count and 0 < sum(label for _, label in column) < len(column):
                self.coefficients[i] = fit_logistic(column, self.ridge)


def fit_logistic(observations: list[tuple[float, bool]], ridge: float = 1e-4, steps: int = 50, *,
                 prior: float = 0.0, center: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float]:
    """``(a, b)`` minimising the mean log-loss of ``σ(a + b·m)`` plus ``ridge·b²/2`` (Newton's method, float64).

    ``prior > 0``: the MAP fit under a Gaussian prior centred on ``center`` and worth ``prior`` observations, i.e.
    plus ``prior·‖(a, b) − center‖² / (2n)``, started at ``center`` (:class:`OnlineHead`).
    """
    data = torch.tensor([(1.0, margin) for margin, _ in observations], dtype=torch.float64)
    labels = torch.tensor([float(label) for _, label in observations], dtype=torch.float64)
    n = len(labels)
    penalty = torch.diag(torch.tensor([prior / n, ridge + prior / n], dtype=torch.float64))
    mean = labels.mean().clamp(1e-6, 1 - 1e-6)
    centre = torch.tensor(center if prior > 0 else (0.0, 0.0), dtype=torch.float64)
    weights = centre.clone() if prior > 0 else torch.tensor([math.log(mean / (1 - mean)), 0.0], dtype=torch.float64)
    for _ in range(steps):
        probs = torch.sigmoid(data @ weights)
        gradient = data.T @ (probs - labels) / n + penalty @ (weights - centre)
        hessian = (data.T * (probs * (1 - probs))) @ data / n + penalty + 1e-12 * torch.eye(2, dtype=torch.float64)
        step = torch.linalg.solve(hessian, gradient)
        weights = weights - step
        if float(step.abs().max()) < 1e-10:
            break
    return float(weights[0]), float(weights[1])


@register_source
class OnlineMargin(AcceptanceSource):
    """An online margin logistic: :class:`MarginLogistic` on the draft's top-2 margin, learning from this decoder's
    own verified rounds (no training data). Not what vLLM released (:class:`VLLMEstimator`): two parameters per
    position on another feature, refitted to convergence.

    A batch's rows share one fit (:meth:`fresh`) and each keeps its round's margins.
    """

    name = "margin"
    folds = True
    named_stop = "h"

    def __init__(self, fit: MarginLogistic | None = None) -> None:
        self.fit = fit if fit is not None else MarginLogistic()
        self.margins: dict[int, float] = {}

    def fresh(self) -> OnlineMargin:
        return OnlineMargin(self.fit)

    def estimate(self, state: DraftRound) -> float:
        margin = top2_margin(state.sampling, state.latest.step.q_logits)
        self.margins[state.i] = margin
        return self.fit.predict(state.i, margin)

    def end_round(self, verified: int, accepted: int) -> None:
        for i, outcome in observed_outcomes(verified, accepted):
            if i in self.margins:
                self.fit.observe(i, self.margins[i], outcome)
        self.margins = {}
        self.fit.end_round()


MAX_LOG_ODDS = 40.0  # vLLM's clamp of its feature: a one-hot draft's log-odds are infinite


def top_log_odds(sampling: Sampling, q_logits: Tensor) -> float:
    """``logit(max q) = log(max q / Σ_{z ≠ argmax} q_z)`` of the draft's confidence-type distribution, clamped to
    ``±``:data:`MAX_LOG_ODDS` (vLLM's feature: it scores the distribution, not the token drawn from it)."""
    q = sampling.feature_probs(q_logits).double().reshape(-1)
    top = int(q.argmax())
    rest = float(torch.cat([q[:top], q[top + 1:]]).sum())
    odds = math.log(float(q[top])) - math.log(rest) if rest > 0 else math.inf
    return min(max(odds, -MAX_LOG_ODDS), MAX_LOG_ODDS)


class VLLMLogistic(PeriodicFit):
    """The online logistic vLLM 0.32 released (``OnlineAcceptanceEstimator``): ``P̂_k = σ(ω·f + β_k)`` with ``f``
    the draft's :func:`top_log_odds`, one slope ``ω`` shared by every position and an intercept ``β_k`` per position.

    It starts at ``ω = 0.5, β_k = −0.2``. Each verified round's observed candidates (accepted: 1, the first rejected:
    0) add to Newton-IRLS statistics with the weight and residual of the prediction made when they were drafted; every
    ``refit_every`` rounds one damped Newton step solves ``(XᵀWX + λI)Δθ = Xᵀ(y − p)`` for ``θ = (ω, β)`` (an
    arrowhead system: the slope's row couples every position), damped by ``n / (n + DAMPING)`` (all observations for
    ``ω``, the position's for ``β_k``), a step that would make ``ω`` negative is dropped, and the statistics are
    cleared. State is kept across generations, as the engine keeps it across requests (DESIGN §2).
    """

    INIT_SLOPE, INIT_BIAS = 0.5, -0.2
    REFIT_INTERVAL = 100
    DAMPING = 50.0
    L2 = 1e-3

    def __init__(self, refit_every: int = REFIT_INTERVAL) -> None:
        super().__init__(refit_every)
        self.slope = self.INIT_SLOPE
        self.intercepts: dict[int, float] = {}  # position (1-based) → β; INIT_BIAS where none was fitted
        # position → [Σ w f², Σ w f, Σ w, Σ r f, Σ r, n] since the last refit (w = p(1 − p), r = y − p)
        self.stats: dict[int, list[float]] = {}
        self.refits = 0

    def predict(self, i: int, feature: float) -> float:
        """``P̂`` of a candidate at position ``i`` with feature ``feature``."""
        return 1.0 / (1.0 + math.exp(-(self.slope * feature + self.intercepts.get(i, self.INIT_BIAS))))

    def observe(self, i: int, feature: float, predicted: float, accepted: bool) -> None:
        """Fold one verified candidate at position ``i`` (``predicted``: its ``P̂`` when it was drafted)."""
        w, r = predicted * (1.0 - predicted), float(accepted) - predicted
        row = self.stats.setdefault(i, [0.0] * 6)
        for j, value in enumerate((w * feature * feature, w * feature, w, r * feature, r, 1.0)):
            row[j] += value

    def refit(self) -> None:
        """One damped Newton step on the statistics since the last refit, which it clears."""
        positions = sorted(self.stats)
        if not positions:
            return
        a_k, b_k, c_k, g0_k, g1_k, n_k = (torch.tensor(column, dtype=torch.float64)
                                          for column in zip(*(self.stats[i] for i in positions)))
        c_k = c_k + self.L2
        a, g0, total = float(a_k.sum()) + self.L2, float(g0_k.sum()), float(n_k.sum())
        step_w = (g0 - float((b_k * g1_k / c_k).sum())) / (a - float((b_k * b_k / c_k).sum()))
        step_w *= total / (total + self.DAMPING)
        if math.isnan(step_w) or self.slope + step_w < 0:
            step_w = 0.0
        self.slope += step_w
        step_b = (g1_k - b_k * step_w) / c_k * n_k / (n_k + self.DAMPING)
        for i, step in zip(positions, step_b.tolist(), strict=True):
            self.intercepts[i] = self.intercepts.get(i, self.INIT_BIAS) + (0.0 if math.isnan(step) else step)
        self.stats = {}
        self.refits += 1


@register_source
class VLLMEstimator(AcceptanceSource):
    """vLLM's released acceptance estimator (:class:`VLLMLogistic`), learning from this decoder's own verified
    rounds from its cold start; vLLM trims its drafts by it at the goodput its cost tables give (the kind ``vllm``).

    A batch's rows share one fit (:meth:`fresh`) and each keeps its round's features and predictions; the fit counts
    one row's round as one of vLLM's steps (equal at batch 1, where its estimate runs in the league).
    """

    name = "vllm"
    folds = True
    named_stop = "goodput"

    def __init__(self, fit: VLLMLogistic | None = None) -> None:
        self.fit = fit if fit is not None else VLLMLogistic()
        self.drafted: dict[int, tuple[float, float]] = {}  # position → (feature, P̂ as drafted)

    def fresh(self) -> VLLMEstimator:
        return VLLMEstimator(self.fit)

    def estimate(self, state: DraftRound) -> float:
        feature = top_log_odds(state.sampling, state.latest.step.q_logits)
        predicted = self.fit.predict(state.i, feature)
        self.drafted[state.i] = (feature, predicted)
        return predicted

    def end_round(self, verified: int, accepted: int) -> None:
        for i, outcome in observed_outcomes(verified, accepted):
            if i in self.drafted:
                self.fit.observe(i, *self.drafted[i], outcome)
        self.drafted = {}
        self.fit.end_round()


@register_source
class HeadEstimate(AcceptanceSource):
    """A trained head's ``P̂_i``. A ``pre`` head reads the state that produced ``q_i`` plus features of ``y_i``,
    once ``y_i`` is proposed (no extra draft call); a ``post`` head reads the draft forward that consumed ``y_i``,
    so a round it stops costs one draft call more than fixed-K drafting."""

    name = "head"
    reads = "head"
    named_stop = "h"
    needs_hidden = True

    def __init__(self, head: AcceptanceHead) -> None:
        self.head = head.eval()
        config = repr(head.config).encode()
        self._key = f"{self.name}[{hashlib.sha256(config).hexdigest()[:8]}]"
        self.decides_after = "propose" if head.config.timing == "pre" else "feed"
        self.companion = "step" if head.config.companion_features else None
        self.first_accepted, self.rounds = 0, 0  # the request's rounds and those that accepted their first candidate

    @property
    def price_key(self) -> str:
        """Its name and the head's shape (a short digest of its config: what its forward costs depends on)."""
        return self._key

    @property
    def request_acceptance(self) -> float:
        """The request's running rate of accepted first candidates, ``(a + 1) / (n + 2)`` (``REQUEST_FEATURE``)."""
        return (self.first_accepted + 1) / (self.rounds + 2)

    def reset(self) -> None:
        self.first_accepted, self.rounds = 0, 0

    def fresh(self) -> HeadEstimate:
        """This source for one row of a batch: a copy with its own request history (the head is shared)."""
        source = copy.copy(self)
        source.reset()
        return source

    def end_round(self, verified: int, accepted: int) -> None:
        if verified:
            self.rounds += 1
            self.first_accepted += accepted > 0

    @classmethod
    def build(cls, value: float | None, artifact: str | None, inputs: PolicyInputs) -> HeadEstimate:
        return cls(inputs.heads[str(artifact)])

    def k_range(self, inputs: PolicyInputs) -> tuple[int, int]:
        """The range the head was calibrated with where its metadata records one."""
        return recorded_k_range(self.head.metadata, inputs.k_min, inputs.k_max)

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
        round_log_q = round_log_probability(state) if ROUND_FEATURE in config.features else None
        return candidate.step.hidden, head_features(q, y, config.features, companion, config.depth_of(state.i),
                                                    candidate.step.input_token, self.request_acceptance, round_log_q)

    def predict(self, hidden: Tensor, features: Tensor | None) -> float:
        """``P̂`` from the head's inputs (:meth:`inputs`)."""
        with torch.no_grad():
            return float(self.head.predict(hidden.float(), features))

    def estimate(self, state: DraftRound) -> float:
        return self.predict(*self.inputs(state))


def logit(probability: float, eps: float = 1e-6) -> float:
    """``log(p / (1 − p))`` with ``p`` clamped to ``[eps, 1 − eps]``."""
    p = min(max(probability, eps), 1.0 - eps)
    return math.log(p / (1.0 - p))


@register_source
class OnlineHead(HeadEstimate):
    """A trained head recalibrated online on each request's own rounds (DESIGN §2): ``P̂_i = σ(a + b·ℓ_i)``, ``ℓ_i``
    the head's logit of ``y_i`` and ``(a, b)`` the MAP logistic fit (:func:`fit_logistic`) on the request's verified
    candidates so far, observed as :class:`MarginLogistic` observes them (accepted ones positive, the first rejected
    one negative), under a Gaussian prior centred on the head as exported (``a = 0, b = 1``) worth ``prior``
    observations. Before the request's first verified round it is the head itself; it refits after every round.

    The head ranks, the request's outcomes calibrate: its estimates follow how this request is going.
    """

    name = "head-online"
    folds = True

    #: How many observations the head's own calibration is worth.
    PRIOR = 8.0

    def __init__(self, head: AcceptanceHead, prior: float = PRIOR) -> None:
        super().__init__(head)
        if prior <= 0:
            raise ValueError(f"OnlineHead needs prior > 0, got {prior}")
        self.prior = prior
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.observations: list[tuple[float, bool]] = []
        self.coefficients = (0.0, 1.0)
        self.logits: dict[int, float] = {}

    def estimate(self, state: DraftRound) -> float:
        head_logit = logit(super().estimate(state))
        self.logits[state.i] = head_logit
        a, b = self.coefficients
        return 1.0 / (1.0 + math.exp(-(a + b * head_logit)))

    def end_round(self, verified: int, accepted: int) -> None:
        super().end_round(verified, accepted)
        self.observations += [(self.logits[i], outcome)
                              for i, outcome in observed_outcomes(verified, accepted) if i in self.logits]
        self.logits = {}
        if self.observations:
            self.coefficients = fit_logistic(self.observations, ridge=0.0, prior=self.prior)


@register_source
class TrueAcceptance(AcceptanceSource):
    """Each candidate's true acceptance probability, read in hindsight once it is proposed (an analysis bound: what
    a perfectly calibrated head could reach with a stop rule; DESIGN §5). It needs no head and no hidden state, and
    stopping on ``p`` and ``q`` alone keeps every rule lossless."""

    name = "perfect"
    named_stop = "h"
    needs_hindsight = True

    @property
    def price_key(self) -> None:
        """Free: its reads are hindsight, uncounted as the oracle's are."""
        return None

    def estimate(self, state: DraftRound) -> float:
        return state.latest.hindsight.accept_prob
