"""How good a feature draft is, by depth in the round, along the target's own responses (``docs/real.md``).

Per prompt set, along T = 1 responses: ``1 − TV(p, q)`` at depth ``d`` is measured as decoding sees it: the
draft reads the target's features up to the round's start, then its own outputs for ``d − 1`` steps
(:func:`decode.drafts.feature_model.depth_hidden`: every round start at once, one forward per depth). Greedy agreement at
depth 1 is on the target's greedy responses. The old draft's acceptance on the same positions stands beside it. Its
cost is one single-token forward at batch 1 on a cached context, as a share of the target's, the models taking
turns.

Per depth two figures: *unconditional*, the mean over round starts of ``Π_{i≤d} α_i`` along the same round (the
chance its first ``d`` candidates are all accepted, the target's tokens standing in for the accepted ones), and
*conditional*, its ratio to depth ``d − 1`` (acceptance at ``d`` given ``1 .. d − 1`` accepted). The modelled
speed-up of a fixed K is ``(1 + Σ_{j≤K} unconditional_j) / (K c + v_K)``, ``v_K`` the target's forward of
``K + 1`` tokens over its single-token one, measured beside the draft's step (flat, ``v_K = 1``, in records from
before it; every table says which).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from decode.batch_costs import forward_tables
from decode.drafts.feature_model import FeatureDraftForCausalLM, depth_hidden, feature_reads, target_features
from decode.json_types import JSONDict
from model_build.zoo.realism import RealismCheck, sample_responses

CHUNK = 16  # prompts per generation batch


@dataclass(frozen=True)
class FeatureTargets:
    """The issue's goals for a feature draft (held out)."""

    depth1: float = 0.58
    mean_depths: float = 0.45  # averaged over depths 1..4
    cost: float = 0.08


@dataclass(frozen=True)
class DepthFigures:
    """One prompt set's figures."""

    name: str
    role: str  # dev | ood
    prompts: int
    positions: int  # T = 1 response positions scored at depth 1
    acceptance: tuple[float, ...]  # mean 1 − TV at depth 1, 2, ... over every position reached at that depth
    greedy_agreement: float  # depth 1, on greedy responses
    old_acceptance: float | None  # the other draft on the same positions
    reached: tuple[float, ...] = ()  # unconditional: mean over rounds of Π_{i≤d} α_i (empty in records before it)

    @property
    def mean_acceptance(self) -> float:
        return sum(self.acceptance) / len(self.acceptance)

    @property
    def conditional(self) -> tuple[float, ...]:
        """Acceptance at depth ``d`` given depths ``1 .. d − 1`` accepted (``reached_d / reached_{d−1}``)."""
        before = (1.0, *self.reached[:-1])
        return tuple(now / max(last, 1e-12) for now, last in zip(self.reached, before))

    @property
    def expected_chain(self) -> tuple[float, ...]:
        """``Π_{i≤d}`` acceptance per depth: measured per round where recorded, else the depth means multiplied."""
        if self.reached:
            return self.reached
        chain, out = 1.0, []
        for alpha in self.acceptance:
            chain *= alpha
            out.append(chain)
        return tuple(out)


