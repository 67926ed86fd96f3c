"""The speculative round, written once: draft → policy → verify → accept → roll back, for one row or a batch.

:class:`RoundLoop` decodes the rows of a token buffer, each as :meth:`SpeculativeDecoder.generate` would decode
it alone: its own copy of the length policy, its own ``torch.Generator`` drawn in the same order, its own EOS
stop, budget and :class:`~decode.stats.DecodeStats`. What rows share is the forwards: one draft forward per
drafting step for the rows still drafting, one target forward per round verifying every row's candidates, and
(ensemble rules) one draft forward settling the tentative bonus tokens. The decisions rows take together are
the policy's :class:`~decode.policies.BatchPlan` (DESIGN §7); a row's length, never its tokens' distribution,
may depend on the other rows. How the models are fed is the runners' business (:class:`Runner`): one row in its
own cache (:class:`~decode.loops.runner.OneRow`) or a batch in shared caches
(:class:`~decode.loops.batch_cache.BatchRunner`). The rule decides how many candidates are accepted and which
token the target adds (DESIGN §1); verification reads every row's result in one transfer.

Three ways the target's token after a fully accepted round is settled, by the rule:

* drawn from the target's distribution (or ``v`` where the draft already reached that position);
* ``tentative_bonus`` (two-model ensembles): drawn from ``p`` and checked against the draft's ``q`` first thing in
  the next round (:meth:`Rule.settle`);
* ``member_draft`` (the n-model ensemble of :class:`decode.EnsembleDecoder`'s ``sd`` mode, whose proposer is a
  member): ``v`` needs the draft's logits there, so the draft is fed first and the token drawn from ``v`` then
  (:meth:`Rule.complete`). Such a rule drafts at least one candidate (the draft is called anyway), stops drafting
  at an end-of-sequence candidate under any policy and scores no position past it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Generator, Tensor

from decode.draft_round import Candidate, Decision, DraftRound, DraftStep, Hindsight
from decode.loops.emit import Emitter
from decode.policies.base import BatchPlan, Policy
from decode.rules import Rule, uniform
from decode.sampling import Sampling
from decode.stats import DecodeStats


class Runner(Protocol):
    """One model's forwards for the rows of a token buffer, with its KV cache (rows in cache order: ``rows``)."""

    rows: list[int] | tuple[int, ...]
    calls: int  # forwards charged to the cost model
    row_calls: list[int]  # per buffer row: forwards that fed it at least one token

    def feed(self, tokens: Tensor, ends: dict[int, int], keep: int) -> dict[int, Tensor]:
        """Feed each row in ``ends`` its unseen tokens up to ``ends[row]``; float logits ``[keep, V]`` per row."""
        ...

    def hidden_of(self, row: int) -> Tensor | None:
        """Final hidden states ``[keep, H]`` of ``row`` in the latest forward (when captured)."""
        ...

    def rollback(self, lengths: dict[int, int], rows: list[int] | None = None) -> None:
        """Keep the first ``lengths[row]`` tokens of each row; ``rows``: keep only these rows in the cache."""
        ...

    def uncount_last_call(self, row: int) -> None:
        """Stop charging ``row`` for the latest forward that fed it (it served as hindsight)."""
        ...


class DraftRunner(Runner, Protocol):
    """The draft's :class:`Runner`, which also says whether a row can draft yet."""

    def ready(self, row: int) -> bool:
        """Whether ``row`` can draft this round (e.g. a feature draft's first step is the target's alone)."""
        ...


@dataclass(frozen=True)
class Runners:
    """The models of a decode, each behind a :class:`Runner`; ``hindsight`` reads the target uncounted (bounds only).
    A row drafts once the draft's runner is ready for it (:class:`decode.drafts.DraftFeed`)."""

    target: Runner
    draft: DraftRunner
    companion: Runner | None = None
    hindsight: Runner | None = None

    def __iter__(self) -> Iterator[Runner]:
        return (r for r in (self.target, self.draft, self.companion, self.hindsight) if r is not None)


@dataclass(frozen=True)
class PendingBonus:
    """The target's logits at a row's last position, whose token the draft settles next round."""

    p_logits: Tensor  # [V] (a member-draft rule: [members, V])
    kind: Literal["tentative", "deferred"]  # a drawn token to check (at cur - 1), or a token still to draw (at cur)


@dataclass(eq=False)
class Row:
    """One row's decoding state; ``cur`` is its committed length, ``k`` this round's draft cap."""

    index: int
    policy: Policy
    generator: Generator
    budget: int
    cur: int
    stats: DecodeStats = field(default_factory=DecodeStats)
    done: bool = False
    k: int = 0
    state: DraftRound | None = None
    #: The tokens every cache may keep after this round (the committed prefix the target and the draft both saw).
    valid: int = 0
    pending: PendingBonus | None = None
    #: The draft's output at ``cur`` when already computed (after a settled bonus).
    next_step: DraftStep | None = None

    def __post_init__(self) -> None:
        self.stats.source_key = self.policy.price_key


