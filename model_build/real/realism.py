"""Does the built draft behave like a draft worth speculating with, on the prompts the evaluation decodes?

Per prompt set (the evaluation's dev prompts and HumanEval, both chat-wrapped as the experiment
renders them), along the target's own responses (``docs/real.md``):

- ``acceptance``: mean speculative acceptance ``1 − TV(p, q)`` along T = 1 responses;
- ``greedy agreement``: the share of positions of the target's greedy responses where the draft's
  argmax is the target's token;
- the companion's figures beside them, the draft's confidence AUROC and the greedy oracle's gain over
  the best fixed K (informative: no target).

Once per pair: the draft's and companion's cost of one forward at batch 1 as a share of the target's
(median over rounds that take turns, in the pair's precision, on this machine), and held-out loss
(nats/token) of the three models on the dev T = 1 responses' tokens that the draft's vocabulary
covers (off it the reduced-vocabulary draft has probability zero).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from data_gen.generation import Batch, teacher_forced_logits
from decode.json_types import JSONDict
from decode.timing import CachedForward, medians_taking_turns
from model_build.zoo.realism import (
    RealismCheck,
    acceptance,
    auroc,
    greedy_oracle_gain,
    sample_responses,
    sampled_outcomes,
)

CHUNK = 16  # prompts per generation / scoring batch: bounds the [B, T, V] logits held at once


@dataclass(frozen=True)
class PairTargets:
    """What the draft should reach, per prompt-set role (dev, ood) and once per pair."""

    acceptance: dict[str, float] = field(default_factory=lambda: {"dev": 0.55, "ood": 0.50})
    greedy_agreement: dict[str, float] = field(default_factory=lambda: {"dev": 0.60, "ood": 0.50})
    draft_cost: float = 0.20


@dataclass(frozen=True)
class SetFigures:
    """The figures of one prompt set."""

    name: str
    role: str  # dev | ood
    prompts: int
    positions: int  # T = 1 response positions scored
    acceptance: float
    companion_acceptance: float
    greedy_agreement: float
    companion_greedy_agreement: float
    confidence_auroc: float | None
    greedy_oracle_gain: float
    greedy_best_fixed_k: int

    def checks(self, targets: PairTargets) -> list[RealismCheck]:
        """Acceptance and greedy agreement against their targets."""
        low_accept, low_agree = targets.acceptance[self.role], targets.greedy_agreement[self.role]
        return [
            RealismCheck(f"{self.name}/acceptance", "draft acceptance 1 - TV(p, q), T = 1", f"{self.acceptance:.3f}",
                         f">= {low_accept}", self.acceptance - low_accept),
            RealismCheck(f"{self.name}/greedy_agreement", "draft argmax = target's greedy token",
                         f"{self.greedy_agreement:.3f}", f">= {low_agree}", self.greedy_agreement - low_agree),
        ]


@dataclass(frozen=True)
class PairRealism:
    """Every figure of a pair."""

    sets: tuple[SetFigures, ...]
    held_out_loss: dict[str, float]  # per role, nats/token on dev responses' tokens in the draft's vocabulary
    covered_share: float  # share of dev response tokens in the draft's vocabulary
    cost: dict[str, float]  # draft and companion forward / target forward, batch 1
    dtype: str  # the precision the costs were measured in

    def checks(self, targets: PairTargets = PairTargets()) -> list[RealismCheck]:
        """Each figure with its target and margin."""
        losses = self.held_out_loss
        between = min(losses["draft"] - losses["companion"], losses["companion"] - losses["target"])
        return [
            *(check for one in self.sets for check in one.checks(targets)),
            RealismCheck("draft_cost", f"draft call / target step, batch 1, {self.dtype}", f"{self.cost['draft']:.3f}",
                         f"<= {targets.draft_cost}", targets.draft_cost - self.cost["draft"]),
            RealismCheck("companion_between", "companion held-out loss between target and draft (nats of room)",
                         f"{losses['companion']:.3f}", f"{losses['target']:.3f}-{losses['draft']:.3f}", between),
        ]

    def failures(self, targets: PairTargets = PairTargets()) -> list[str]:
        """One line per figure outside its target."""
        return [f"{c.name} = {c.value}, target {c.target}" for c in self.checks(targets) if not c.ok]

    def to_dict(self) -> JSONDict:
        """JSON-ready form, stored in ``pair.json``."""
        return {**asdict(self), "sets": [asdict(s) for s in self.sets]}

    @classmethod
    def from_dict(cls, data: JSONDict) -> PairRealism:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**data, "sets": tuple(SetFigures(**s) for s in data["sets"])})


def _log_probs(logits: Tensor) -> Tensor:
    return F.log_softmax(logits.float(), dim=-1)


@torch.no_grad()
def measure_set(models: dict[str, PreTrainedModel], tokenizer: PreTrainedTokenizerBase, name: str, role: str,
                prompts: list[list[int]], *, tokens: int, seed: int,
                losses: dict[str, list[Tensor]] | None = None) -> SetFigures:
    """The figures of one prompt set (token ids of each prompt), ``CHUNK`` prompts at a time.

    With ``losses``, each model's per-token negative log-likelihood of the T = 1 response tokens the
    draft's vocabulary covers is appended to ``losses[role]`` (and the coverage to ``losses["covered"]``).
    """
    if not prompts:
        raise ValueError(f"realism prompt set {name!r} has no prompt within the pair's prompt budget")
    vocab = len(tokenizer)
    sums = {key: 0.0 for key in ("draft", "companion", "draft_greedy", "companion_greedy")}
    positions = greedy_positions = 0
    generator = torch.Generator().manual_seed(seed)
    outcomes: list[tuple[Tensor, Tensor]] = []
    greedy_rows: list[Tensor] = []
    for start in range(0, len(prompts), CHUNK):
        chunk = prompts[start:start + CHUNK]
        sampled = sample_responses(models["target"], chunk, False, tokens, seed + start, tokenizer, vocab)
        mask = sampled.attention_mask[:, sampled.prompt_width:].bool()
        log_p = _log_probs(sampled.target_logits)
        scored = {role_: _log_probs(teacher_forced_logits(models[role_], sampled, vocab))
                  for role_ in ("draft", "companion")}
        count = int(mask.sum())
        for role_, log_q in scored.items():
            sums[role_] += acceptance(log_p, log_q, mask) * count
        positions += count
        outcomes.append(sampled_outcomes(log_p.cpu(), scored["draft"].cpu(), mask.cpu(), generator))
        if losses is not None:
            _add_losses(losses, sampled, {"target": log_p, **scored}, mask)
        del log_p, scored

        greedy = sample_responses(models["target"], chunk, True, tokens, seed + start, tokenizer, vocab)
        greedy_mask = greedy.attention_mask[:, greedy.prompt_width:].bool()
        truth = greedy.input_ids[:, greedy.prompt_width:]
        for role_ in ("draft", "companion"):
            agree = teacher_forced_logits(models[role_], greedy, vocab).argmax(dim=-1) == truth
            sums[f"{role_}_greedy"] += float(agree[greedy_mask].sum())
            if role_ == "draft":
                greedy_rows.append(_padded(agree, greedy_mask, tokens))
        greedy_positions += int(greedy_mask.sum())
    confidence, accepted = (torch.cat(parts) for parts in zip(*outcomes))
    agree_all, agree_mask = torch.cat([a for a, _ in greedy_rows]), torch.cat([m for _, m in greedy_rows])
    gain, best_k = greedy_oracle_gain(agree_all, agree_mask)
    return SetFigures(
        name=name, role=role, prompts=len(prompts), positions=positions,
        acceptance=sums["draft"] / positions, companion_acceptance=sums["companion"] / positions,
        greedy_agreement=sums["draft_greedy"] / greedy_positions,
        companion_greedy_agreement=sums["companion_greedy"] / greedy_positions,
        confidence_auroc=auroc(confidence, accepted),
        greedy_oracle_gain=gain, greedy_best_fixed_k=best_k,
    )


def _padded(agree: Tensor, mask: Tensor, width: int) -> tuple[Tensor, Tensor]:
    pad = width - agree.shape[1]
    return F.pad(agree & mask, (0, pad)), F.pad(mask, (0, pad))


def _add_losses(losses: dict[str, list[Tensor]], batch: Batch, log_probs: dict[str, Tensor], mask: Tensor) -> None:
    truth = batch.input_ids[:, batch.prompt_width:]
    nll = {role: -lp.gather(-1, truth[..., None]).squeeze(-1) for role, lp in log_probs.items()}
    covered = mask & torch.isfinite(nll["draft"]) & (nll["draft"] < 1e4)  # off the draft's vocabulary: q = 0
    for role, values in nll.items():
        losses.setdefault(role, []).append(values[covered])
    losses.setdefault("covered", []).append(covered[mask].float())


@torch.inference_mode()
def forward_costs(models: dict[str, PreTrainedModel], context: list[int], repeats: int) -> dict[str, float]:
    """Each model's median one-token forward at batch 1 on a cached ``context``, as a share of the target's.

    The models take turns within every round (:func:`decode.timing.medians_taking_turns`), so drift on a shared
    machine hits all of them alike.
    """
    ids = torch.tensor([context])
    forwards = {role: CachedForward(model, ids) for role, model in models.items()}
    token = torch.tensor([[context[-1]]])
    runs = {role: partial(forward, token.to(models[role].device)) for role, forward in forwards.items()}
    times = medians_taking_turns(runs, repeats, models["target"].device)
    return {role: seconds / times["target"] for role, seconds in times.items() if role != "target"}


def measure_realism(models: dict[str, PreTrainedModel], tokenizer: PreTrainedTokenizerBase,
                    sets: dict[str, tuple[str, list[list[int]]]], *, tokens: int, seed: int, repeats: int,
                    dtype: str) -> PairRealism:
    """Every figure: each prompt set's (``sets``: name → (role, prompt ids); the dev set's responses also give
    the held-out losses), then the forward costs on the first dev prompt."""
    losses: dict[str, list[Tensor]] = {}
    figures = tuple(
        measure_set(models, tokenizer, name, role, prompts, tokens=tokens, seed=seed,
                    losses=losses if role == "dev" else None)
        for name, (role, prompts) in sets.items()
    )
    held_out = {role: float(torch.cat(losses[role]).mean()) for role in ("target", "draft", "companion")}
    covered = float(torch.cat(losses["covered"]).mean())
    first_dev = next(prompts for role, prompts in sets.values() if role == "dev")[0]
    return PairRealism(figures, held_out, covered, forward_costs(models, first_dev, repeats), dtype)
