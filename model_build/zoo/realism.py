"""The zoo's realism figures: does the trio behave like a real draft / target pair on the prompts we decode?

Measured per prompt set — line-start dev text, the evaluation's dev function prompts and its
out-of-distribution module prompts (:mod:`model_build.zoo.prompt_sets`) — and checked against
:class:`RealismTargets` (DESIGN §5 for the cost model and the SpecDec++ Thm 4.1 oracle):

- ``acceptance``: mean speculative acceptance ``1 − TV(p, q)`` of the draft along the target's
  temperature-1 responses;
- ``confidence_auroc``: AUROC of the draft's own confidence ``log q(y)`` for the candidate ``y ~ q``
  it proposes against the sampled speculative outcome (``u < p(y) / q(y)``) — informative in real
  pairs, which is why confidence stops work; undefined (``None``) where every outcome is the same;
- ``greedy_oracle_gain``: throughput of the greedy oracle (drafts exactly the tokens the target will
  accept, counted as in Thm 4.1) over the best fixed K, at the paper's cost pair, along the target's
  greedy responses;
- ``degenerate_share``: share of the target's greedy continuations (first ``degeneracy_tokens``
  tokens) that are whitespace only or end in a loop (:func:`is_degenerate`);

and once per trio ``loss_gap``: held-out loss of the draft minus the target's (nats/token), with
the companion between them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.functional.classification import binary_auroc
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from data_gen.generation import Batch, generate_responses, teacher_forced_logits
from data_gen.prompts.shipped import held_out_modules
from decode.costs import CostModel
from decode.divergence import tv
from decode.json_types import JSONDict
from decode.rules import Speculative, sample, uniform
from decode.sampling import Sampling
from runtime.seeding import prompt_seed

from .evaluation import held_out_loss, realism_prompt_sets
from .recipe import ZooRecipe
from .windows import spaced_windows, token_stream

# SpecDec++'s measured pair (Llama-2-chat 7B / 70B on 2×A100), DESIGN §5.
PAPER_COSTS = CostModel(t_draft=0.0236, t_target=0.112, t_companion=0.0)
FIXED_K_GRID: tuple[int, ...] = tuple(range(1, 21))  # K_max = 20, as in the paper
LOOP_MAX_PERIOD = 4  # a continuation whose second half repeats a unit of at most this many tokens loops


@dataclass(frozen=True)
class RealismTargets:
    """The ranges a trio should reach (every figure of every prompt set)."""

    acceptance: tuple[float, float] = (0.65, 0.85)
    confidence_auroc: float = 0.70
    greedy_oracle_gain: float = 1.35
    degenerate_share: float = 0.10
    loss_gap: float = 0.2


@dataclass(frozen=True)
class RealismCheck:
    """One figure against its target; ``margin`` > 0 by how much it is met (< 0: missed), None: undefined."""

    name: str  # e.g. ``function (dev)/acceptance`` or ``loss_gap``
    figure: str
    value: str
    target: str
    margin: float | None

    @property
    def ok(self) -> bool:
        """Whether the figure is defined and within its target."""
        return self.margin is not None and self.margin >= 0


@dataclass(frozen=True)
class SetRealism:
    """The figures of one prompt set."""

    name: str
    prompts: int
    acceptance: float
    companion_acceptance: float
    confidence_auroc: float | None
    greedy_oracle_gain: float
    greedy_best_fixed_k: int
    degenerate_share: float

    def checks(self, targets: RealismTargets) -> list[RealismCheck]:
        """This set's four figures against their targets."""
        low, high = targets.acceptance
        auroc = self.confidence_auroc
        rows = [
            ("acceptance", "draft acceptance 1 - TV(p, q), T = 1", f"{self.acceptance:.3f}", f"{low}-{high}",
             min(self.acceptance - low, high - self.acceptance)),
            ("confidence_auroc", "AUROC of draft confidence log q(y) vs sampled accept",
             "undefined (one class)" if auroc is None else f"{auroc:.3f}", f">= {targets.confidence_auroc}",
             None if auroc is None else auroc - targets.confidence_auroc),
            ("greedy_oracle_gain", f"greedy oracle / best fixed K (K = {self.greedy_best_fixed_k}), paper costs",
             f"{self.greedy_oracle_gain:.3f}x", f">= {targets.greedy_oracle_gain}x",
             self.greedy_oracle_gain - targets.greedy_oracle_gain),
            ("degenerate_share", "greedy continuations whitespace-only or looping", f"{self.degenerate_share:.1%}",
             f"<= {targets.degenerate_share:.0%}", targets.degenerate_share - self.degenerate_share),
        ]
        return [RealismCheck(f"{self.name}/{name}", figure, value, target, margin)
                for name, figure, value, target, margin in rows]


