"""One evaluation run = one rule × one length policy decoding one prompt set; a row per generation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from ahconf.schema import RulesConfig
from data_gen.seeding import prompt_seed
from data_gen.models import Trio
from decode import SpeculativeDecoder, policies
from decode.costs import CostModel
from decode import rules as rule_defs
from decode.sampling import Sampling
from decode.stats import DecodeStats

from accept_heads.evaluation.artifacts import Artifacts
from accept_heads.evaluation.sets import PromptSet

#: Length-policy families of :mod:`decode.policies`, in table order.
DECODE_FAMILIES = ("fixed", "heuristic", "confidence", "head", "head-goodput", "sv", "oracle")
#: The symbol of each family's ``param``.
SYMBOLS = {"fixed": "K", "hf-constant": "K", "confidence": "τ", "hf-confidence": "τ", "head": "h",
           "se-sd": "γ", "se-alternate": "γ"}


@dataclass(frozen=True)
class RunSpec:
    """What one run decodes; also the key columns of the results table.

    ``param``: K (fixed, hf-constant), τ (confidence, hf-confidence), h (head) or γ (se-sd,
    se-alternate). ``rule_param``: the fuzzy threshold T or the ensemble λ / μ. ``chosen_on``:
    ``dev`` when the swept parameter (``param``; ``rule_param`` in the FSD T sweep) was selected on
    the dev split, ``grid`` for another point of a swept grid, ``""`` when nothing is chosen (no
    parameter, or one fixed by the config).
    """

    set: str
    rule: str
    family: str
    param: float | None = None
    artifact: str | None = None
    rule_param: float | None = None
    chosen_on: str = ""

    @property
    def label(self) -> str:
        """Short policy name, e.g. ``fixed(K=4)``, ``head[pre](h=0.8)``, ``hf-confidence(τ=0.4)``."""
        name = self.family + (f"[{self.artifact}]" if self.artifact else "")
        if self.param is None:
            return name
        symbol = SYMBOLS[self.family]
        value = int(self.param) if symbol in ("K", "γ") else self.param
        return f"{name}({symbol}={value})"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "policy": self.label}


def rule_param(name: str, rules: RulesConfig) -> float | None:
    """The configured parameter of a rule: fuzzy T, ensemble λ (weighted) or μ (contrastive)."""
    if name == "fuzzy":
        return rules.fuzzy_threshold
    if name == "ensemble":
        return rules.ensemble_weight if rules.ensemble_kind == "weighted" else rules.ensemble_mu
    return None


def build_rule(name: str, param: float | None, rules: RulesConfig) -> rule_defs.Rule:
    """The rule a run decodes with (fuzzy divergence and ensemble kind from ``rules``)."""
    if name == "fuzzy":
        return rule_defs.Fuzzy(rules.fuzzy_divergence, param)
    if name == "ensemble":
        if rules.ensemble_kind == "weighted":
            return rule_defs.Ensemble("weighted", weight=param)
        return rule_defs.Ensemble("contrastive", mu=param)
    return rule_defs.from_spec(name)


def quality(target: PreTrainedModel, sequences: torch.Tensor, prompt_length: int) -> tuple[float, float]:
    """Agreement of the output with the target's greedy token at each of its prefixes, and the target NLL."""
    tokens = sequences[0, prompt_length:]
    if tokens.numel() == 0:
        return math.nan, math.nan
    logits = target(input_ids=sequences[:, :-1]).logits[0, prompt_length - 1 :].float()
    agreement = (logits.argmax(-1) == tokens).float().mean()
    nll = torch.nn.functional.cross_entropy(logits, tokens)
    return float(agreement), float(nll)


def stats_record(stats: DecodeStats) -> dict[str, Any]:
    """Counts of one generation (plus its per-position offers / acceptances and verified lengths) as a flat record."""
    return {
        "generated": stats.generated, "target_calls": stats.target_calls, "draft_calls": stats.draft_calls,
        "companion_calls": stats.companion_calls, "drafted": stats.drafted, "accepted": stats.accepted,
        "discarded": stats.discarded, "rounds": stats.rounds, "position_offered": list(stats.position_offered),
        "position_accepted": list(stats.position_accepted), "verified": sum(stats.verified_per_round),
        "verified_per_round": list(stats.verified_per_round), "wall_s": stats.wall_time_s,
    }


@dataclass
class Decoding:
    """Builds rules and policies for run specs and decodes prompt sets with :class:`SpeculativeDecoder`."""

    trio: Trio
    sampling: Sampling
    rules: RulesConfig
    artifacts: Artifacts
    max_new_tokens: int
    seed: int
    k_min: int = 1
    k_max: int = 20
    costs: CostModel | None = None  # the model the goodput head stops by (the evaluation's ``cost`` model)

    def policy(self, spec: RunSpec) -> policies.Policy:
        """The length policy of ``spec`` (heads keep the K range they were calibrated with)."""
        if spec.family == "fixed":
            return policies.Fixed(int(spec.param))
        if spec.family == "heuristic":
            return policies.Heuristic(k0=min(5, self.k_max), k_max=self.k_max)
        if spec.family == "confidence":
            return policies.Confidence(spec.param, k_max=self.k_max)
        if spec.family == "head":
            head = self.artifacts.heads[spec.artifact]
            k_min, k_max = head.metadata.get("k_min", self.k_min), head.metadata.get("k_max", self.k_max)
            return policies.Head(head, threshold=spec.param, k_min=k_min, k_max=k_max)
        if spec.family == "head-goodput":
            if self.costs is None:
                raise ValueError("a head-goodput run needs Decoding.costs (the cost model it stops by)")
            head = self.artifacts.heads[spec.artifact]
            k_min, k_max = head.metadata.get("k_min", self.k_min), head.metadata.get("k_max", self.k_max)
            return policies.GoodputHead(head, self.costs, k_min=k_min, k_max=k_max)
        if spec.family == "sv":
            profile = self.artifacts.profiles[spec.artifact]
            return policies.SV(profile, k=int(profile.metadata.get("k_max", profile.latency.numel())))
        if spec.family == "oracle":
            return policies.Oracle()
        raise ValueError(f"unknown policy family {spec.family!r}; valid: {', '.join(DECODE_FAMILIES)}")

    def decoder(self, spec: RunSpec) -> SpeculativeDecoder:
        policy = self.policy(spec)
        companion = self.trio.companion if policy.companion is not None else None
        return SpeculativeDecoder(self.trio.target, self.trio.draft, rule=build_rule(spec.rule, spec.rule_param, self.rules),
                                  policy=policy, companion=companion, sampling=self.sampling)

    @torch.inference_mode()
    def run(self, spec: RunSpec, prompts: PromptSet, with_quality: bool) -> list[dict[str, Any]]:
        """Decode every prompt of the set (seeded per prompt: the same seeds for every policy)."""
        decoder = self.decoder(spec)
        records = []
        for prompt in prompts.prompts:
            seed = prompt_seed(self.seed, prompt.prompt_id)
            out = decoder.generate(prompt.token_ids, max_new_tokens=self.max_new_tokens, seed=seed)
            agreement, nll = (quality(self.trio.target, out.sequences, len(prompt.token_ids))
                              if with_quality else (math.nan, math.nan))
            records.append({**spec.to_dict(), **prompts.key(), "source": "decode", "prompt_id": prompt.prompt_id,
                            "seed": seed,
                            **stats_record(out.stats), "target_agreement": agreement, "target_nll": nll})
        return records
