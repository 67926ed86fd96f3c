"""The speculative decoder: one loop for every rule × length policy (batch size 1; batches: :mod:`decode.loops.batched`)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from decode.artifacts.export import check_compatibility
from decode.artifacts.hub import load_causal_lm, load_tokenizer
from decode.loops.batch_cache import Layout
from decode.loops.batched import BatchDecodeOutput, generate_batch
from decode.loops.emit import Emitter, OnTokens
from decode.loops.inputs import id_list, is_batch, token_buffer
from decode.loops.rounds import bonus_pending, draft_candidate, record_round, settle_bonus, verify_round
from decode.loops.runner import ModelRunner, context_length, vocab_size
from decode.policies import SV, Decision, DraftRound, Fixed, Head, Policy
from decode.rules import Rule, Speculative
from decode.sampling import Sampling
from decode.stats import DecodeStats

_AUTO = "auto"


@dataclass
class DecodeOutput:
    """Result of :meth:`SpeculativeDecoder.generate`."""

    sequences: Tensor
    stats: DecodeStats
    text: str | None = None


class SpeculativeDecoder:
    """Draft-then-verify decoding of ``target`` with ``draft`` under a rule and a length policy.

    KV caches of all models are kept and rolled back on rejection; the prompt prefill is merged
    into each model's first call. ``eos_token_id`` defaults to the target's generation config;
    pass ``None`` to decode without EOS.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel,
        rule: Rule | None = None,
        policy: Policy | None = None,
        companion: PreTrainedModel | None = None,
        sampling: Sampling | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        eos_token_id: int | Sequence[int] | None | str = _AUTO,
    ) -> None:
        self.target, self.draft, self.companion = target, draft, companion
        self.rule = rule if rule is not None else Speculative()
        self.policy = policy if policy is not None else Fixed(5)
        self.sampling = sampling if sampling is not None else Sampling()
        self.tokenizer = tokenizer
        if not isinstance(self.rule, Rule):
            raise TypeError(f"rule must be a decode.rules.Rule, got {type(self.rule).__name__}")
        if not isinstance(self.policy, Policy):
            raise TypeError(f"policy must be a decode.policies.Policy, got {type(self.policy).__name__}")
        self.policy.validate(self.rule, companion is not None)
        if companion is not None and self.policy.companion is None:
            warnings.warn(f"policy {self.policy!r} does not use the companion model; it is ignored", stacklevel=2)
        self._check_artifacts()
        models = [target, draft] + ([companion] if companion is not None else [])
        self.vocab = min(vocab_size(model) for model in models)
        self.context = context_length(models)
        self.device = target.device
        self.policy.to(draft.device)
        if eos_token_id == _AUTO:
            eos_token_id = target.generation_config.eos_token_id
        self.eos: frozenset[int] = frozenset(id_list(eos_token_id))

    def _check_artifacts(self) -> None:
        """Refuse a head or profile made for another rule / draft; warn on another sampling transform."""
        if isinstance(self.policy, Head) and self.policy.head is not None and self.policy.head.metadata:
            doc = self.policy.head.metadata
            check_compatibility(doc, "the policy's head", sampling=self.sampling, rule=self.rule)
            hidden = self.draft.config.get_text_config(decoder=True).hidden_size
            if doc.get("hidden_size", hidden) != hidden:
                raise ValueError(
                    f"the policy's head expects draft hidden size {doc['hidden_size']} but the draft has {hidden}"
                )
        if isinstance(self.policy, SV) and self.policy.profile.metadata:
            check_compatibility(self.policy.profile.metadata, "the SV profile", sampling=self.sampling, rule=self.rule)

    @classmethod
    def from_pretrained(
        cls,
        target_id: str,
        draft_id: str,
        companion_id: str | None = None,
        *,
        revision: str | None = None,
        dtype: str | torch.dtype | None = "auto",
        device_map: str | dict | None = None,
        **kwargs: object,
    ) -> SpeculativeDecoder:
        """Load the models (and the target's tokenizer) through :mod:`decode.artifacts.hub`."""

        def load(name: str) -> PreTrainedModel:
            return load_causal_lm(name, revision=revision, dtype=dtype, device_map=device_map)

        companion = load(companion_id) if companion_id is not None else None
        kwargs.setdefault("tokenizer", load_tokenizer(target_id, revision=revision))
        return cls(load(target_id), load(draft_id), companion=companion, **kwargs)  # type: ignore[arg-type]

    @overload
    def generate(self, inputs: Tensor | str | Sequence[int], max_new_tokens: int = 64, seed: int = 0, *,
                 on_tokens: OnTokens | None = None) -> DecodeOutput:
        ...

    @overload
    def generate(self, inputs: Sequence[Tensor | str | Sequence[int]] | Tensor,
                 max_new_tokens: int | Sequence[int] = 64, seed: int | Sequence[int] = 0, *,
                 attention_mask: Tensor | None = None, layout: Layout = "holes",
                 on_tokens: OnTokens | None = None) -> BatchDecodeOutput:
        ...

    @torch.inference_mode()
    def generate(self, inputs: Tensor | str | Sequence, max_new_tokens: int | Sequence[int] = 64,
                 seed: int | Sequence[int] = 0, *, attention_mask: Tensor | None = None,
                 layout: Layout = "holes", on_tokens: OnTokens | None = None) -> DecodeOutput | BatchDecodeOutput:
        """Generate up to ``max_new_tokens`` tokens after one prompt or each of several, as HF's ``generate`` takes them.

        One prompt (text, ids or ``[1, n]``) gives a :class:`DecodeOutput`. Several — a list of
        prompts of different lengths, or a padded ``[B, n]`` tensor with its ``attention_mask`` —
        are decoded together by the batched loop (:meth:`generate_batch`) into a
        :class:`~decode.loops.batched.BatchDecodeOutput`; row ``i`` decodes as one prompt would with
        ``seed=row_seed(seed, i)``. ``on_tokens`` sees each row's tokens as they become final and may end
        the row (:mod:`decode.loops.emit`).
        """
        if is_batch(inputs, attention_mask):
            return generate_batch(self, inputs, max_new_tokens, seed, layout, attention_mask, on_tokens)
        return self._generate_one(inputs, max_new_tokens, seed, on_tokens)  # type: ignore[arg-type]

    def _generate_one(self, input_ids: Tensor | str | Sequence[int], max_new_tokens: int, seed: int,
                      on_tokens: OnTokens | None = None) -> DecodeOutput:
        tokens, n = token_buffer(input_ids, self.tokenizer, self.device, "SpeculativeDecoder", max_new_tokens, slack=2,
                                 context=self.context)
        start = time.perf_counter()
        generator = torch.Generator(device=self.device).manual_seed(seed)
        policy = self.policy
        policy.reset()
        target = ModelRunner(self.target, self.vocab)
        draft = ModelRunner(self.draft, self.vocab, capture_hidden=policy.needs_hidden)
        companion = ModelRunner(self.companion, self.vocab) if policy.companion is not None else None
        hindsight = ModelRunner(self.target, self.vocab) if policy.needs_hindsight else None  # its calls: uncounted
        try:
            loop = _Loop(self, tokens, generator, target, draft, companion, hindsight, Emitter(on_tokens, [n]))
            stats, length = loop.run(n, max_new_tokens)
        finally:
            draft.close()
        stats.target_calls, stats.draft_calls = target.calls, draft.calls
        stats.companion_calls = companion.calls if companion is not None else 0
        stats.wall_time_s = time.perf_counter() - start
        sequences = tokens[:, :length]
        text = self.tokenizer.decode(sequences[0, n:]) if self.tokenizer is not None else None
        return DecodeOutput(sequences=sequences, stats=stats, text=text)

    @torch.inference_mode()
    def generate_batch(
        self,
        prompts: Sequence[Tensor | str | Sequence[int]] | Tensor,
        max_new_tokens: int | Sequence[int] = 64,
        seed: int | Sequence[int] = 0,
        layout: Layout = "holes",
        attention_mask: Tensor | None = None,
        on_tokens: OnTokens | None = None,
    ) -> BatchDecodeOutput:
        """Decode a batch of prompts of different lengths (ids, ``[1, n]`` / 1-D tensors, or text), or a padded
        ``[B, n]`` tensor with its ``attention_mask`` (left or right padding, as a tokenizer returns them).
        :meth:`generate` with several prompts does the same; this name stays for a batch of one.

        Row ``i`` is decoded as ``generate(prompts[i], max_new_tokens[i], seed=row_seed(seed, i))``
        would decode it (a per-row policy copy, generator, budget and EOS stop), with the draft and
        target forwards of all rows batched; ``max_new_tokens`` is one budget for all rows or one
        per row; ``seed`` one seed for the batch (rows seeded by :func:`decode.row_seed`) or each
        row's own seed; ``layout`` is how the KV caches keep rows of different lengths
        (:mod:`decode.loops.batch_cache`). Every rule and every policy but the hindsight bounds decode batched
        (:func:`decode.loops.batched.check_supported`).
        """
        return generate_batch(self, prompts, max_new_tokens, seed, layout, attention_mask, on_tokens)


