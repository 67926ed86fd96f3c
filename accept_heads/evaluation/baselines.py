"""HF assisted generation on the same pair and prompts: constant K, the heuristic schedule, a confidence threshold.

``target.generate(assistant_model=draft)`` with the draft's generation config set per schedule
(HF defaults otherwise: 20 assistant tokens to start). Target and draft forwards are counted with
forward hooks. HF does not report acceptances, so ``accepted`` is estimated as generated − target
calls (one target-emitted token per verification) and ``drafted`` as the draft's forward count,
which is also the verified total (per-round lengths are not recorded).
Without scikit-learn HF keeps the confidence threshold fixed (with it, HF adapts it online).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from transformers.utils import is_sklearn_available

from data_gen.seeding import prompt_seed
from data_gen.models import Trio
from decode.bench import CallCounter
from decode.sampling import Sampling

from accept_heads.evaluation.runs import Generation, RunSpec
from accept_heads.evaluation.sets import PromptSet

#: HF's default initial number of assistant tokens (``GenerationConfig.num_assistant_tokens``).
HF_START_TOKENS = 20


def assistant_settings(spec: RunSpec) -> dict[str, Any]:
    """The draft's generation-config fields for an ``hf-*`` run."""
    if spec.family == "hf-constant":
        return {"num_assistant_tokens_schedule": "constant", "num_assistant_tokens": int(spec.param),
                "assistant_confidence_threshold": 0.0}
    if spec.family == "hf-heuristic":
        return {"num_assistant_tokens_schedule": "heuristic", "num_assistant_tokens": HF_START_TOKENS,
                "assistant_confidence_threshold": 0.0}
    if spec.family == "hf-confidence":
        return {"num_assistant_tokens_schedule": "constant", "num_assistant_tokens": HF_START_TOKENS,
                "assistant_confidence_threshold": float(spec.param)}
    raise ValueError(f"not an HF baseline: {spec.family!r}")


def sampling_kwargs(rule: str, sampling: Sampling) -> dict[str, Any]:
    """``generate`` kwargs: greedy for the greedy rule, else the run's transform (no HF default top-k)."""
    if rule == "greedy" or sampling.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k or 0,
            "top_p": sampling.top_p or 1.0}


def describe() -> dict[str, Any]:
    """Metadata on how the baselines were run."""
    return {"start_tokens": HF_START_TOKENS, "heuristic": "persistent across the prompts of a run (HF 'heuristic')",
            "confidence_adaptive": is_sklearn_available(),
            "counts": "forward hooks; accepted estimated as generated - target calls"}


@torch.inference_mode()
def run_hf(spec: RunSpec, trio: Trio, prompts: PromptSet, sampling: Sampling, max_new_tokens: int, seed: int,
           with_quality: bool) -> list[dict[str, Any]]:
    """Decode every prompt of the set with HF assisted generation (rules ``speculative`` / ``greedy`` only)."""
    if spec.rule not in ("speculative", "greedy"):
        raise ValueError(f"HF assisted generation implements the speculative and greedy rules, not {spec.rule!r}")
    target, draft = trio.target, trio.draft
    saved = copy.deepcopy(draft.generation_config)
    for key, value in assistant_settings(spec).items():
        setattr(draft.generation_config, key, value)
    eos = target.generation_config.eos_token_id
    pad = target.generation_config.pad_token_id
    kwargs = {**sampling_kwargs(spec.rule, sampling), "max_new_tokens": max_new_tokens,
              "pad_token_id": pad if pad is not None else (eos if isinstance(eos, int) else 0)}
    records = []
    try:
        for prompt in prompts.prompts:
            ids = torch.tensor([prompt.token_ids], device=target.device)
            counters = CallCounter(target), CallCounter(draft)
            item_seed = prompt_seed(seed, prompt.prompt_id)
            torch.manual_seed(item_seed)
            start = time.perf_counter()
            try:
                sequences = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, **kwargs)
            finally:
                for counter in counters:
                    counter.remove()
            wall = time.perf_counter() - start
            generated = sequences.shape[1] - ids.shape[1]
            target_calls, draft_calls = counters[0].calls, counters[1].calls
            accepted = max(0, generated - target_calls)
            generation = Generation(
                prompt_id=prompt.prompt_id, seed=item_seed, generated=generated, target_calls=target_calls,
                draft_calls=draft_calls, companion_calls=0, drafted=draft_calls, accepted=accepted,
                discarded=max(0, draft_calls - accepted), rounds=target_calls, verified=draft_calls, wall_s=wall,
            )
            if with_quality:
                generation = generation.with_quality(target, sequences, ids.shape[1])
            records.append(generation.record(spec, prompts, "hf"))
    finally:
        draft.generation_config = saved
    return records
