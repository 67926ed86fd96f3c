"""Training-free acceptance sources: the online margin logistic's fit and feedback, vLLM's released estimator, the
entropy bound and SVIP."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from decode.draft_round import Decision, DraftRound, DraftStep
from decode.policies.schedules import SVIP, RefitConfidence, roc_threshold
from decode.policies.sources import (
    DraftConfidence,
    EntropyBound,
    MarginLogistic,
    OnlineHead,
    OnlineMargin,
    VLLMEstimator,
    VLLMLogistic,
    draft_entropy,
    fit_logistic,
    logit,
    top2_margin,
    top_log_odds,
)
from decode.policies.stop_policy import StopPolicy
from decode.policies.stops import Threshold
from decode.sampling import Sampling
from tests.helpers.policy_specs import policy_inputs


def sample(frequencies: dict[float, tuple[int, int]]) -> list[tuple[float, bool]]:
    """Observations at each margin: ``(positives, negatives)``."""
    return [(m, label) for m, (pos, neg) in frequencies.items() for label in [True] * pos + [False] * neg]


def test_with_two_margins_the_fit_is_the_closed_form_logistic_regression():
    """With two distinct margins the logistic MLE reproduces each margin's acceptance frequency exactly (two
    parameters, two cells), so ``a`` and ``b`` have a closed form in the two log-odds."""
    observations = sample({0.5: (6, 14), 2.0: (24, 6)})
    a, b = fit_logistic(observations, ridge=0.0)
    logit = [math.log(f / (1 - f)) for f in (6 / 20, 24 / 30)]
    expected_b = (logit[1] - logit[0]) / 1.5
    assert b == pytest.approx(expected_b, abs=1e-8) and a == pytest.approx(logit[0] - 0.5 * expected_b, abs=1e-8)


def test_with_three_margins_the_fit_solves_the_score_equations_and_is_not_the_cell_frequencies():
    """Non-monotone frequencies at three margins: no logistic reproduces them (a negative control on the closed
    form above), and the fit satisfies the MLE's score equations Σ(p − y) = Σ(p − y)·m = 0."""
    observations = sample({0.0: (5, 15), 1.0: (18, 2), 3.0: (10, 10)})
    a, b = fit_logistic(observations, ridge=0.0)
    residual = [(1 / (1 + math.exp(-(a + b * m))) - y, m) for m, y in observations]
    assert abs(sum(r for r, _ in residual)) < 1e-8 and abs(sum(r * m for r, m in residual)) < 1e-8
    fitted = {m: 1 / (1 + math.exp(-(a + b * m))) for m in (0.0, 1.0, 3.0)}
    assert abs(fitted[1.0] - 0.9) > 0.1


def test_before_its_first_fit_the_estimate_is_the_observed_rate_and_positions_without_both_outcomes_pool():
    fit = MarginLogistic(refit_every=3, min_count=4)
    assert fit.predict(1, 5.0) == 0.5
    for margin, accepted in [(2.0, True), (0.1, False), (1.5, True)]:
        fit.observe(1, margin, accepted)
    fit.observe(2, 0.3, False)
    assert fit.predict(2, 0.0) == pytest.approx(3 / 6)  # (2 accepted + 1) / (4 observed + 2)
    for _ in range(3):
        fit.end_round()
    assert set(fit.coefficients) == {0}  # position 1 has 3 < min_count observations, position 2 one outcome
    assert fit.predict(1, 2.0) == fit.predict(7, 2.0) > fit.predict(1, 0.1)  # the pooled fit, rising with margin


def round_with(margins: list[float], sampling: Sampling) -> DraftRound:
    """A round whose candidates were drawn from two-token logits with these top-2 margins."""
    state = DraftRound(sampling)
    for margin in margins:
        state.next = DraftStep(torch.tensor([margin, 0.0, -30.0]))
        state.draw(torch.tensor(0))
    return state


def test_a_round_teaches_its_verified_candidates_up_to_the_first_rejection():
    source = OnlineMargin(MarginLogistic(refit_every=1000))
    sampling = Sampling()
    state = DraftRound(sampling)
    for margin in (3.0, 2.0, 1.0, 0.5):
        state.next = DraftStep(torch.tensor([margin, 0.0, -30.0]))
        state.draw(torch.tensor(0))
        source.estimate(state)
    source.end_round(verified=4, accepted=2)
    observed = {i: [(round(m, 6), y) for m, y in column] for i, column in source.fit.observations.items()}
    assert observed == {1: [(3.0, True)], 2: [(2.0, True)], 3: [(1.0, False)]}  # the 4th candidate is unobserved
    assert source.margins == {} and source.fit.rounds_since_fit == 1


