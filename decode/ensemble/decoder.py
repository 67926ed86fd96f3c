"""Speculative Ensemble (DESIGN §4): lossless, accelerated decoding of an n-model ensemble.

The output follows ``r = E(l_1, …, l_n)`` (:class:`~decode.ensemble_fn.EnsembleFn`) exactly, in
every mode; at temperature 0 it is the argmax of ``r``. Modes (batch size 1):

``plain``
    The vanilla ensemble: every model is called once per token and the token is sampled from ``r``.
``sd``
    Speculative-based ensemble, in the decoder's round loop (:mod:`decode.ensemble.sd_mode`): ``models[0]``
    (pass the smallest first) proposes ``γ_1`` tokens, every other model scores them in one call each, and each
    proposal ``y ~ q`` is accepted with probability ``min(1, r(y)/q(y))``, else replaced by a sample of
    ``norm(max(0, r − q))``. After a fully accepted round the others have already scored the next position, and
    the proposer's next call (the one that consumes its last proposal) completes ``r`` there: that token is
    sampled from ``r`` directly (when a ``post`` head stopped drafting after feeding the last proposal, that row
    already exists and costs no call). A length policy (e.g. a :class:`~decode.policies.Head` loaded with
    :func:`~decode.artifacts.serialization.load_head`, trained for ``models[0]``) may drive ``γ_1``.
``alternate``
    The alternate-proposal framework and its n-model generalisation (SE paper, Alg. 1 and 2).
    Each proposal remembers its proposer ``k``; its proposal distribution is ``k``'s own
    distribution at that position. A call of model ``i`` scores every pending position it has not
    scored yet plus the next one, in one forward. A pending token is verified (against ``r``, with
    its proposer's distribution as ``q``) once every model has scored it; then the caller samples a
    bonus token from its own distribution at the next position and proposes ``γ_i − 1`` more.
    The next caller is the model with the fewest stored scores (lowest index on ties). A
    rejection emits the residual sample, clears every pending token and score, and ``models[0]``
    (the default proposer) proposes ``γ_1`` new tokens. With every ``γ_i = 1`` no generation uses
    more model calls than ``plain`` (paper Cor. 3.7).

The alternate proposals are not rounds of one draft and one verifier: :class:`_Alternation` schedules them.
Each model keeps its own KV cache (:class:`~decode.loops.runner.ModelRunner`), rolled back on
rejection (and trimmed to its sliding window, if any, once committed); no model ever scores the
same position of the same prefix twice.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import torch
from torch import Generator, Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from decode.artifacts.serialization import check_compatibility
from decode.compile.model import CompiledModel
from decode.compile.owner import CompiledModels, DecoderForwards
from decode.digests import unverified_files
from decode.ensemble.ensemble_stats import EnsembleStats
from decode.ensemble.sd_mode import MemberEnsemble, Members
from decode.ensemble_fn import EnsembleFn
from decode.loops.emit import Emitter
from decode.loops.prompt_input import ROUND_SLACK, id_list, token_buffer
from decode.loops.round_loop import RoundLoop, Row, Runners
from decode.loops.runner import ModelRunner, OneRow, context_length, vocab_size
from decode.policies.base import BatchPlan, Policy
from decode.policies.schedules import Fixed
from decode.policies.stop_policy import policy_head
from decode.rules import Ensemble, sample, uniform
from decode.sampling import Sampling

MODES = ("plain", "sd", "alternate")
_AUTO = "auto"
#: Acceptance ``min(1, r(y)/q(y))`` and residual ``norm(max(0, r − q))``: the ensemble rule of rules.py.
_RULE = Ensemble()


@dataclass
class EnsembleOutput:
    """Result of :meth:`EnsembleDecoder.generate`."""

    sequences: Tensor
    stats: EnsembleStats
    text: str | None = None


class EnsembleDecoder:
    """Decode the ensemble of ``models`` in ``mode`` (see the module docstring).

    ``ensemble``: an :class:`EnsembleFn` (default: uniform weights) or, for two models ``[q, p]``,
    a :class:`~decode.rules.Ensemble` rule. ``proposal_lengths``: ``γ_i`` per model (default all 1;
    ``sd`` uses ``γ_1`` only, ``plain`` none). ``policy``: ``sd`` only, instead of
    ``proposal_lengths``; policies that need a companion (pre heads with companion features, SV)
    or hindsight (the analysis bounds: oracle, perfect predictors) are not supported. ``eos_token_id`` defaults to the union of the
    models' generation configs; ``None`` decodes without EOS. ``compile=True``: static caches and compiled forwards
    for every model (:mod:`decode.compile`; the first decode compiles), closed by :meth:`close` or leaving a ``with``
    block; ``compile=CompiledModels(...)``: on that owner's, which its caller closes.
    """

    def __init__(
        self,
        models: Sequence[PreTrainedModel],
        ensemble: EnsembleFn | Ensemble | None = None,
        proposal_lengths: Sequence[int] | None = None,
        mode: str = "alternate",
        sampling: Sampling | None = None,
        policy: Policy | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        eos_token_id: int | Sequence[int] | None | str = _AUTO,
        compile: bool | CompiledModels = False,
    ) -> None:
        self.models = list(models)
        self.compile = compile is not False
        self._forwards = DecoderForwards(compile)
        n = len(self.models)
        if isinstance(ensemble, Ensemble):
            if n != 2:
                raise ValueError(f"a rules.Ensemble describes two models [q, p]; got {n} models: pass an EnsembleFn")
            ensemble = ensemble.function()
        self.ensemble = ensemble if ensemble is not None else EnsembleFn("weighted")
        self.ensemble.check(n)
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        self.mode = mode
        self.sampling = sampling if sampling is not None else Sampling()
        self.tokenizer = tokenizer
        self.proposal_lengths = [1] * n if proposal_lengths is None else [int(g) for g in proposal_lengths]
        if len(self.proposal_lengths) != n or min(self.proposal_lengths) < 1:
            raise ValueError(f"proposal_lengths needs one length >= 1 per model, got {self.proposal_lengths}")
        self.device = self.models[0].device
        self.policy = self._check_policy(policy, proposal_lengths is not None)
        self.vocab = min(vocab_size(model) for model in self.models)
        self.context = context_length(list(self.models))
        if eos_token_id == _AUTO:
            eos_token_id = [i for model in self.models for i in id_list(model.generation_config.eos_token_id)]
        self.eos: frozenset[int] = frozenset(id_list(eos_token_id))

    def _check_policy(self, policy: Policy | None, explicit_lengths: bool) -> Policy:
        """The ``sd`` proposer's length policy (``Fixed(γ_1)`` by default); refuse unsupported ones."""
        if policy is None:
            return Fixed(self.proposal_lengths[0])
        if self.mode != "sd":
            raise ValueError(f"a length policy drives the proposer in mode='sd' only, not mode={self.mode!r}")
        if explicit_lengths:
            raise ValueError("pass either proposal_lengths or policy, not both")
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a decode.policies.Policy, got {type(policy).__name__}")
        if policy.companion is not None or policy.needs_hindsight:
            raise ValueError(f"policy {policy!r} needs a companion or hindsight: not supported by EnsembleDecoder")
        head = policy_head(policy)
        if head is not None and head.metadata is not None:
            recorded = head.metadata
            rule = Ensemble.from_function(self.ensemble, len(self.models))
            if rule is None:
                raise ValueError(
                    f"the policy's head was trained with rule {recorded.rule}; {self.ensemble!r} over "
                    f"{len(self.models)} models has no two-model rule equivalent, so its labels do not apply"
                )
            check_compatibility(recorded, "the policy's head", draft=self.models[0], sampling=self.sampling, rule=rule)
        policy.to(self.device)
        return policy

    def compiled_models(self) -> list[CompiledModel | None]:
        """Each model's compiled forwards (None each: eager), made at first use."""
        return self._forwards.open(self.models)

    def close(self) -> None:
        """Close the compiled forwards this decoder opened (their hooks leave the models); a later decode opens them
        again. Forwards on an owner passed as ``compile`` are its caller's to close."""
        self._forwards.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def runner(self, i: int, capture_hidden: bool = False) -> ModelRunner:
        """A fresh runner of model ``i`` (its own KV cache), compiled where :meth:`compiled_models` says."""
        return ModelRunner(self.models[i], self.vocab, capture_hidden=capture_hidden, compiled=self.compiled_models()[i])

    @torch.inference_mode()
    def generate(
        self, input_ids: Tensor | str | Sequence[int], max_new_tokens: int = 64, seed: int = 0
    ) -> EnsembleOutput:
        """Generate up to ``max_new_tokens`` tokens after ``input_ids`` (``[1, n]``, ids or text)."""
        tokens, n = token_buffer(input_ids, self.tokenizer, self.device, "EnsembleDecoder", max_new_tokens,
                                 slack=ROUND_SLACK, context=self.context)
        start = time.perf_counter()
        generator = torch.Generator(device=self.device).manual_seed(seed)
        if self.mode == "sd":
            stats, length = self._decode_sd(tokens, n, max_new_tokens, generator)
        else:
            runners = [self.runner(i) for i in range(len(self.models))]
            engine = _Alternation(self, tokens, n, n + max_new_tokens, generator, runners)
            try:
                engine.run_plain() if self.mode == "plain" else engine.run_alternate()
            finally:
                for runner in runners:
                    runner.close()
            stats, length = engine.stats, engine.cur
            stats.calls = [runner.calls for runner in runners]
        stats.wall_time_s = time.perf_counter() - start
        stats.unverified_files = unverified_files(*self.models, policy_head(self.policy))
        if self.compile:
            stats.compile, stats.eager_reason = self._forwards.outcome(self.compiled_models())
        sequences = tokens[:, :length]
        text = self.tokenizer.decode(sequences[0, n:]) if self.tokenizer is not None else None
        return EnsembleOutput(sequences=sequences, stats=stats, text=text)

    def _decode_sd(self, tokens: Tensor, n: int, budget: int, generator: Generator) -> tuple[EnsembleStats, int]:
        """The ``sd`` mode: the round loop with ``models[0]`` as the draft and the other members as the target."""
        policy = self.policy
        policy.reset()
        row = Row(0, policy, generator, budget, n)
        draft = OneRow(self.runner(0, capture_hidden=policy.needs_hidden))
        members = Members([self.runner(i) for i in range(1, len(self.models))])
        try:
            RoundLoop(MemberEnsemble(self.ensemble), self.sampling, self.eos, BatchPlan(), tokens, [row],
                      Runners(members, draft), Emitter(None, [n])).run()
        finally:
            draft.close()
            members.close()
        s = row.stats
        rejected = sum(a < v for a, v in zip(s.accepted_per_round, s.verified_per_round))
        others = len(self.models) - 1
        stats = EnsembleStats(
            "sd", calls=[draft.calls] + [members.calls] * others, proposed=[s.drafted] + [0] * others,
            accepted_by=[s.accepted] + [0] * others, rejected_by=[rejected] + [0] * others, generated=s.generated,
            from_r=s.target_emitted - rejected, discarded=s.drafted - s.accepted - rejected,
            scored=[draft.calls] + [members.scored] * others,
        )
        return stats, row.cur


