"""What a round has drafted so far, as typed records: the draft's steps and the candidates drawn from them.

The loop (:class:`decode.loops.round_loop.RoundLoop`) fills a :class:`DraftRound` in place and the length
policies read it (:mod:`decode.policies`). A :class:`DraftStep` is the draft's output at one position (what the
next candidate is drawn from); a :class:`Candidate` is a drawn token with the step it came from. So a ``pre``
head for ``y_i`` reads ``candidates[i-1].step.hidden`` (the forward that produced ``q_i``) and a ``post`` head
reads :attr:`DraftRound.next`'s (the forward that consumed ``y_i``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch
from torch import Tensor

from decode.sampling import Sampling


class Decision(enum.Enum):
    """Outcome of a per-step policy check."""

    CONTINUE = "continue"
    STOP = "stop"  # keep y_i, stop drafting
    DROP = "drop"  # stop drafting, withdraw y_i and uncharge the draft call that produced q_i (hindsight policies:
    # the realised oracle, and the analysis levers that draft a candidate only to read its label)


@dataclass(frozen=True)
class DraftStep:
    """The draft's output at one position."""

    q_logits: Tensor  # [V] the draft's logits there (q)
    hidden: Tensor | None = None  # [H] the final hidden state of that forward; captured only when a policy reads it
    input_token: Tensor | None = None  # 0-d: the token that forward consumed (captured with ``hidden``)


@dataclass(frozen=True)
class Hindsight:
    """A candidate's fate read from an uncounted target forward (analysis bounds only; DESIGN §5)."""

    accept_prob: float  # its true acceptance probability under the rule
    expected_accept: float  # the acceptance probability of a candidate at its position, before it was drawn
    draw: Tensor  # 0-d: the uniform its verification will use, drawn with it


@dataclass
class Candidate:
    """A drafted token ``y_i`` and what it was drawn from."""

    token: Tensor  # 0-d, on the models' device
    step: DraftStep  # q_i: the draft's output ``y_i`` was drawn from
    companion_logits: Tensor | None = None  # [V] c_i, the companion's logits at y_i's position (when one scores it)
    hindsight: Hindsight | None = None


@dataclass
class DraftRound:
    """Everything drafted so far in the current round.

    ``next``: the draft's output after the latest candidate (before the first: ``q_1``), or None where the draft
    has not consumed the latest candidate. Withdrawing a candidate gives its step back to ``next``.
    """

    sampling: Sampling
    candidates: list[Candidate] = field(default_factory=list)
    next: DraftStep | None = None

    @property
    def i(self) -> int:
        """Index (1-based) of the latest candidate."""
        return len(self.candidates)

    @property
    def latest(self) -> Candidate:
        """The latest candidate ``y_i``."""
        return self.candidates[-1]

    def draw(self, token: Tensor, companion_logits: Tensor | None = None, hindsight: Hindsight | None = None) -> None:
        """Add ``token``, drawn from :attr:`next`, as the next candidate."""
        assert self.next is not None, "a candidate is drawn from the draft's latest step"
        self.candidates.append(Candidate(token, self.next, companion_logits, hindsight))
        self.next = None

    def withdraw(self) -> None:
        """Take back the latest candidate; its step becomes :attr:`next` again."""
        self.next = self.candidates.pop().step

    def reached(self, n: int) -> bool:
        """Whether the draft has produced ``q`` at the position after the first ``n`` candidates."""
        return self.i > n or (self.i == n and self.next is not None)

    def tokens(self, n: int | None = None) -> Tensor:
        """The first ``n`` candidates (all by default) ``[n]``."""
        return torch.stack([c.token for c in self.candidates[:n]])

    def q_logits(self, n: int | None = None) -> Tensor:
        """The draft's logits each of the first ``n`` candidates was drawn from ``[n, V]``."""
        return torch.stack([c.step.q_logits for c in self.candidates[:n]])

    def companion_logits(self) -> Tensor:
        """The companion's logits at each candidate ``[i, V]``."""
        return torch.stack([c.companion_logits for c in self.candidates])

    def verified_q(self, n: int) -> Tensor | None:
        """``q`` of the first ``n`` candidates and of the position after them when the draft has reached it
        ``[n or n + 1, V]`` (what :meth:`Rule.verify` takes); None when nothing was drafted."""
        steps = [c.step for c in self.candidates[: n + 1]]
        if len(steps) == n and self.next is not None:
            steps.append(self.next)
        return torch.stack([s.q_logits for s in steps]) if steps else None

    def draws(self, n: int) -> Tensor | None:
        """The verification uniforms a hindsight policy drew with the first ``n`` candidates ``[n]`` (else None)."""
        if n == 0 or not self.candidates or self.candidates[0].hindsight is None:
            return None
        return torch.stack([c.hindsight.draw for c in self.candidates[:n]])