class _Loop:
    """State of one generation; :meth:`run` is the draft / verify loop."""

    def __init__(
        self,
        decoder: SpeculativeDecoder,
        tokens: Tensor,
        generator: torch.Generator,
        target: ModelRunner,
        draft: ModelRunner,
        companion: ModelRunner | None,
        hindsight: ModelRunner | None,
        emit: Emitter,
    ) -> None:
        self.rule, self.policy, self.sampling = decoder.rule, decoder.policy, decoder.sampling
        self.emit = emit
        self.rule_sampling = decoder.rule.transform(decoder.sampling)
        self.eos = decoder.eos
        self.tokens, self.generator = tokens, generator
        self.target, self.draft, self.companion, self.hindsight = target, draft, companion, hindsight
        self.capture = decoder.policy.needs_hidden
        # Draft output for the last committed position when already computed (else None).
        self.next_q: Tensor | None = None
        self.next_hidden: Tensor | None = None

    def _draft_next(self, end: int) -> None:
        logits = self.draft.feed(self.tokens, end, keep=1)
        self.next_q = logits[0]
        self.next_hidden = self.draft.hidden[-1] if self.capture else None

    def _settle(self, p_logits: Tensor, cur: int) -> bool:
        """Check the tentative bonus at ``cur - 1`` against the draft (one host sync); return True if EOS."""
        logits = self.draft.feed(self.tokens, cur, keep=2)
        accepted, token = settle_bonus(self.rule, p_logits, logits[0], self.tokens[0], cur - 1, self.sampling,
                                       self.generator)
        if accepted:
            self.next_q = logits[1]
            self.next_hidden = self.draft.hidden[-1] if self.capture else None
        else:
            self.draft.rollback(cur - 1)
        return token in self.eos

    def _draft_round(self, cur: int, k: int) -> DraftRound:
        """Draft up to ``k`` candidates after position ``cur`` as the policy allows."""
        state = DraftRound(self.rule_sampling)
        policy, tokens = self.policy, self.tokens
        if k == 0:
            if self.next_q is not None:
                state.q_logits.append(self.next_q)
            return state
        if self.next_q is None:
            self._draft_next(cur)
        state.q_logits.append(self.next_q)
        state.hidden.append(self.next_hidden)
        step_companion = self.companion if policy.companion == "step" else None
        for i in range(1, k + 1):
            if step_companion is not None:
                state.companion_logits.append(step_companion.feed(tokens, cur + i - 1, keep=1)[0])
            hindsight = self.hindsight.feed(tokens, cur + i - 1, keep=1)[0] if self.hindsight is not None else None
            decision = draft_candidate(self.rule, policy, state, tokens[0], cur + i - 1, self.sampling, self.generator,
                                       self.eos, hindsight)
            if decision is Decision.DROP:
                state.withdraw()
                self.draft.uncount_last_call()  # the forward that produced q_i: hindsight (see Oracle)
                break
            if decision is Decision.STOP:
                break
            if i == k:
                break
            self._draft_next(cur + i)
            state.q_logits.append(self.next_q)
            state.hidden.append(self.next_hidden)
            if policy.dynamic and policy.after_feed(state) is Decision.STOP:
                break
        if policy.companion == "round" and state.i:
            state.companion_logits.extend(self.companion.feed(tokens, cur + state.i - 1, keep=state.i).unbind(0))
        return state

    def run(self, cur: int, max_new_tokens: int) -> tuple[DecodeStats, int]:
        """Decode until EOS or the budget; return the stats and the final sequence length."""
        stats = DecodeStats()
        rule, policy, tokens, eos = self.rule, self.policy, self.tokens, self.eos
        pending: Tensor | None = None  # target logits for a tentative bonus token at cur - 1
        finished = False
        while True:
            if pending is not None:
                finished = self._settle(pending, cur)
                pending = None
            if self.emit(0, tokens[0], cur) or finished or stats.generated >= max_new_tokens:
                return stats, cur
            policy.start_round()
            k = min(policy.k_cap(), max_new_tokens - stats.generated - 1)
            state = self._draft_round(cur, k)
            self.next_q = self.next_hidden = None
            drafted = state.i
            verify = policy.verification_length(state) if drafted else 0
            p_logits = self.target.feed(tokens, cur + verify, keep=verify + 1)
            outcome = verify_round(rule, p_logits, state, tokens[0, cur : cur + verify], self.sampling,
                                   self.generator, eos)
            finished = outcome.finished
            if outcome.from_target:
                tokens[0, cur + outcome.accepted_by_rule] = outcome.token  # a device copy: an int would sync on CUDA
            record_round(stats, drafted, outcome)
            policy.end_round(drafted, verify, outcome.accepted_by_rule)
            keep = outcome.kept
            if bonus_pending(rule, state, outcome):
                pending = p_logits[verify]
                finished = False  # decided once the draft has checked the bonus
            cur += keep
            for runner in (self.target, self.draft, self.companion, self.hindsight):
                if runner is not None:
                    runner.rollback(cur - 1)