@dataclass(frozen=True)
class FeatureRealism:
    """Every figure of a feature draft on its target."""

    sets: tuple[DepthFigures, ...]
    cost: float  # feature-draft step / target step, batch 1
    old_cost: float | None
    dtype: str
    verify_costs: tuple[float, ...] = ()  # T(k + 1) / T(1) for k = 1, 2, ...: verifying k candidates (empty: flat)

    def verification(self, k: int) -> float:
        """A verification of ``k`` candidates over one target step: measured where recorded, else 1 (flat)."""
        return self.verify_costs[k - 1] if k <= len(self.verify_costs) else 1.0

    @property
    def priced(self) -> str:
        """How the modelled speed-ups price a round, in words."""
        return ("verification of K candidates at the measured T(K + 1) / T(1)" if self.verify_costs
                else "verification priced flat (one target step whatever it verifies)")

    def modelled_speedup(self, figures: DepthFigures, k: int, cost: float | None = None) -> float:
        """Tokens per unit time of a fixed ``k`` over the target alone: ``(1 + Σ_{j≤k} Π_{i≤j} α_i) / (k c + v_k)``
        (:attr:`DepthFigures.expected_chain`; ``v_k`` = :meth:`verification`)."""
        expected = 1.0 + sum(figures.expected_chain[:k])
        return expected / (k * (self.cost if cost is None else cost) + self.verification(k))

    def best_fixed_k(self, figures: DepthFigures) -> tuple[int, float]:
        """The fixed K (within the measured depths) with the highest modelled speed-up, and that speed-up."""
        return max(((k, self.modelled_speedup(figures, k)) for k in range(1, len(figures.acceptance) + 1)),
                   key=lambda pair: pair[1])

    def checks(self, targets: FeatureTargets = FeatureTargets()) -> list[RealismCheck]:
        """Depth-1 and mean acceptance per set, and the cost, against the goals."""
        checks = []
        for one in self.sets:
            checks += [
                RealismCheck(f"{one.name}/depth1", "1 - TV at depth 1, T = 1", f"{one.acceptance[0]:.3f}",
                             f">= {targets.depth1}", one.acceptance[0] - targets.depth1),
                RealismCheck(f"{one.name}/mean", f"1 - TV averaged over depths 1-{len(one.acceptance)}",
                             f"{one.mean_acceptance:.3f}", f">= {targets.mean_depths}",
                             one.mean_acceptance - targets.mean_depths),
            ]
        return checks + [RealismCheck("cost", f"draft step / target step, batch 1, {self.dtype}", f"{self.cost:.3f}",
                                      f"<= {targets.cost}", targets.cost - self.cost)]

    def to_dict(self) -> JSONDict:
        return {**asdict(self), "sets": [asdict(s) for s in self.sets]}

    @classmethod
    def from_dict(cls, data: JSONDict) -> FeatureRealism:
        data = {**data, "verify_costs": tuple(data.get("verify_costs", ()))}
        sets = tuple(DepthFigures(**{**s, "acceptance": tuple(s["acceptance"]), "reached": tuple(s.get("reached", ()))})
                     for s in data["sets"])
        return cls(**{**data, "sets": sets})


def overlap(log_p: Tensor, log_q: Tensor) -> Tensor:
    """``Σ min(p, q)`` over the last dimension (1 − TV)."""
    return torch.minimum(log_p.exp(), log_q.exp()).sum(-1)


@dataclass
class _Sums:
    overlap: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def add(self, depth: int, value: float) -> None:
        while len(self.overlap) < depth:
            self.overlap.append(0.0)
            self.counts.append(0)
        self.overlap[depth - 1] += value
        self.counts[depth - 1] += 1

    def means(self) -> tuple[float, ...]:
        return tuple(o / max(c, 1) for o, c in zip(self.overlap, self.counts))


def round_products(overlaps: list[list[float]]) -> list[list[float]]:
    """Per depth ``d``, ``Π_{i≤d} α_i`` of every round start reaching ``d`` (``overlaps[d − 1][s]``: depth ``d`` of
    the round started at index ``s``, the same ``s`` at every depth)."""
    products, chain = [], None
    for values in overlaps:
        chain = list(values) if chain is None else [a * b for a, b in zip(chain, values)]
        products.append(chain)
    return products


def _rounds(target: PreTrainedModel, draft: FeatureDraftForCausalLM, ids: Tensor, depths: int
            ) -> tuple[Tensor, list[Tensor]]:
    """The target's log p ``[L, V]`` along ``ids [1, L]`` (row ``u`` predicts token ``u + 1``) and the draft's log q
    ``[L, V]`` at each depth of a round (:func:`decode.drafts.feature_model.depth_hidden`), from one target forward."""
    out = target(ids, output_hidden_states=True)
    mask = torch.ones_like(ids)
    reads = feature_reads(draft.fuse_features(target_features(out.hidden_states, draft.feature_layers)), mask)
    head = draft.get_output_embeddings()
    log_q = [head(hidden[0]).float().log_softmax(-1) for hidden in depth_hidden(draft, ids, mask, reads, depths)]
    return out.logits[0].float().log_softmax(-1), log_q


@torch.inference_mode()
def depth_overlaps(target: PreTrainedModel, draft: FeatureDraftForCausalLM, sequence: list[int], prompt: int,
                   depths: int, old: PreTrainedModel | None = None) -> tuple[list[list[float]], list[float]]:
    """Per depth, ``Σ min(p, q)`` at every response token reached at that depth (rounds start at the last prompt
    token or later); and the old draft's at depth 1."""
    ids = torch.tensor([sequence], device=target.device)
    log_p, log_q = _rounds(target, draft, ids, depths)
    last = len(sequence) - 1  # row `last` predicts nothing
    overlaps = [overlap(log_p[prompt - 2 + depth:last], q[prompt - 2 + depth:last]).tolist()
                for depth, q in enumerate(log_q, 1)]
    old_overlaps: list[float] = []
    if old is not None:
        log_o = old(ids).logits[0].float().log_softmax(-1)
        old_overlaps = overlap(log_p[prompt - 1:last], log_o[prompt - 1:last]).tolist()
    return overlaps, old_overlaps


