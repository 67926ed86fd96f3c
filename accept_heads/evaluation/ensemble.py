"""Speculative Ensemble runs (DESIGN §4) with :class:`decode.EnsembleDecoder` on the draft + target pair.

Families: ``se-plain`` (both models every token: the baseline), ``se-sd`` (the draft proposes γ,
the target scores) and ``se-alternate`` (SE's alternate proposals, γ for the draft, 1 for the
target). The ensemble is the configured ``ensemble`` rule's ``r`` (weighted λ or contrastive μ).
Per-call lengths are not recorded: ``verified`` is the positions the target scored beyond one per
call (the cost model charges the mean length, :func:`accept_heads.evaluation.table.verification_units`).
"""

from __future__ import annotations

from typing import Any

import torch

import decode
from ahconf.schema import RulesConfig
from data_gen.seeding import prompt_seed
from data_gen.models import Trio
from decode.sampling import Sampling

from accept_heads.evaluation.runs import Generation, RunSpec, build_rule
from accept_heads.evaluation.sets import PromptSet

def available() -> bool:
    """Whether this ``decode`` has the ensemble decoder (the SE runs are skipped otherwise)."""
    return hasattr(decode, "EnsembleDecoder")


@torch.inference_mode()
def run_se(spec: RunSpec, trio: Trio, prompts: PromptSet, sampling: Sampling, rules: RulesConfig,
           max_new_tokens: int, seed: int, with_quality: bool) -> list[dict[str, Any]]:
    """Decode every prompt of the set with the ensemble of ``[draft, target]`` in the spec's mode."""
    mode = spec.family.removeprefix("se-")
    gamma = [int(spec.param), 1] if spec.param is not None else None
    decoder = decode.EnsembleDecoder([trio.draft, trio.target], ensemble=build_rule("ensemble", spec.rule_param, rules),
                                     proposal_lengths=gamma, mode=mode, sampling=sampling)
    records = []
    for prompt in prompts.prompts:
        item_seed = prompt_seed(seed, prompt.prompt_id)
        out = decoder.generate(prompt.token_ids, max_new_tokens=max_new_tokens, seed=item_seed)
        stats = out.stats
        generation = Generation(
            prompt_id=prompt.prompt_id, seed=item_seed, generated=stats.generated, target_calls=stats.calls[1],
            draft_calls=stats.calls[0], companion_calls=0, drafted=sum(stats.proposed), accepted=stats.accepted,
            discarded=stats.rejected + stats.discarded, rounds=stats.calls[1],
            verified=stats.scored[1] - stats.calls[1], wall_s=stats.wall_time_s,
        )
        if with_quality:
            generation = generation.with_quality(trio.target, out.sequences, len(prompt.token_ids))
        records.append(generation.record(spec, prompts, "ensemble"))
    return records