def test_a_batchs_rows_share_one_fit_and_keep_their_own_round():
    policy = StopPolicy(OnlineMargin(MarginLogistic(refit_every=1)), Threshold(0.5))
    rows = [policy.fresh(), policy.fresh()]
    assert rows[0].source is not rows[1].source and rows[0].source.fit is rows[1].source.fit is policy.source.fit
    rows[0].source.estimate(round_with([2.0], Sampling()))
    assert rows[1].source.margins == {}
    rows[0].end_round(1, 1, 1)
    assert policy.source.fit.observations == {1: [(pytest.approx(2.0), True)]}


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


#: A hand-made batch for vLLM's estimator: (position, feature, accepted).
VLLM_BATCH = [(1, 2.0, True), (2, 0.0, False), (1, 1.0, False)]


def test_vllms_estimator_starts_cold_at_its_released_coefficients():
    logits = torch.tensor([2.0, 0.0, -30.0])
    assert top_log_odds(Sampling(), logits) == pytest.approx(2.0, abs=1e-6)  # log(e² / (1 + e⁻³⁰)), float32 q
    assert top_log_odds(Sampling(), torch.tensor([50.0, 0.0])) == 40.0  # clamped, as vLLM clamps it
    source = VLLMEstimator()
    assert source.estimate(round_with([2.0], Sampling())) == pytest.approx(sigmoid(0.5 * 2.0 - 0.2))
    assert source.fit.predict(5, 0.0) == pytest.approx(sigmoid(-0.2))  # every position starts at β = −0.2


def _refitted(batch: list[tuple[int, float, bool]], damping: float | None = None) -> VLLMLogistic:
    fit = VLLMLogistic(refit_every=2)
    if damping is not None:
        fit.DAMPING = damping
    for i, feature, accepted in batch:
        fit.observe(i, feature, fit.predict(i, feature), accepted)
    fit.end_round()
    assert fit.refits == 0  # it refits every refit_every rounds, not before
    fit.end_round()
    assert fit.refits == 1 and fit.stats == {}
    return fit


def test_one_newton_refit_of_vllms_estimator_equals_the_hand_computed_step():
    # by hand: p = σ(0.5 f − 0.2) at each observation, w = p(1 − p), r = y − p, λ = 10⁻³
    p = [sigmoid(0.5 * f - 0.2) for _, f, _ in VLLM_BATCH]
    w = [q * (1 - q) for q in p]
    r = [float(y) - q for (_, _, y), q in zip(VLLM_BATCH, p)]
    a = w[0] * 4.0 + w[2] * 1.0 + 1e-3  # Σ w f² over every position, plus λ
    b1, c1, g11 = w[0] * 2.0 + w[2] * 1.0, w[0] + w[2] + 1e-3, r[0] + r[2]  # position 1
    b2, c2, g12 = 0.0, w[1] + 1e-3, r[1]  # position 2 (f = 0)
    g0 = r[0] * 2.0 + r[2] * 1.0
    step_w = (g0 - b1 * g11 / c1 - b2 * g12 / c2) / (a - b1 * b1 / c1 - b2 * b2 / c2)
    damped_w = step_w * 3 / (3 + 50)  # three observations in all
    fit = _refitted(VLLM_BATCH)
    assert fit.slope == pytest.approx(0.5 + damped_w, rel=1e-12)
    assert fit.intercepts[1] == pytest.approx(-0.2 + (g11 - b1 * damped_w) / c1 * 2 / 52, rel=1e-12)
    assert fit.intercepts[2] == pytest.approx(-0.2 + (g12 - b2 * damped_w) / c2 * 1 / 51, rel=1e-12)
    # undamped, the arrowhead elimination is the full Newton system's solution (an independent solve)
    undamped = _refitted(VLLM_BATCH, damping=0.0)
    design = np.array([[f, i == 1, i == 2] for i, f, _ in VLLM_BATCH], dtype=float)
    hessian = design.T @ np.diag(w) @ design + 1e-3 * np.eye(3)
    expected = np.array([0.5, -0.2, -0.2]) + np.linalg.solve(hessian, design.T @ np.array(r))
    assert [undamped.slope, undamped.intercepts[1], undamped.intercepts[2]] == pytest.approx(expected.tolist())
    # negative control: the other labels move the coefficients elsewhere
    flipped = _refitted([(i, f, not y) for i, f, y in VLLM_BATCH])
    assert flipped.slope != pytest.approx(fit.slope) and flipped.intercepts[1] != pytest.approx(fit.intercepts[1])


