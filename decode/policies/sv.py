"""Speculative Verification's length policy and its batch scheduling (DESIGN §3)."""

from __future__ import annotations

import torch

from decode.draft_round import DraftRound
from decode.policies.base import BatchPlan, Policy
from decode.profile import BatchLatency, SVProfile, companion_indicators, joint_goodput_lengths


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

    def batch_plan(self) -> JointVerification:
        return JointVerification(self)

    def __repr__(self) -> str:
        return f"SV(k={self.k})"


class JointVerification(BatchPlan[SV]):
    """SV's batch scheduling: the rows' verification lengths chosen jointly (DESIGN §3)."""

    def __init__(self, policy: SV) -> None:
        self.policy = policy

    def verification_lengths(self, rows: list[SV], states: list[DraftRound]) -> list[int]:
        return self.policy.batch_verification_lengths(states)
