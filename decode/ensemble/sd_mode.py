"""The ensemble's ``sd`` mode in the round loop: ``models[0]`` drafts, the other members verify together.

:class:`MemberEnsemble` is the verification rule of ``r = E(l_1, …, l_n)`` with the proposer among the members
(:attr:`Rule.member_draft`): each proposal ``y ~ q`` is accepted with probability ``min(1, r(y)/q(y))``, drawn
one candidate at a time, else replaced by a sample of ``norm(max(0, r − q))``; after a fully accepted round the
proposer's next forward completes ``r`` and the token is drawn from it (DESIGN §4). :class:`Members` feeds the
other members as the loop's target: their logits stacked ``[keep, n − 1, V]``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Generator, Tensor

from decode.ensemble_fn import EnsembleFn
from decode.loops.runner import ModelRunner
from decode.rules import Rule, sample, uniform
from decode.sampling import Sampling


class MemberEnsemble(Rule):
    """Verification against ``r = fn(q, p_2, …, p_n)``; ``p_logits``: the other members' logits ``[..., n − 1, V]``.

    Not a registered rule: collection labels the two-model :class:`~decode.rules.Ensemble`, which this equals for
    two members up to when the bonus is drawn (there a tentative ``b ~ p``, here ``r`` once the proposer has scored).
    """

    name: ClassVar[str] = "member-ensemble"
    lossless = True
    member_draft = True

    def __init__(self, fn: EnsembleFn) -> None:
        self.fn = fn

    def __repr__(self) -> str:
        return f"MemberEnsemble({self.fn!r})"

    def verifier_probs(self, p_logits: Tensor, q_logits: Tensor, sampling: Sampling, p: Tensor | None = None) -> Tensor:
        """``r`` at one position from the proposer's ``q_logits [V]`` and the members' ``p_logits [n − 1, V]``."""
        return self.fn.probs(torch.cat([q_logits[None], p_logits]), sampling)

    def verify(
        self, p_logits: Tensor, q_logits: Tensor, y: Tensor, sampling: Sampling, generator: Generator | None,
        draws: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Verify ``y[L]`` one candidate at a time (a rejection stops the draws); the token after a full acceptance
        is drawn here only where the proposer reached that position (``q_logits`` has ``L + 1`` rows), else it is
        None: the loop draws it with :meth:`complete` once the proposer has scored it, or not at all where the
        members scored no position past the candidates (``p_logits`` has ``L`` rows)."""
        for j in range(y.shape[0]):
            r = self.verifier_probs(p_logits[j], q_logits[j], sampling).unsqueeze(0)
            q = sampling.probs(q_logits[j]).unsqueeze(0)
            u = uniform((), generator, r) if draws is None else draws[j]
            if float(u) >= float(self.accept_probs(r, q, y[j: j + 1])):
                return torch.tensor(j), sample(self.reject_probs(r, q)[0], generator)
        n = y.shape[0]
        if p_logits.shape[0] > n and q_logits.shape[0] > n:
            return torch.tensor(n), self.complete(p_logits[n], q_logits[n], sampling, generator)
        return torch.tensor(n), None


class Members:
    """The members after the proposer behind the round loop's runner interface, one row: their logits stacked."""

    rows = (0,)

    def __init__(self, runners: list[ModelRunner]) -> None:
        self.runners = runners
        self.scored = 0  # positions each member scored

    @property
    def calls(self) -> int:
        return self.runners[0].calls

    @property
    def row_calls(self) -> list[int]:
        return [self.calls]

    def feed(self, tokens: Tensor, ends: dict[int, int], keep: int) -> dict[int, Tensor]:
        self.scored += keep
        return {0: torch.stack([runner.feed(tokens, ends[0], keep) for runner in self.runners], dim=1)}

    def hidden_of(self, row: int) -> Tensor | None:
        return None

    def rollback(self, lengths: dict[int, int], rows: list[int] | None = None) -> None:
        if 0 in lengths:
            for runner in self.runners:
                runner.rollback(lengths[0])

    def uncount_last_call(self, row: int) -> None:
        raise RuntimeError("the ensemble decoder charges every member forward")

    def close(self) -> None:
        """Close every member's runner (a compiled one gives its cache back)."""
        for runner in self.runners:
            runner.close()