def test_a_refit_that_would_make_vllms_slope_negative_keeps_the_slope():
    fit = _refitted([(1, 3.0, False)] * 30 + [(1, -3.0, True)] * 30)  # acceptance falling with confidence
    assert fit.slope == 0.5 and fit.intercepts[1] != -0.2  # the intercept still learns


def test_vllms_estimator_learns_from_the_observed_candidates_and_shares_its_fit_along_a_batch():
    source = VLLMEstimator(VLLMLogistic(refit_every=1000))
    rows = [source.fresh(), source.fresh()]
    assert rows[0].fit is rows[1].fit is source.fit
    state = DraftRound(Sampling())
    for margin in (3.0, 2.0, 1.0, 0.5):
        state.next = DraftStep(torch.tensor([margin, 0.0, -30.0]))
        state.draw(torch.tensor(0))
        rows[0].estimate(state)
    assert rows[1].drafted == {}
    rows[0].end_round(verified=4, accepted=2)
    assert {i: round(row[5]) for i, row in source.fit.stats.items()} == {1: 1, 2: 1, 3: 1}  # the 4th unobserved
    assert source.fit.rounds_since_fit == 1 and rows[0].drafted == {}


def test_margin_entropy_and_confidence_read_the_drafts_transformed_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0])
    probs = logits.softmax(-1)
    assert top2_margin(Sampling(), logits) == pytest.approx(1.0, abs=1e-6)
    assert top2_margin(Sampling(temperature=0.5), logits) == pytest.approx(2.0, abs=1e-5)
    assert draft_entropy(Sampling(), logits) == pytest.approx(float(-(probs * probs.log()).sum()), abs=1e-6)
    state = round_with([1.0], Sampling())
    q = torch.tensor([1.0, 0.0, -30.0]).softmax(-1)
    assert DraftConfidence().estimate(state) == pytest.approx(float(q.max()), abs=1e-6)
    entropy = float(-(q * q.log()).sum())
    assert EntropyBound(0.5).estimate(state) == pytest.approx(1 - math.sqrt(0.5 * entropy), abs=1e-6)
    assert EntropyBound(100.0).estimate(state) == 0.0  # clipped at zero


def test_the_refitted_threshold_minimises_transformers_roc_cost_over_every_candidate_threshold():
    """Against a brute-force scan of the cost FPR + 3·FNR at every observed probability (and +∞); a negative
    control: without a rejection there is nothing to refit."""
    rng = np.random.default_rng(0)
    probs = rng.random(200).round(2)  # ties
    matches = (rng.random(200) < probs).astype(float)
    tau = roc_threshold(probs, matches)

    def cost(t: float) -> float:
        predicted = probs >= t
        return (predicted & (matches == 0)).sum() / (matches == 0).sum() + 3 * (
            (~predicted) & (matches == 1)).sum() / matches.sum()

    candidates = [np.inf, *np.unique(probs)]
    best = min(cost(t) for t in candidates)
    assert cost(tau) == pytest.approx(best) and tau == max(t for t in candidates if cost(t) == pytest.approx(best))
    assert roc_threshold(probs, np.ones(200)) is None


def test_refit_confidence_learns_its_threshold_from_the_verified_candidates_and_stops_below_it():
    policy = RefitConfidence(tau=0.4, k_max=8)
    rows = [policy.fresh(), policy.fresh()]
    assert rows[0].fit is rows[1].fit is policy.fit  # a batch's rows share the fit
    state = round_with([3.0, 0.1], Sampling())  # q(y_1) high, q(y_2) near ½
    row = rows[0]
    row.start_round()
    row.after_propose(DraftRound(Sampling(), state.candidates[:1]))
    assert row.after_propose(state) is Decision.CONTINUE  # q(y_2) ≈ 0.52 ≥ 0.4
    row.end_round(2, 2, 1)  # y_1 accepted, y_2 rejected
    assert policy.fit.matches == [1, 0] and 0.52 < policy.fit.tau <= 0.96
    row.start_round()
    assert row.after_propose(state) is Decision.STOP and row.round_estimates() == [pytest.approx(0.525, abs=0.01)]


