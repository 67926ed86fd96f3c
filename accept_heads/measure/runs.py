"""One evaluation run = one rule × one length policy decoding one prompt set; a row per generation.

:class:`RunSpec` names a run, :class:`Generation` is its record per prompt, :class:`Runner` is what
decodes a run: :class:`DecoderRunner` (our decoder's policies, :mod:`decode.policy_specs`) here, the HF and SE
baselines in :mod:`accept_heads.evaluation.baselines`. Counts and costs: DESIGN §5.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol

import pandas as pd
import torch
from transformers import PreTrainedModel

from accept_heads.measure.families import family
from accept_heads.measure.inputs import Artifacts, PromptSet
from accept_heads.measure.specs import RunPolicy
from ahconf.rule_config import build_rule
from ahconf.schema import RulesConfig
from decode import SpeculativeDecoder
from decode.batch_costs import BatchCosts
from decode.costs import CostModel
from decode.policies.base import DEFAULT_K_MAX, Policy, PolicyInputs
from decode.policies.schedules import TargetOnly
from decode.policy_specs import PolicySpec
from decode.sampling import Sampling
from decode.stats import DecodeStats
from runtime.models import Trio
from runtime.seeding import prompt_seed


@dataclass(frozen=True)
class RunSpec:
    """What one run decodes: a prompt set, a rule and a typed policy (ours or a baseline); also the key
    columns of the results table, where the policy appears flat as ``family``, ``param`` and ``artifact``.

    ``rule_param``: the fuzzy threshold T or the ensemble λ / μ. ``chosen_on``: ``dev`` when the
    swept parameter (the policy's; ``rule_param`` in the FSD T sweep) was selected on the dev split,
    ``grid`` for another point of a swept grid, ``""`` when nothing is chosen (no parameter, or one
    fixed by the config).
    """

    set: str
    rule: str
    policy: RunPolicy
    rule_param: float | None = None
    chosen_on: str = ""

    @property
    def family(self) -> str:
        return self.policy.kind

    @property
    def param(self) -> float | None:
        """The policy's swept parameter: K, τ, h, γ or SV's drafted k."""
        return self.policy.value

    @property
    def artifact(self) -> str | None:
        return self.policy.artifact

    @property
    def label(self) -> str:
        """Short policy name, e.g. ``fixed(K=4)``, ``head[pre](h=0.8)``, ``hf-confidence(τ=0.4)``."""
        name = self.family + (f"[{self.artifact}]" if self.artifact else "")
        if self.param is None:
            return name
        symbol = family(self.family).symbol
        whole = symbol in ("K", "γ", "k") and float(self.param).is_integer()  # a count (AdaEDL's γ is not one)
        value = int(self.param) if whole else self.param
        return f"{name}({symbol}={value})"

    def to_dict(self) -> dict[str, Any]:
        """The flat key columns of the results table (and the policy's label)."""
        return {"set": self.set, "rule": self.rule, "family": self.family, "param": self.param,
                "artifact": self.artifact, "rule_param": self.rule_param, "chosen_on": self.chosen_on,
                "policy": self.label}



def quality(target: PreTrainedModel, sequences: torch.Tensor, prompt_length: int) -> tuple[float, float]:
    """Agreement of the output with the target's greedy token at each of its prefixes, and the target NLL."""
    tokens = sequences[0, prompt_length:]
    if tokens.numel() == 0:
        return math.nan, math.nan
    logits = target(input_ids=sequences[:, :-1]).logits[0, prompt_length - 1 :].float()
    agreement = (logits.argmax(-1) == tokens).float().mean()
    nll = torch.nn.functional.cross_entropy(logits, tokens)
    return float(agreement), float(nll)


def output_sha(sequence: torch.Tensor, prompt_length: int, generated: int) -> str:
    """A short sha256 of the ``generated`` tokens after the prompt (``sequence``: 1-D or ``[1, n]``): two runs of a
    prompt produced the same output exactly when these match."""
    tokens = sequence.reshape(-1)[prompt_length : prompt_length + generated].to("cpu", torch.int64)
    return hashlib.sha256(tokens.numpy().tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class Generation:
    """One prompt decoded by one run: the counts the results table sums per run (DESIGN §5).

    HF and SE runs record no per-position offers / acceptances and no per-round verified lengths
    (empty lists; the cost model then charges the mean length). ``batch``: how many prompts were
    decoded together; in a batch ``wall_s`` is this row's equal share of the batch's wall time,
    so only ``batch == 1`` generations time the models (the cost fit's tuples). ``output_sha``:
    :func:`output_sha` of its tokens (the wall-clock stage checks it reproduced them).
    """

    prompt_id: str
    seed: int
    generated: int
    target_calls: int
    draft_calls: int
    companion_calls: int
    drafted: int
    accepted: int
    discarded: int
    rounds: int
    verified: int
    wall_s: float
    output_sha: str
    position_offered: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    verified_per_round: list[int] = field(default_factory=list)
    estimates: list[float] = field(default_factory=list)  # the policy's P̂ of each candidate with an observed outcome
    estimate_outcomes: list[int] = field(default_factory=list)  # and that outcome (1: accepted)
    batch: int = 1
    # its policy's acceptance source as priced (decode.costs.CostModel.price; None: none priced), the estimates the
    # source made and the verified rounds it folded (DESIGN §5)
    source_key: str | None = None
    source_calls: int = 0
    source_updates: int = 0
    target_agreement: float = math.nan
    target_nll: float = math.nan

    @classmethod
    def of(cls, prompt_id: str, seed: int, stats: DecodeStats, sequence: torch.Tensor, prompt_length: int,
           batch: int = 1) -> Generation:
        """The record of one generation of our decoder (one row of a batch of ``batch``)."""
        return cls(
            prompt_id=prompt_id, seed=seed, generated=stats.generated, target_calls=stats.target_calls,
            draft_calls=stats.draft_calls, companion_calls=stats.companion_calls, drafted=stats.drafted,
            accepted=stats.accepted, discarded=stats.discarded, rounds=stats.rounds,
            verified=sum(stats.verified_per_round), wall_s=stats.wall_time_s / batch,
            output_sha=output_sha(sequence, prompt_length, stats.generated),
            position_offered=list(stats.position_offered), position_accepted=list(stats.position_accepted),
            verified_per_round=list(stats.verified_per_round), estimates=list(stats.estimates),
            estimate_outcomes=list(stats.estimate_outcomes), batch=batch, source_key=stats.source_key,
            source_calls=stats.source_calls, source_updates=stats.source_updates,
        )

    def with_quality(self, target: PreTrainedModel, sequences: torch.Tensor, prompt_length: int) -> Generation:
        """This record with the output's agreement with the target's greedy tokens and its target NLL."""
        agreement, nll = quality(target, sequences, prompt_length)
        return replace(self, target_agreement=agreement, target_nll=nll)

    def record(self, spec: RunSpec, prompts: PromptSet, source: Source) -> GenerationRecord:
        """This generation as a row of ``generations.parquet``: of run ``spec`` on ``prompts``, by ``source``."""
        return GenerationRecord(spec, prompts.role, prompts.split, source, self)


#: Which runner decoded a generation: our decoder, HF assisted generation, or the ensemble decoder.
Source = Literal["decode", "hf", "ensemble"]


class Record(Protocol):
    """A typed record that becomes one row of a results frame."""

    def row(self) -> dict[str, Any]:
        """Its flat columns, in the frame's column order."""
        ...


def frame(records: Sequence[Record]) -> pd.DataFrame:
    """The records as a frame, one row each."""
    return pd.DataFrame([record.row() for record in records])


@dataclass(frozen=True)
class GenerationRecord:
    """One row of ``generations.parquet``: which run decoded which set's prompt, with which runner, and its counts."""

    run: RunSpec
    role: str  # dev / test / ood
    split: str  # the prompt source's split
    source: Source
    generation: Generation

    def row(self) -> dict[str, Any]:
        """The run's key columns, the set's, the source, then the generation's counts."""
        return {**self.run.to_dict(), "role": self.role, "split": self.split, "source": self.source,
                **asdict(self.generation)}


class Runner(Protocol):
    """Decodes the runs of some families: a record (:meth:`Generation.record`) per prompt of the set."""

    def run(self, spec: RunSpec, prompts: PromptSet, with_quality: bool) -> list[GenerationRecord]:
        """Decode every prompt of ``prompts`` as ``spec`` says; ``with_quality``: also score the outputs."""
        ...


@dataclass
class DecoderRunner:
    """Builds rules and policies for run specs and decodes prompt sets with :class:`SpeculativeDecoder`."""

    trio: Trio
    sampling: Sampling
    rules: RulesConfig
    artifacts: Artifacts
    max_new_tokens: int
    seed: int
    k_min: int = 1
    k_max: int = DEFAULT_K_MAX
    costs: CostModel | None = None  # the model the goodput head stops by (the evaluation's ``cost`` model)
    batch_size: int = 1  # prompts per batched generate (kinds whose rows decide as alone: the family's rows_alone)
    timed_prompts: int = 0  # the first this-many prompts of a batched run decode alone (they time the models)
    compile: bool = False  # one prompt decodes with static caches and compiled forwards (decode.compile)

    def policy(self, spec: RunSpec, batch_costs: BatchCosts | None = None) -> Policy:
        """The length policy of ``spec`` (heads keep the K range they were calibrated with); with measured
        ``batch_costs`` the goodput head and SV decide at a batch's prices (the evaluation's batch axis)."""
        inputs = PolicyInputs(self.artifacts.heads, self.artifacts.profiles, self.costs, batch_costs, self.k_min,
                              self.k_max)
        if not isinstance(spec.policy, PolicySpec):
            raise ValueError(f"{spec.label} is not a length policy of our decoder")
        return spec.policy.build(inputs)

    def decoder(self, spec: RunSpec, batch_costs: BatchCosts | None = None) -> SpeculativeDecoder:
        """Our decoder for ``spec`` (its policy as :meth:`policy` builds it)."""
        policy = self.policy(spec, batch_costs)
        companion = self.trio.companion if policy.companion is not None else None
        rule = build_rule(spec.rule, self.rules, value=spec.rule_param)
        return SpeculativeDecoder(self.trio.target, self.trio.draft, rule=rule, policy=policy, companion=companion,
                                  sampling=self.sampling, compile=self.compile)

    def target_alone(self, rule: str) -> SpeculativeDecoder:
        """The target alone in our loop (:class:`~decode.policies.TargetOnly`) under ``rule``."""
        return SpeculativeDecoder(self.trio.target, self.trio.draft, rule=build_rule(rule, self.rules),
                                  policy=TargetOnly(), sampling=self.sampling, compile=self.compile)

    @torch.inference_mode()
    def run(self, spec: RunSpec, prompts: PromptSet, with_quality: bool) -> list[GenerationRecord]:
        """Decode every prompt of the set, seeded per prompt (the same seeds for every policy and batch size).

        Kinds whose rows decide as alone (their family's ``rows_alone``) decode ``batch_size`` prompts per batched
        generate after the first ``timed_prompts`` (alone); each row decodes as it would alone (same seed, same
        decisions), so only the wall-clock columns depend on the batching.
        """
        decoder = self.decoder(spec)
        items = prompts.prompts
        alone = len(items) if self.batch_size == 1 or not family(spec.family).rows_alone else self.timed_prompts
        generations: list[tuple[Generation, torch.Tensor, int]] = []
        for prompt in items[:alone]:
            seed = prompt_seed(self.seed, prompt.prompt_id)
            out = decoder.generate(prompt.token_ids, max_new_tokens=self.max_new_tokens, seed=seed)
            length = len(prompt.token_ids)
            generations.append((Generation.of(prompt.prompt_id, seed, out.stats, out.sequences, length),
                                out.sequences, length))
        for start in range(alone, len(items), self.batch_size):
            chunk = items[start : start + self.batch_size]
            seeds = [prompt_seed(self.seed, prompt.prompt_id) for prompt in chunk]
            out = decoder.generate([p.token_ids for p in chunk], max_new_tokens=self.max_new_tokens, seed=seeds)
            for prompt, seed, stats, sequence in zip(chunk, seeds, out.stats, out.sequences):
                length = len(prompt.token_ids)
                generations.append((Generation.of(prompt.prompt_id, seed, stats, sequence, length, batch=len(chunk)),
                                    sequence[None], length))
        if with_quality:
            generations = [(g.with_quality(self.trio.target, seq, n), seq, n) for g, seq, n in generations]
        return [g.record(spec, prompts, "decode") for g, _, _ in generations]
