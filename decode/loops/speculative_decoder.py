"""The speculative decoder: every rule × length policy, one prompt or a batch, in one loop (:mod:`.round_loop`)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self, overload

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from decode.artifacts.hub import load_causal_lm, load_tokenizer
from decode.artifacts.serialization import check_compatibility
from decode.compile.model import CompiledModel
from decode.compile.owner import CompiledModels, DecoderForwards
from decode.digests import unverified_files
from decode.drafts import drafter_of
from decode.loops.batch_cache import Layout
from decode.loops.batched import BatchDecodeOutput, generate_batch
from decode.loops.emit import Emitter, OnTokens
from decode.loops.prompt_input import ROUND_SLACK, id_list, is_batch, token_buffer
from decode.loops.round_loop import RoundLoop, Row, Runners
from decode.loops.runner import ModelRunner, OneRow, context_length, vocab_size
from decode.policies.base import BatchPlan, Policy
from decode.policies.schedules import Fixed
from decode.policies.stop_policy import policy_head
from decode.policies.sv import SV
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
    pass ``None`` to decode without EOS. ``compile=True``: one prompt decodes with static caches and compiled
    forwards (:mod:`decode.compile`; the first decode compiles) that the decoder opens and :meth:`close` (or leaving a
    ``with`` block) closes; ``compile=CompiledModels(...)``: on that owner's, which its caller closes. A batch of
    prompts decodes eager.
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
        compile: bool | CompiledModels = False,
    ) -> None:
        self.target, self.draft, self.companion = target, draft, companion
        self.compile = compile is not False
        self._forwards = DecoderForwards(compile)
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

    def compiled_models(self) -> dict[str, CompiledModel | None]:
        """The compiled forwards of ``target``, ``draft`` and ``companion`` (None each: eager), made at first use."""
        names = ["target", "draft"] + (["companion"] if self.companion is not None else [])
        compiled = dict(zip(names, self._forwards.open([getattr(self, name) for name in names])))
        compiled.setdefault("companion", None)
        return compiled

    def close(self) -> None:
        """Close the compiled forwards this decoder opened (their hooks leave the models); a later decode opens them
        again (and compiles again). Forwards on an owner passed as ``compile`` are its caller's to close."""
        self._forwards.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def unverified_files(self) -> list[str]:
        """The files of this decoder's models, head and profile loaded with ``verify=False`` (each decode's stats)."""
        profile = self.policy.profile if isinstance(self.policy, SV) else None
        return unverified_files(self.target, self.draft, self.companion, policy_head(self.policy), profile)

    def _check_artifacts(self) -> None:
        """Refuse a head or profile made for another rule / draft; warn on another sampling transform."""
        head = policy_head(self.policy)
        if head is not None and head.metadata is not None:
            check_compatibility(head.metadata, "the policy's head", draft=self.draft, sampling=self.sampling,
                                rule=self.rule)
        if isinstance(self.policy, SV) and self.policy.profile.metadata is not None:
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
        are decoded together by the batched loop (:func:`decode.loops.batched.generate_batch`) into a
        :class:`~decode.loops.batched.BatchDecodeOutput`; row ``i`` decodes as one prompt would with
        ``seed=row_seed(seed, i)``, or with ``seed[i]``; ``max_new_tokens`` is one budget or one per row; ``layout`` is
        how the KV caches keep rows of different lengths (:mod:`decode.loops.batch_cache`); every rule and policy decodes
        batched (the hindsight bounds through a batched cache of their own). ``on_tokens`` sees each
        row's tokens as they become final and may end the row (:mod:`decode.loops.emit`).
        """
        if is_batch(inputs, attention_mask):
            return generate_batch(self, inputs, max_new_tokens, seed, layout, attention_mask, on_tokens)
        return self._generate_one(inputs, max_new_tokens, seed, on_tokens)  # type: ignore[arg-type]

    def _generate_one(self, input_ids: Tensor | str | Sequence[int], max_new_tokens: int, seed: int,
                      on_tokens: OnTokens | None = None) -> DecodeOutput:
        tokens, n = token_buffer(input_ids, self.tokenizer, self.device, "SpeculativeDecoder", max_new_tokens,
                                 slack=ROUND_SLACK, context=self.context)
        start = time.perf_counter()
        generator = torch.Generator(device=self.device).manual_seed(seed)
        policy = self.policy
        policy.reset()
        row = Row(0, policy, generator, max_new_tokens, n)
        feed = drafter_of(self.draft).feed(self.draft, 1, tokens.shape[1])
        fast = self.compiled_models()
        runners = Runners(
            target=OneRow(ModelRunner(self.target, self.vocab, observer=feed.observer, compiled=fast["target"])),
            draft=feed.wrap(OneRow(ModelRunner(self.draft, self.vocab, compiled=fast["draft"],
                                               capture_hidden=policy.needs_hidden or feed.draft_hidden))),
            companion=(OneRow(ModelRunner(self.companion, self.vocab, compiled=fast["companion"]))
                       if policy.companion is not None else None),
            hindsight=OneRow(ModelRunner(self.target, self.vocab)) if policy.needs_hindsight else None,  # uncounted
        )
        try:
            # one prompt decides as alone: the policy's own verification length, no batch plan
            RoundLoop(self.rule, self.sampling, self.eos, BatchPlan(), tokens, [row], runners,
                      Emitter(on_tokens, [n])).run()
        finally:
            for runner in runners:
                runner.close()
        stats, length = row.stats, row.cur
        stats.target_calls, stats.draft_calls = runners.target.calls, runners.draft.calls
        stats.companion_calls = runners.companion.calls if runners.companion is not None else 0
        stats.wall_time_s = time.perf_counter() - start
        stats.unverified_files = self.unverified_files()
        if self.compile:
            stats.compile, stats.eager_reason = self._forwards.outcome(list(fast.values()))
        sequences = tokens[:, :length]
        text = self.tokenizer.decode(sequences[0, n:]) if self.tokenizer is not None else None
        return DecodeOutput(sequences=sequences, stats=stats, text=text)