@dataclass(frozen=True)
class Realism:
    """Every figure of one trio: per prompt set, and the held-out losses."""

    sets: tuple[SetRealism, ...]
    held_out_loss: dict[str, float]  # nats/token on dev-split text, per role

    @property
    def loss_gap(self) -> float:
        """Held-out loss of the draft minus the target's."""
        return self.held_out_loss["draft"] - self.held_out_loss["target"]

    def checks(self, targets: RealismTargets = RealismTargets()) -> list[RealismCheck]:
        """Each figure with its target and margin."""
        losses = self.held_out_loss
        between = min(losses["draft"] - losses["companion"], losses["companion"] - losses["target"])
        return [
            *(check for one in self.sets for check in one.checks(targets)),
            RealismCheck("loss_gap", "held-out loss gap draft - target (nats)", f"{self.loss_gap:.3f}",
                         f">= {targets.loss_gap}", self.loss_gap - targets.loss_gap),
            RealismCheck("companion_between", "companion loss between target and draft (nats of room)",
                         f"{losses['companion']:.3f}", f"{losses['target']:.3f}-{losses['draft']:.3f}", between),
        ]

    def failures(self, targets: RealismTargets = RealismTargets()) -> list[str]:
        """One line per figure outside its target or undefined (empty when the trio is realistic)."""
        return [f"{c.name} = {c.value}, target {c.target}" for c in self.checks(targets) if not c.ok]

    def to_dict(self) -> JSONDict:
        """JSON-ready form, stored in ``zoo.json``."""
        return {"sets": [asdict(s) for s in self.sets], "held_out_loss": dict(self.held_out_loss)}

    @classmethod
    def from_dict(cls, data: JSONDict) -> Realism:
        """Inverse of :meth:`to_dict`."""
        return cls(tuple(SetRealism(**s) for s in data["sets"]), dict(data["held_out_loss"]))


def acceptance(log_p: Tensor, log_q: Tensor, mask: Tensor) -> float:
    """Mean ``1 − TV(p, q)`` over the masked positions."""
    overlap = 1.0 - tv(log_p.exp(), log_q.exp())
    return (overlap[mask].sum() / mask.sum()).item()


def confidence_auroc(log_p: Tensor, log_q: Tensor, mask: Tensor, seed: int) -> float | None:
    """AUROC of ``log q(y)``, ``y ~ q``, against the sampled speculative accept / reject of ``y``.

    ``None`` where every sampled outcome is the same (AUROC is undefined with one class).
    """
    generator = torch.Generator(device=log_q.device).manual_seed(seed)
    return auroc(*sampled_outcomes(log_p, log_q, mask, generator))


