"""The baselines' runners: HF assisted generation and Speculative Ensemble, each on the draft + target pair.

:class:`HFRunner` (``hf-constant``, ``hf-heuristic``, ``hf-confidence``) calls
``target.generate(assistant_model=draft)`` with the draft's generation config set per schedule (HF
defaults otherwise: 20 assistant tokens to start). Target and draft forwards are counted with forward
hooks. HF does not report acceptances, so ``accepted`` is estimated as generated − target calls (one
target-emitted token per verification) and ``drafted`` as the draft's forward count, which is also the
verified total (per-round lengths are not recorded). Without scikit-learn HF keeps the confidence
threshold fixed (with it, HF adapts it online).

:class:`SERunner` (``se-plain``: both models every token; ``se-sd``: the draft proposes γ, the target
scores; ``se-alternate``: SE's alternate proposals, γ for the draft, 1 for the target) decodes with
:class:`decode.EnsembleDecoder`; the ensemble is the configured ``ensemble`` rule's ``r`` (DESIGN §4).
Per-call lengths are not recorded: ``verified`` is the positions the target scored beyond one per call
(the cost model charges the mean length, :func:`accept_heads.measure.costing.verification_units`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers.utils import is_sklearn_available

import decode
from accept_heads.measure.inputs import PromptSet
from accept_heads.measure.runs import Generation, GenerationRecord, RunSpec, output_sha
from accept_heads.measure.specs import HF_START_TOKENS
from ahconf.rule_config import build_rule
from ahconf.schema import RulesConfig
from decode.loops.prompt_input import pad_id
from decode.sampling import Sampling
from decode.stats import CallCounter
from runtime.encoding import EncodedPrompt
from runtime.models import Trio
from runtime.seeding import prompt_seed


def sampling_kwargs(rule: str, sampling: Sampling) -> dict[str, Any]:
    """``generate`` kwargs: greedy for the greedy rule, else the run's transform (no HF default top-k)."""
    if rule == "greedy" or sampling.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k or 0,
            "top_p": sampling.top_p or 1.0}


@dataclass(frozen=True)
class HFDescription:
    """Metadata on how the HF baselines were run."""

    start_tokens: int  # the assistant tokens HF's heuristic starts each prompt at
    confidence_adaptive: bool  # whether HF adapts its confidence threshold (it needs scikit-learn)
    heuristic: str = "HF 'heuristic', restarted at start_tokens on every prompt"
    counts: str = "forward hooks; accepted estimated as generated - target calls"


def describe_hf() -> HFDescription:
    """How the HF baselines run here (:class:`HFDescription`)."""
    return HFDescription(HF_START_TOKENS, is_sklearn_available())


