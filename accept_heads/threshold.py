"""The head's stop threshold ``h``: decode dev prompts with ``policies.Head`` for each ``h``, keep the fastest.

Speed is the cost model of DESIGN §5 (:class:`decode.costs.CostModel`, companion calls at ``t_c``):
modelled throughput = generated tokens / modelled time, summed over the prompts. Every threshold decodes the
same prompts with the same seeds (each prompt's :func:`data_gen.seeding.prompt_seed`, as in the evaluation:
common random numbers), so the comparison is paired; :func:`accept_heads.selection.best_value` picks. The
prompts decode as one batch (:meth:`decode.SpeculativeDecoder.generate_batch`: each row decides as alone).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from transformers import PreTrainedModel

from accept_heads.selection import best_value
from decode import SpeculativeDecoder, policies
from decode.costs import CostModel
from decode.head import AcceptanceHead
from decode.rules import Rule
from decode.sampling import Sampling
from decode.stats import DecodeStats


@dataclass
class SweepRow:
    """Totals of one threshold over the calibration prompts."""

    threshold: float
    generated: int
    draft_calls: int
    target_calls: int
    discarded: int
    modelled_time: float
    throughput: float  # generated / modelled_time (tokens per modelled second)

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def sweep_thresholds(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    head: AcceptanceHead,
    *,
    rule: Rule,
    sampling: Sampling,
    prompts: list[list[int]],
    seeds: list[int],
    thresholds: list[float],
    k_min: int,
    k_max: int,
    max_new_tokens: int,
    cost: CostModel,
    companion: PreTrainedModel | None = None,
) -> list[SweepRow]:
    """Decode every prompt (with its seed) once per threshold; one :class:`SweepRow` per threshold."""
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    rows = []
    for threshold in thresholds:
        policy = policies.Head(head, threshold=threshold, k_min=k_min, k_max=k_max)
        use_companion = companion if head.config.companion_features else None
        decoder = SpeculativeDecoder(target, draft, rule=rule, policy=policy, companion=use_companion, sampling=sampling)
        totals = DecodeStats()
        for stats in decoder.generate(prompts, max_new_tokens=max_new_tokens, seed=seeds).stats:
            for name in ("generated", "draft_calls", "target_calls", "companion_calls", "rejected", "unverified"):
                setattr(totals, name, getattr(totals, name) + getattr(stats, name))
            totals.verified_per_round.extend(stats.verified_per_round)
        time = cost.time(totals)
        rows.append(
            SweepRow(
                threshold=threshold,
                generated=totals.generated,
                draft_calls=totals.draft_calls,
                target_calls=totals.target_calls,
                discarded=totals.discarded,
                modelled_time=time,
                throughput=totals.generated / time if time > 0 else 0.0,
            )
        )
    return rows


def best_threshold(rows: list[SweepRow]) -> float:
    """The threshold with the highest modelled throughput (the lowest threshold on ties)."""
    return best_value([row.threshold for row in rows], [row.throughput for row in rows])