@torch.inference_mode()
def greedy_agreement(target: PreTrainedModel, draft: FeatureDraftForCausalLM, sequence: list[int],
                     prompt: int) -> tuple[int, int]:
    """(depth-1 agreements, positions) of the draft's argmax with ``sequence``'s response tokens."""
    ids = torch.tensor([sequence], device=target.device)
    guess = _rounds(target, draft, ids, 1)[1][0][prompt - 1:-1].argmax(-1)
    return int((guess == ids[0, prompt:]).sum()), len(sequence) - prompt


def measure_set(models: dict[str, PreTrainedModel], tokenizer: PreTrainedTokenizerBase, name: str, role: str,
                prompts: list[list[int]], *, tokens: int, seed: int, depths: int) -> DepthFigures:
    """The figures of one prompt set."""
    target, draft, old = models["target"], models["feature_draft"], models.get("draft")
    vocab = len(tokenizer)
    sums, reached, old_sum, old_count, agree, greedy_positions = _Sums(), _Sums(), 0.0, 0, 0, 0
    for start in range(0, len(prompts), CHUNK):
        chunk = prompts[start:start + CHUNK]
        for greedy in (False, True):
            batch = sample_responses(target, chunk, greedy, tokens, seed + start, tokenizer, vocab)
            for row, prompt in enumerate(chunk):
                sequence = prompt + batch.response_ids(row).tolist()
                if len(sequence) <= len(prompt):
                    continue
                if greedy:
                    hits, count = greedy_agreement(target, draft, sequence, len(prompt))
                    agree, greedy_positions = agree + hits, greedy_positions + count
                    continue
                overlaps, old_overlaps = depth_overlaps(target, draft, sequence, len(prompt), depths, old)
                for depth, (values, products) in enumerate(zip(overlaps, round_products(overlaps)), 1):
                    for value, product in zip(values, products):
                        sums.add(depth, value)
                        reached.add(depth, product)
                old_sum, old_count = old_sum + sum(old_overlaps), old_count + len(old_overlaps)
    return DepthFigures(name=name, role=role, prompts=len(prompts), positions=sums.counts[0],
                        acceptance=sums.means(), greedy_agreement=agree / max(greedy_positions, 1),
                        old_acceptance=old_sum / old_count if old_count else None, reached=reached.means())


@dataclass(frozen=True)
class StepCosts:
    """Shares of one target step (a single-token forward at batch 1 on a cached context)."""

    feature_draft: float  # the feature draft's step
    draft: float | None  # the tokens-only draft's step, where it was timed
    verify: tuple[float, ...]  # the target's forward of k + 1 tokens (verifying k candidates), k = 1, 2, ...


def step_costs(models: dict[str, PreTrainedModel], context: list[int], repeats: int, verify: int = 0) -> StepCosts:
    """Each draft's median single-token forward after a ``len(context)``-token cached prefix and the target's forward
    of ``k + 1`` tokens for ``k = 1 .. verify``, as shares of the target's single-token forward, every forward taking
    turns (:func:`decode.batch_costs.forward_tables`, the measurement the cost profile makes)."""
    roles = [role for role in ("target", "feature_draft", "draft") if role in models]
    tables = forward_tables({role: models[role] for role in roles}, (1,), verify + 1, len(context), repeats)
    target = tables["target"][0]  # [m − 1]: T(m)
    return StepCosts(tables["feature_draft"][0][0] / target[0],
                     tables["draft"][0][0] / target[0] if "draft" in tables else None,
                     tuple(seconds / target[0] for seconds in target[1:]))


def measure_feature_realism(models: dict[str, PreTrainedModel], tokenizer: PreTrainedTokenizerBase,
                            sets: dict[str, tuple[str, list[list[int]]]], *, tokens: int, seed: int, repeats: int,
                            depths: int, dtype: str, verify: tuple[float, ...] | None = None) -> FeatureRealism:
    """Every figure (``sets``: name → (role, prompt ids)); the costs on the first dev prompt. ``verify``: the
    target's ``T(k + 1) / T(1)`` measured already in this process (a draft compared with another is priced at the
    same verification, so their modelled K differ by their acceptance and step only); None: measured here."""
    figures = tuple(measure_set(models, tokenizer, name, role, prompts, tokens=tokens, seed=seed, depths=depths)
                    for name, (role, prompts) in sets.items())
    first_dev = next(prompts for role, prompts in sets.values() if role == "dev")[0]
    costs = step_costs(models, first_dev, repeats, verify=0 if verify is not None else depths)
    return FeatureRealism(figures, costs.feature_draft, costs.draft, dtype,
                          costs.verify if verify is None else verify)
