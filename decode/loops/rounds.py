"""One row's round, shared by the batch-1 and the batched loop: draft a candidate, settle a bonus, verify, commit.

The loops differ only in how they feed the models (one row, or a batch of rows in shared caches);
what a row decides and commits is here. The rule decides how many candidates are accepted and which
token the target adds (DESIGN §1); this module turns that into the tokens a row commits (cut at an
end-of-sequence token), the round's statistics, and whether the target's token is a tentative
ensemble bonus still to be checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Generator, Tensor

from decode.policies import Decision, DraftRound, Policy
from decode.rules import Rule, uniform
from decode.sampling import Sampling
from decode.stats import DecodeStats


def draft_candidate(
    rule: Rule,
    policy: Policy,
    state: DraftRound,
    row: Tensor,
    position: int,
    sampling: Sampling,
    generator: Generator,
    eos: frozenset[int],
    hindsight: Tensor | None = None,
) -> Decision:
    """Propose the next candidate from the round's latest ``q`` into ``row[position]`` and ask the policy.

    A dynamic policy is consulted after the sample, and an end-of-sequence candidate stops drafting; a
    static one always continues (its ``k`` bounds it). ``hindsight``: the target's logits at
    ``position`` (a hindsight policy only), from which the candidate's true acceptance probability and
    its verification uniform are recorded in ``state`` (and its acceptance probability before it was drawn;
    DESIGN §5).
    """
    y = rule.propose(state.q_logits[-1], sampling, generator)
    row[position] = y
    state.tokens.append(y)
    if not policy.dynamic:
        return Decision.CONTINUE
    if hindsight is not None:
        p_logits, q_logits = hindsight[None], state.q_logits[-1][None]
        accept = torch.cat([rule.label(p_logits, q_logits, y.view(1), sampling),
                            rule.expected_accept(p_logits, q_logits, sampling)]).tolist()
        state.accept_probs.append(accept[0])
        state.expected_accepts.append(accept[1])
        state.draws.append(uniform((), generator, hindsight))
    decision = policy.after_propose(state)
    if decision is Decision.CONTINUE and eos and int(y) in eos:  # no host sync without EOS ids
        return Decision.STOP
    return decision


def settle_bonus(
    rule: Rule, pending: Tensor, q_logits: Tensor, row: Tensor, position: int, sampling: Sampling,
    generator: Generator,
) -> tuple[bool, int]:
    """Check the tentative bonus at ``row[position]`` against the draft's ``q`` there (one host sync).

    ``pending``: the target's logits the bonus was drawn from. The row keeps the bonus when the rule
    accepts it, else the token the rule draws instead; returns (accepted, the token now at ``position``).
    """
    accepted_t, token_t = rule.settle(pending, q_logits, row[position], sampling, generator)
    row[position] = token_t  # the bonus itself when accepted
    accepted, token = torch.stack([accepted_t.to(token_t.dtype), token_t]).tolist()
    return bool(accepted), token


@dataclass(frozen=True)
class RoundOutcome:
    """What one verified round commits."""

    verified: int  # candidates the target verified
    accepted_by_rule: int  # candidates the rule accepted (before any EOS cut)
    kept: int  # tokens committed: the accepted prefix plus the target's token, cut after an EOS
    from_target: int  # 1 when the target's token is among the committed ones
    finished: bool  # an end-of-sequence token was committed
    token: Tensor  # the target's token, on the models' device (writing it does not sync)

    @property
    def accepted(self) -> int:
        """Committed tokens that were draft candidates."""
        return self.kept - self.from_target


def verify_round(
    rule: Rule,
    p_logits: Tensor,
    state: DraftRound,
    candidates: Tensor,
    sampling: Sampling,
    generator: Generator,
    eos: frozenset[int],
) -> RoundOutcome:
    """Verify ``candidates`` (the round's first ``len(candidates)`` drafts) against ``p_logits``."""
    verify = len(candidates)
    q_logits = (
        torch.stack(state.q_logits[: verify + 1]) if state.q_logits else p_logits.new_empty((0, p_logits.shape[-1]))
    )
    draws = torch.stack(state.draws[:verify]) if state.draws else None  # a hindsight policy drew them
    n_acc_t, token_t = rule.verify(p_logits, q_logits, candidates, sampling, generator, draws)
    n_acc, token, *ys = torch.cat([n_acc_t.view(1), token_t.view(1), candidates]).tolist()
    emitted = ys[:n_acc] + [token]
    kept = next((j + 1 for j, t in enumerate(emitted) if t in eos), len(emitted))
    finished = kept < len(emitted) or emitted[kept - 1] in eos
    return RoundOutcome(verify, n_acc, kept, kept - min(n_acc, kept), finished, token_t)


def record_round(stats: DecodeStats, drafted: int, outcome: RoundOutcome) -> None:
    """Add one round's counts to ``stats``."""
    verify, n_acc = outcome.verified, outcome.accepted_by_rule
    stats.record_round(verify, n_acc)
    stats.drafted += drafted
    stats.accepted += outcome.accepted
    stats.rejected += verify - n_acc
    stats.unverified += drafted - verify + n_acc - outcome.accepted
    stats.target_emitted += outcome.from_target
    stats.generated += outcome.kept


def bonus_pending(rule: Rule, state: DraftRound, outcome: RoundOutcome) -> bool:
    """Whether the target's token is an ensemble bonus the draft must check before it counts."""
    return (bool(outcome.from_target) and rule.tentative_bonus and outcome.accepted_by_rule == outcome.verified
            and len(state.q_logits) <= outcome.verified)