@dataclass(frozen=True)
class RoundOutcome:
    """What one verified round commits."""

    verified: int  # candidates the target verified
    accepted_by_rule: int  # candidates the rule accepted (before any EOS cut)
    kept: int  # tokens committed: the accepted prefix plus the target's token, cut after an EOS
    from_target: int  # 1 when the target's token is among the committed ones
    finished: bool  # an end-of-sequence token was committed

    @property
    def accepted(self) -> int:
        """Committed tokens that were draft candidates."""
        return self.kept - self.from_target


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


class RoundLoop:
    """The draft / verify loop over the rows of a token buffer ``tokens [rows, length]`` (see the module docstring)."""

    def __init__(
        self, rule: Rule, sampling: Sampling, eos: frozenset[int], plan: BatchPlan, tokens: Tensor, rows: list[Row],
        runners: Runners, emit: Emitter,
    ) -> None:
        self.rule, self.sampling, self.eos, self.plan = rule, sampling, eos, plan
        self.rule_sampling = rule.transform(sampling)
        self.tokens, self.rows, self.runners, self.emit = tokens, rows, runners, emit
        policy = rows[0].policy
        self.companion_use, self.capture = policy.companion, policy.needs_hidden
        for row in rows:
            row.done = row.budget <= 0
            row.valid = row.cur - 1

    def run(self) -> None:
        """Decode every row until its EOS or budget (or until the emitter's caller ends it)."""
        rows = [row for row in self.rows if not row.done]
        if len(rows) < len(self.rows):
            self._trim_caches(rows)
        while rows:
            self._settle([row for row in rows if row.pending is not None])
            for row in rows:
                if self.emit(row.index, self.tokens[row.index], row.cur):
                    row.done = True
            rows = [row for row in rows if not row.done]
            if rows:
                self._round(rows)
            self._trim_caches([row for row in rows if not row.done])

    def _trim_caches(self, live: list[Row]) -> None:
        """Roll every cache back to each live row's valid prefix and drop the finished rows."""
        lengths = {row.index: row.valid for row in live}
        for runner in self.runners:
            runner.rollback(lengths, [index for index in runner.rows if index in lengths])

    # --- settling the target's token of the previous round -------------------------------------------------------
    def _settle(self, rows: list[Row]) -> None:
        """Settle each row's pending bonus with one batched draft forward; a row ends here at EOS or its budget."""
        if not rows:
            return
        draft, tokens = self.runners.draft, self.tokens
        tentative = self.rule.tentative_bonus
        logits = draft.feed(tokens, {row.index: row.cur for row in rows}, keep=2 if tentative else 1)
        replaced: dict[int, int] = {}
        for row in rows:
            pending, q = row.pending, logits[row.index]
            row.pending = None
            if tentative:
                accepted_t, token_t = self.rule.settle(pending.p_logits, q[0], tokens[row.index, row.cur - 1],
                                                       self.sampling, row.generator)
                tokens[row.index, row.cur - 1] = token_t  # the bonus itself when accepted
                accepted, token = torch.stack([accepted_t.to(token_t.dtype), token_t]).tolist()
                if accepted:
                    row.next_step = self._step(q[1], row.index, row.cur - 1)
                else:
                    replaced[row.index] = row.cur - 1
            else:
                token_t = self.rule.complete(pending.p_logits, q[0], self.sampling, row.generator)
                tokens[row.index, row.cur] = token_t
                token = int(token_t)
                row.cur += 1
                row.valid = row.cur - 1
                row.stats.generated += 1
                row.stats.target_emitted += 1
            row.done = token in self.eos or row.stats.generated >= row.budget
        if replaced:
            draft.rollback(replaced)

    # --- drafting ------------------------------------------------------------------------------------------------
    def _step(self, q_logits: Tensor, row: int, position: int) -> DraftStep:
        """The draft's output after consuming ``tokens[row, position]`` (with its hidden state and that token where
        a policy reads them)."""
        hidden = self.runners.draft.hidden_of(row) if self.capture else None
        if hidden is None:
            return DraftStep(q_logits)
        return DraftStep(q_logits, hidden[-1], self.tokens[row, position].clone())

    def _draft_next(self, rows: list[Row], offset: int) -> None:
        """Feed each row's draft up to ``cur + offset``: its output there becomes the round's next step."""
        logits = self.runners.draft.feed(self.tokens, {row.index: row.cur + offset for row in rows}, keep=1)
        for row in rows:
            row.state.next = self._step(logits[row.index][-1], row.index, row.cur + offset - 1)

    def _propose(self, row: Row, position: int, companion: Tensor | None, target: Tensor | None) -> Decision:
        """Draw row's next candidate from its draft's latest step into ``tokens[row, position]``; ask the policy.

        A dynamic policy is consulted after the draw, and an end-of-sequence candidate stops drafting; a static
        one always continues (its ``k`` bounds it; no host sync). ``target``: the target's logits at ``position``
        (a hindsight policy only), from which the candidate's true acceptance and its verification uniform are
        recorded (DESIGN §5).
        """
        rule, state, policy = self.rule, row.state, row.policy
        q_logits = state.next.q_logits
        y = rule.propose(q_logits, self.sampling, row.generator)
        self.tokens[row.index, position] = y
        hindsight = None
        if target is not None:
            p, q = target[None], q_logits[None]
            accept, expected = torch.cat([rule.label(p, q, y.view(1), self.sampling),
                                          rule.expected_accept(p, q, self.sampling)]).tolist()
            hindsight = Hindsight(accept, expected, uniform((), row.generator, target))
        state.draw(y, companion, hindsight)
        if not policy.dynamic and not rule.member_draft:  # a member draft stops at an EOS candidate under any policy
            return Decision.CONTINUE
        decision = policy.after_propose(state) if policy.dynamic else Decision.CONTINUE
        if decision is Decision.CONTINUE and self.eos and int(y) in self.eos:  # no host sync without EOS ids
            return Decision.STOP
        return decision

    def _scores(self, runner: Runner | None, rows: list[Row], offset: int) -> dict[int, Tensor]:
        """``runner``'s logits at each row's ``cur + offset`` (nothing without the runner)."""
        if runner is None:
            return {}
        return runner.feed(self.tokens, {row.index: row.cur + offset for row in rows}, keep=1)

    def _joint_stop(self, drafting: list[Row], i: int, batch: int, after: Literal["propose", "feed"]) -> list[Row]:
        """The rows still drafting after the plan's decision at ``after`` (proposing or feeding ``y_i``)."""
        if not drafting:
            return drafting
        going = self.plan.drafting([row.policy for row in drafting], i, batch, after)
        return [row for row, on in zip(drafting, going) if on]

    def _draft(self, rows: list[Row]) -> None:
        """Draft up to ``row.k`` candidates per row, each row stopping as its policy says."""
        for row in rows:
            row.state.next, row.next_step = row.next_step, None
        drafting = [row for row in rows if row.k > 0]
        unseen = [row for row in drafting if row.state.next is None]
        if unseen:
            self._draft_next(unseen, 0)
        step_companion = self.runners.companion if self.companion_use == "step" else None
        i = 1
        while drafting:
            companion = self._scores(step_companion, drafting, i - 1)
            target = self._scores(self.runners.hindsight, drafting, i - 1)
            going = []
            for row in drafting:
                c, t = companion.get(row.index), target.get(row.index)
                decision = self._propose(row, row.cur + i - 1, c[-1] if c is not None else None,
                                         t[-1] if t is not None else None)
                if decision is Decision.DROP:
                    row.state.withdraw()
                    self.runners.draft.uncount_last_call(row.index)  # the forward that produced q_i: hindsight (see Oracle)
                elif decision is Decision.CONTINUE and i < row.k:
                    going.append(row)
            going = self._joint_stop(going, i, len(rows), "propose")
            if not going:
                break
            self._draft_next(going, i)
            drafting = [row for row in going
                        if not (row.policy.dynamic and row.policy.after_feed(row.state) is Decision.STOP)]
            drafting = self._joint_stop(drafting, i, len(rows), "feed")
            i += 1
        if self.companion_use == "round":
            self._score_round(rows)

    def _score_round(self, rows: list[Row]) -> None:
        """The companion scores every row's candidates in one forward."""
        scored = [row for row in rows if row.state.i]
        if not scored:
            return
        ends = {row.index: row.cur + row.state.i - 1 for row in scored}
        logits = self.runners.companion.feed(self.tokens, ends, keep=max(row.state.i for row in scored))
        for row in scored:
            candidates: list[Candidate] = row.state.candidates
            for candidate, c in zip(candidates, logits[row.index][-len(candidates):]):
                candidate.companion_logits = c

    # --- the round -----------------------------------------------------------------------------------------------
    def _round(self, rows: list[Row]) -> None:
        """One draft / verify round of the live rows."""
        floor = 1 if self.rule.member_draft else 0
        for row in rows:
            row.policy.start_round()
            row.k = min(row.policy.k_cap(), max(floor, row.budget - row.stats.generated - 1))
            row.state = DraftRound(self.rule_sampling)
        if not self.plan.opens_round([row.policy for row in rows]):
            for row in rows:  # a target-only step
                row.k = 0
        for row in rows:
            if not self.runners.draft.ready(row.index):  # e.g. a feature draft's first step: the target's alone
                row.k = 0
        self._draft(rows)
        lengths = self.plan.verification_lengths([row.policy for row in rows], [row.state for row in rows])
        slots = [self._open_slot(row, verify) for row, verify in zip(rows, lengths)]
        p = self.runners.target.feed(
            self.tokens, {row.index: row.cur + verify - 1 + slot for row, verify, slot in zip(rows, lengths, slots)},
            keep=max(verify + slot for verify, slot in zip(lengths, slots)),
        )
        draft_steps = max(row.state.i for row in rows)
        accepted = self._verify(rows, lengths, [p[row.index][-(verify + slot):]
                                                for row, verify, slot in zip(rows, lengths, slots)])
        self.plan.end_round(len(rows), sum(accepted) + len(rows), draft_steps, sum(lengths))

    def _open_slot(self, row: Row, verify: int) -> int:
        """1 when the target scores the position after the verified candidates (always, but for a member draft
        past an end-of-sequence candidate or its budget)."""
        if not self.rule.member_draft or verify == 0:
            return 1
        if verify >= row.budget - row.stats.generated:
            return 0
        return 0 if int(self.tokens[row.index, row.cur + verify - 1]) in self.eos else 1

    def _verify(self, rows: list[Row], lengths: list[int], p_logits: list[Tensor]) -> list[int]:
        """Verify every row's first candidates and commit what each emits, with one transfer for the batch.

        Returns the number of candidates the rule accepted per row.
        """
        tokens, results = self.tokens, []
        for row, verify, p in zip(rows, lengths, p_logits):
            q = row.state.verified_q(verify)
            q = q if q is not None else p.new_empty((0, p.shape[-1]))
            results.append(self.rule.verify(p, q, tokens[row.index, row.cur: row.cur + verify], self.sampling,
                                            row.generator, row.state.draws(verify)))
        # two values per row, n_acc and the token; a member draft's token not drawn yet: a stand-in, never read
        heads = [t.view(1) if t is not None else n_acc.view(1) for n_acc, token in results for t in (n_acc, token)]
        values = torch.cat(heads + [tokens[row.index, row.cur: row.cur + v] for row, v in zip(rows, lengths)]).tolist()
        offset, accepted = 2 * len(rows), []
        for b, (row, verify, p) in enumerate(zip(rows, lengths, p_logits)):
            n_acc, token = values[2 * b], values[2 * b + 1]
            token_t = results[b][1]
            ys = values[offset: offset + verify]
            self._commit(row, verify, p, n_acc, token_t, None if token_t is None else token, ys)
            offset += verify
            accepted.append(n_acc)
        return accepted

    def _commit(self, row: Row, verify: int, p: Tensor, n_acc: int, token_t: Tensor | None, token: int | None,
                ys: list[int]) -> None:
        """Commit a verified round of ``row``: the accepted prefix and the target's token (``token_t``, None where a
        member draft must reach its position first), cut after an EOS."""
        state, eos = row.state, self.eos
        emitted = ys[:n_acc] + ([token] if token is not None else [])
        kept = next((j + 1 for j, t in enumerate(emitted) if t in eos), len(emitted))
        finished = kept < len(emitted) or (kept > 0 and emitted[kept - 1] in eos)
        outcome = RoundOutcome(verify, n_acc, kept, kept - min(n_acc, kept), finished)
        if outcome.from_target:
            self.tokens[row.index, row.cur + n_acc] = token_t  # a device copy: an int would sync on CUDA
        drafted = state.i
        record_round(row.stats, drafted, outcome)
        row.stats.record_estimates(row.policy.round_estimates(), verify, n_acc)
        row.policy.end_round(drafted, verify, n_acc)
        calls, folds = row.policy.take_source_calls()
        row.stats.source_calls += calls
        row.stats.source_updates += folds
        if outcome.from_target and self.rule.tentative_bonus and n_acc == verify and not state.reached(verify):
            row.pending = PendingBonus(p[verify], "tentative")  # settled against the draft first thing next round
        elif token_t is None and not finished and row.stats.generated < row.budget:
            row.pending = PendingBonus(p[verify], "deferred")  # drawn once the draft has reached its position
        row.valid = row.cur + outcome.accepted
        row.cur += kept
        row.done = row.pending is None and (finished or row.stats.generated >= row.budget)
        row.state = None