def sampled_outcomes(log_p: Tensor, log_q: Tensor, mask: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """At every masked position, a candidate ``y ~ q``: its confidence ``log q(y)`` and whether the
    speculative rule accepts it (``u < p(y) / q(y)``), both ``[positions]``."""
    p, q = log_p[mask].exp(), log_q[mask].exp()
    candidates = sample(q, generator)
    accept_prob = Speculative().accept_probs(p, q, candidates)
    accepted = uniform(tuple(accept_prob.shape), generator, accept_prob) < accept_prob
    return log_q[mask].gather(-1, candidates[:, None]).squeeze(-1), accepted


def auroc(confidence: Tensor, accepted: Tensor) -> float | None:
    """AUROC of ``confidence`` against the outcomes ``accepted``; None with one class only."""
    if accepted.all() or not accepted.any():
        return None
    return binary_auroc(confidence, accepted.long()).item()


def greedy_oracle_gain(accepted: Tensor, mask: Tensor, costs: CostModel = PAPER_COSTS) -> tuple[float, int]:
    """Oracle throughput over the best fixed K's, and that K, from greedy acceptance sequences.

    ``accepted[b, i]``: whether the draft's greedy token equals the target's at response position
    ``i`` (teacher-forced on the target's greedy response). Fixed K drafts K tokens per round and
    emits the accepted run plus the target's token; the oracle drafts exactly the accepted run
    (Thm 4.1: draft calls = accepted tokens). Rounds never draft past a row's masked length.
    """
    rows = [row[: int(length)].tolist() for row, length in zip(accepted.cpu(), mask.sum(dim=1).cpu())]
    oracle = _throughput(rows, None, costs)
    fixed = {k: _throughput(rows, k, costs) for k in FIXED_K_GRID}
    best_k = max(fixed, key=fixed.__getitem__)
    return oracle / fixed[best_k], best_k


def _throughput(rows: list[list[bool]], k: int | None, costs: CostModel) -> float:
    """Tokens per modelled second of fixed K (``k``) or the oracle (``None``) over all rows.

    As in the decoder, a round never drafts past the budget: with ``r`` positions left it drafts at
    most ``r − 1`` (the target emits the last one).
    """
    tokens = draft_calls = target_calls = 0
    for row in rows:
        position = 0
        while position < len(row):
            remaining = len(row) - position
            cap = remaining - 1 if k is None else min(k, remaining - 1)
            run = 0
            while run < cap and row[position + run]:
                run += 1
            tokens += run + 1
            draft_calls += run if k is None else cap
            target_calls += 1
            position += run + 1
    seconds = costs.times(np.array([draft_calls]), np.array([0]), np.array([target_calls]))[0]
    return tokens / seconds


def is_degenerate(ids: list[int], text: str, max_period: int = LOOP_MAX_PERIOD) -> bool:
    """Whether a continuation (token ids before EOS, and their text) is whitespace only or loops.

    It loops when its second half repeats one unit of at most ``max_period`` tokens (and that half
    holds at least two such units): ``"\\n\\n\\n…"``, ``"x = x = x = …"``.
    """
    if not text.strip():
        return True
    tail = ids[len(ids) // 2 :]
    if len(tail) < 2 * max_period:
        return False
    return any(all(tail[i] == tail[i + period] for i in range(len(tail) - period))
               for period in range(1, max_period + 1))


def _log_probs(logits: Tensor) -> Tensor:
    return F.log_softmax(logits.float(), dim=-1)


def sample_responses(target: PreTrainedModel, prompts: list[list[int]], greedy: bool, tokens: int, seed: int,
                     tokenizer: PreTrainedTokenizerBase, vocab: int) -> Batch:
    """The target's T = 1 (or greedy) responses of ``tokens`` tokens, each prompt with its own seeded stream."""
    generators = [torch.Generator(device=target.device).manual_seed(prompt_seed(seed, str(i)))
                  for i in range(len(prompts))]
    return generate_responses(target, prompts, sampling=Sampling(temperature=0.0 if greedy else 1.0),
                              max_new_tokens=tokens, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, generators=generators, vocab=vocab)


@torch.no_grad()
def measure_set(models: dict[str, PreTrainedModel], tokenizer: PreTrainedTokenizerBase, name: str,
                prompts: list[list[int]], *, response_tokens: int, degeneracy_tokens: int, seed: int) -> SetRealism:
    """The four figures of one prompt set (token ids of each prompt)."""
    target, vocab = models["target"], len(tokenizer)
    sampled = sample_responses(target, prompts, False, response_tokens, seed, tokenizer, vocab)
    mask = sampled.attention_mask[:, sampled.prompt_width :].bool()
    log_p = _log_probs(sampled.target_logits)
    log_q = _log_probs(teacher_forced_logits(models["draft"], sampled, vocab))
    log_c = _log_probs(teacher_forced_logits(models["companion"], sampled, vocab))
    draft_acceptance, companion_acceptance = acceptance(log_p, log_q, mask), acceptance(log_p, log_c, mask)
    auroc = confidence_auroc(log_p, log_q, mask, seed)
    del log_p, log_q, log_c

    greedy = sample_responses(target, prompts, True, response_tokens, seed, tokenizer, vocab)
    greedy_mask = greedy.attention_mask[:, greedy.prompt_width :].bool()
    draft_tokens = teacher_forced_logits(models["draft"], greedy, vocab).argmax(dim=-1)
    gain, best_k = greedy_oracle_gain(draft_tokens == greedy.input_ids[:, greedy.prompt_width :], greedy_mask)
    degenerate = 0
    for row in range(len(prompts)):
        ids = [t for t in greedy.response_ids(row)[:degeneracy_tokens].tolist() if t != tokenizer.eos_token_id]
        degenerate += is_degenerate(ids, tokenizer.decode(ids))
    return SetRealism(name=name, prompts=len(prompts), acceptance=draft_acceptance,
                      companion_acceptance=companion_acceptance, confidence_auroc=auroc, greedy_oracle_gain=gain,
                      greedy_best_fixed_k=best_k, degenerate_share=degenerate / len(prompts))


def measure_realism(models: dict[str, PreTrainedModel], tokenizer: PreTrainedTokenizerBase,
                    recipe: ZooRecipe) -> Realism:
    """Every figure of a trio: held-out losses on the shipped dev-split text, then each prompt set's four figures."""
    dev_stream = token_stream(tokenizer, [text for _, text in held_out_modules()])
    dev_windows = spaced_windows(dev_stream, recipe.eval_windows, recipe.context)
    losses = {role: held_out_loss(model, dev_windows) for role, model in models.items()}
    sets = tuple(
        measure_set(models, tokenizer, name, prompts, response_tokens=recipe.response_tokens,
                    degeneracy_tokens=recipe.degeneracy_tokens, seed=recipe.eval_seed)
        for name, prompts in realism_prompt_sets(tokenizer, recipe).items()
    )
    return Realism(sets, losses)