def test_svip_stops_once_the_square_root_of_the_entropy_exceeds_h():
    state = round_with([0.2], Sampling())  # near-uniform over two tokens: H ≈ ln 2, sqrt ≈ 0.83
    assert SVIP(h=0.8).after_propose(state) is Decision.STOP
    assert SVIP(h=0.9).after_propose(state) is Decision.CONTINUE
    with pytest.raises(ValueError, match="h >= 0"):
        SVIP(h=-1.0)


class ScriptedHead(OnlineHead):
    """:class:`OnlineHead` over a head whose estimate of each candidate is scripted (``state.p``)."""

    def inputs(self, state):
        return state.p, None

    def predict(self, hidden, features):
        return hidden


class Candidate:
    def __init__(self, i: int, p: float) -> None:
        self.i, self.p = i, p


def play(source: OnlineHead, rounds: list[tuple[list[float], int, int]]) -> None:
    """Rounds of ``(head estimates of candidates 1..k, verified, accepted)``."""
    for estimates, verified, accepted in rounds:
        for i, p in enumerate(estimates, 1):
            source.estimate(Candidate(i, p))
        source.end_round(verified, accepted)


def test_the_online_head_is_the_head_before_any_round_and_again_after_a_reset():
    source = ScriptedHead(policy_inputs().heads["pre"])
    assert source.estimate(Candidate(1, 0.3)) == pytest.approx(0.3)
    play(source, [([0.9, 0.9, 0.9], 3, 0)] * 5)  # a head far too confident on this request
    assert source.estimate(Candidate(1, 0.9)) < 0.6
    source.reset()
    assert source.estimate(Candidate(1, 0.9)) == pytest.approx(0.9)
    assert source.fresh().estimate(Candidate(1, 0.7)) == pytest.approx(0.7)


def test_the_online_head_observes_as_the_margin_logistic_and_with_a_weak_prior_is_the_plain_fit():
    """Two head logits with their acceptance frequencies: with a vanishing prior the fit is the closed-form MLE
    (the plain logistic regression), observed from rounds as the margin logistic observes them (accepted
    candidates positive, the first rejected one negative, later ones unobserved)."""
    source = ScriptedHead(policy_inputs().heads["pre"], prior=1e-9)
    # candidate 1 at estimate 0.4, candidate 2 at 0.8: 20 rounds, 6 accept candidate 1 and 5 of those candidate 2
    rounds = [([0.4, 0.8], 2, 2)] * 5 + [([0.4, 0.8], 2, 1)] + [([0.4, 0.8], 2, 0)] * 14
    play(source, rounds)
    observations = [(logit(0.4), True)] * 6 + [(logit(0.4), False)] * 14 + [(logit(0.8), True)] * 5 + [
        (logit(0.8), False)]
    assert sorted(source.observations) == sorted(observations)
    a, b = fit_logistic(observations, ridge=0.0)
    assert source.coefficients == pytest.approx((a, b), abs=1e-6)
    assert source.estimate(Candidate(1, 0.4)) == pytest.approx(6 / 20, abs=1e-6)
    assert source.estimate(Candidate(2, 0.8)) == pytest.approx(5 / 6, abs=1e-6)


def test_the_online_head_learns_that_an_uninformative_head_says_nothing_on_this_request():
    """Negative control: outcomes independent of the head's estimate at one rate; the refit flattens the slope and
    both estimates move to the rate the request shows."""
    source = ScriptedHead(policy_inputs().heads["pre"])
    play(source, [([0.2], 1, 1), ([0.2], 1, 0), ([0.9], 1, 1), ([0.9], 1, 0)] * 50)
    _, b = source.coefficients
    assert abs(b) < 0.1
    for p in (0.2, 0.9):
        assert source.estimate(Candidate(1, p)) == pytest.approx(0.5, abs=0.05)