class _Alternation:
    """The ``plain`` and ``alternate`` modes' state: committed length ``cur``, pending proposals, per-model scores.

    ``rows[i][j]`` are model ``i``'s logits for position ``cur + j``; pending tokens sit in
    ``tokens[cur : cur + m]`` and ``proposers[j]`` is the model that sampled ``tokens[cur + j]``.
    Invariant: a called model has consumed ``cur − 1 + len(rows[i])`` tokens.
    """

    def __init__(
        self, decoder: EnsembleDecoder, tokens: Tensor, start: int, limit: int, generator: Generator,
        runners: list[ModelRunner],
    ) -> None:
        self.fn, self.sampling, self.eos = decoder.ensemble, decoder.sampling, decoder.eos
        self.gammas = decoder.proposal_lengths
        self.tokens, self.cur, self.limit, self.generator = tokens, start, limit, generator
        self.runners = runners
        self.rows: list[list[Tensor]] = [[] for _ in runners]
        self.proposers: list[int] = []
        self.stats = EnsembleStats.empty(decoder.mode, len(runners))
        self.finished = limit <= start

    # --- primitives -------------------------------------------------------------------------------
    def _open_slot(self) -> bool:
        """Whether the position after the pending tokens may still be emitted (budget, pending EOS)."""
        end = self.cur + len(self.proposers)
        return end < self.limit and not (self.proposers and int(self.tokens[0, end - 1]) in self.eos)

    def _room(self, first: bool) -> bool:
        """Whether a proposal may take the open slot. Later proposals of a burst leave the last budget
        position to the token the scoring call emits anyway (as SpeculativeDecoder drafts ≤ remaining − 1)."""
        return self._open_slot() and (first or self.cur + len(self.proposers) < self.limit - 1)

    def call(self, i: int) -> None:
        """Model ``i`` scores every pending position it lacks, and the open slot, in one forward."""
        frontier = self.cur + len(self.proposers) - (0 if self._open_slot() else 1)
        keep = frontier - self.cur - len(self.rows[i]) + 1
        assert keep > 0, "scheduled a call with nothing to score"
        logits = self.runners[i].feed(self.tokens, frontier, keep=keep)
        self.rows[i].extend(logits.unbind(0))
        self.stats.scored[i] += keep

    def propose(self, i: int) -> Tensor:
        """Sample a proposal for the open slot from model ``i``'s own distribution there."""
        m = len(self.proposers)
        y = _RULE.propose(self.rows[i][m], self.sampling, self.generator)
        self.tokens[0, self.cur + m] = y
        self.proposers.append(i)
        self.stats.proposed[i] += 1
        return y

    def _sample(self, probs: Tensor) -> int:
        return int(sample(probs, self.generator))

    def _commit(self, token: int) -> None:
        self.cur += 1
        self.stats.generated += 1
        for rows in self.rows:
            if rows:
                rows.pop(0)
        if token in self.eos or self.cur >= self.limit:
            self.finished = True
            self.stats.discarded += len(self.proposers)
            self.proposers.clear()

    def resolve(self) -> tuple[int, bool]:
        """Emit positions scored by every model; return ``(accepted proposals, rejected?)``."""
        accepted = 0
        while not self.finished and all(self.rows):
            r = self.fn.probs(torch.stack([rows[0] for rows in self.rows]), self.sampling).unsqueeze(0)
            if not self.proposers:
                token = self._sample(r[0])
                self.tokens[0, self.cur] = token
                self.stats.from_r += 1
                self._commit(token)
                continue
            k = self.proposers.pop(0)
            y = self.tokens[0, self.cur : self.cur + 1]
            q = self.sampling.probs(self.rows[k][0]).unsqueeze(0)
            if float(uniform((), self.generator, r)) < float(_RULE.accept_probs(r, q, y)):
                accepted += 1
                self.stats.accepted_by[k] += 1
                self._commit(int(y))
                continue
            token = self._sample(_RULE.reject_probs(r, q)[0])
            self.tokens[0, self.cur] = token
            self.stats.rejected_by[k] += 1
            self.stats.discarded += len(self.proposers)
            self.proposers.clear()
            for rows in self.rows:
                rows.clear()
            self._commit(token)
            for runner in self.runners:
                runner.rollback(self.cur - 1)
            return accepted, True
        for runner in self.runners:  # no rollback goes below cur: sliding-window caches may forget older states
            if runner.consumed <= self.cur:
                runner.rollback(self.cur)
        return accepted, False

    # --- modes ------------------------------------------------------------------------------------
    def run_plain(self) -> None:
        """Every model scores each position once; sample it from ``r``."""
        while not self.finished:
            for i in range(len(self.runners)):
                self.call(i)
            self.resolve()

    def run_alternate(self) -> None:
        """Alternate proposals (SE Alg. 2): the least-scored model scores, verifies, and adds its bonus."""
        n = len(self.runners)
        while not self.finished:
            if not any(self.rows):  # start, or restart after a rejection: the default proposer drafts
                for j in range(self.gammas[0]):
                    if not self._room(first=j == 0):
                        break
                    self.call(0)
                    self.propose(0)
                continue
            i = min(range(n), key=lambda j: len(self.rows[j]))
            self.call(i)
            _, rejected = self.resolve()
            if rejected:
                continue
            for j in range(self.gammas[i]):
                if self.finished or not self._room(first=j == 0):
                    break
                if j:
                    self.call(i)
                self.propose(i)