@dataclass
class HFRunner:
    """Runs the ``hf-*`` families with HF assisted generation (rules ``speculative`` / ``greedy`` only).

    Every prompt starts from the draft's own generation config with the spec's schedule settings, so
    what HF adapts during a generation (the heuristic's number of assistant tokens) does not carry
    over to the next prompt: a prompt's output depends on its seed only, whatever ran before it.
    """

    trio: Trio
    sampling: Sampling
    max_new_tokens: int
    seed: int

    @torch.inference_mode()
    def assisted(self, spec: RunSpec, prompt: EncodedPrompt) -> torch.Tensor:
        """``[1, n]`` prompt and generated tokens of ``target.generate(assistant_model=draft)`` on one prompt."""
        if spec.rule not in ("speculative", "greedy"):
            raise ValueError(f"HF assisted generation implements the speculative and greedy rules, not {spec.rule!r}")
        draft = self.trio.draft
        saved = draft.generation_config
        draft.generation_config = copy.deepcopy(saved)
        spec.policy.schedule().apply(draft.generation_config)
        try:
            return self.target_alone(spec.rule, prompt, assistant_model=draft)
        finally:
            draft.generation_config = saved

    @torch.inference_mode()
    def target_alone(self, rule: str, prompt: EncodedPrompt, **assistant: Any) -> torch.Tensor:
        """``[1, n]`` prompt and generated tokens of the target's own ``generate`` on one prompt (greedy for the
        greedy rule, else the run's sampling), seeded as every run of the prompt."""
        target = self.trio.target
        config = target.generation_config
        kwargs = {**sampling_kwargs(rule, self.sampling), "max_new_tokens": self.max_new_tokens,
                  "pad_token_id": pad_id(config.pad_token_id, config.eos_token_id)}
        ids = torch.tensor([prompt.token_ids], device=target.device)
        torch.manual_seed(prompt_seed(self.seed, prompt.prompt_id))
        return target.generate(ids, attention_mask=torch.ones_like(ids), **assistant, **kwargs)

    @torch.inference_mode()
    def run(self, spec: RunSpec, prompts: PromptSet, with_quality: bool) -> list[GenerationRecord]:
        """Decode every prompt of the set with HF assisted generation, seeded per prompt."""
        records = []
        for prompt in prompts.prompts:
            counters = CallCounter(self.trio.target), CallCounter(self.trio.draft)
            start = time.perf_counter()
            try:
                sequences = self.assisted(spec, prompt)
            finally:
                for counter in counters:
                    counter.remove()
            wall = time.perf_counter() - start
            length = len(prompt.token_ids)
            generated = sequences.shape[1] - length
            target_calls, draft_calls = counters[0].calls, counters[1].calls
            accepted = max(0, generated - target_calls)
            generation = Generation(
                prompt_id=prompt.prompt_id, seed=prompt_seed(self.seed, prompt.prompt_id), generated=generated,
                target_calls=target_calls, draft_calls=draft_calls, companion_calls=0, drafted=draft_calls,
                accepted=accepted, discarded=max(0, draft_calls - accepted), rounds=target_calls, verified=draft_calls,
                wall_s=wall, output_sha=output_sha(sequences, length, generated),
            )
            if with_quality:
                generation = generation.with_quality(self.trio.target, sequences, length)
            records.append(generation.record(spec, prompts, "hf"))
        return records


@dataclass
class SERunner:
    """Runs the ``se-*`` families: the ensemble of ``[draft, target]`` in the spec's mode."""

    trio: Trio
    sampling: Sampling
    rules: RulesConfig
    max_new_tokens: int
    seed: int

    @torch.inference_mode()
    def run(self, spec: RunSpec, prompts: PromptSet, with_quality: bool) -> list[GenerationRecord]:
        """Decode every prompt of the set with :class:`decode.EnsembleDecoder`, seeded per prompt."""
        policy = spec.policy
        mode = policy.mode
        gamma = [policy.gamma, 1] if policy.gamma is not None else None
        ensemble = build_rule("ensemble", self.rules, value=spec.rule_param)
        decoder = decode.EnsembleDecoder([self.trio.draft, self.trio.target], ensemble=ensemble,
                                         proposal_lengths=gamma, mode=mode, sampling=self.sampling)
        records = []
        for prompt in prompts.prompts:
            item_seed = prompt_seed(self.seed, prompt.prompt_id)
            out = decoder.generate(prompt.token_ids, max_new_tokens=self.max_new_tokens, seed=item_seed)
            stats = out.stats
            generation = Generation(
                prompt_id=prompt.prompt_id, seed=item_seed, generated=stats.generated, target_calls=stats.calls[1],
                draft_calls=stats.calls[0], companion_calls=0, drafted=sum(stats.proposed), accepted=stats.accepted,
                discarded=stats.rejected + stats.discarded, rounds=stats.calls[1],
                verified=stats.scored[1] - stats.calls[1], wall_s=stats.wall_time_s,
                output_sha=output_sha(out.sequences, len(prompt.token_ids), stats.generated),
            )
            if with_quality:
                generation = generation.with_quality(self.trio.target, out.sequences, len(prompt.token_ids))
            records.append(generation.record(spec, prompts, "ensemble"))
        return records
