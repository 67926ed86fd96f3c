"""``python -m accept_heads.levers [+exp=NAME] [overrides]``: the dev table of the levers tried on each head.

A lever changes what the stop rule is fed. Each one tried here is a recalibration of an exported head fitted
on the decoder's own rounds — the candidates it visits when it drafts with that head (DAgger-style data,
beside the token-mixed prefixes the head was trained on), on as many prompts of the train split as dev has,
never dev or test —
against the true acceptance probability of each visited candidate (the hindsight target of the bounds,
DESIGN §5):

* ``platt``: ``σ(a·z + b)`` of the head's logit ``z`` (temperature scaling with a bias, fitted on
  the visited states rather than on token-mixed dev positions);
* ``decode-time``: ``σ(a·z + b + w·f)`` with the features the decoder has at decode time: the position
  in the round, the running keep-probability ``log Π P̂``, the previous round's accepted length, the
  draft's entropy and its change since the previous candidate;
* ``retrained``: the head itself fine-tuned on those candidates' inputs (its hidden state and features)
  against their true acceptance — one DAgger iteration (a fifth of the candidates held out to stop it);
* ``pre-draft`` (DSpark): a copy of the head fine-tuned on the same inputs against the acceptance probability of
  the *next* candidate before it is drawn, ``1 − TV(v, q)`` (:meth:`decode.rules.Rule.expected_accept`), so that
  the stop decides before drafting it: the threshold stop drafts ``y_{i+1}`` only while
  ``1 − Π_{j≤i} P̂_j · F̂_{i+1} ≤ h``, the goodput stop takes the forecast ``F̂_{i+1}`` instead of ``P̂_i`` for the
  undrafted candidates; ``pre-draft-linear``: the forecast a logistic regression on the round features.
  The next candidate's label is observed for every visited decision, stops included: where the head stops,
  the logging run drafts one candidate more to read it and withdraws it uncounted;
* ``perfect-pre-draft`` (a reference, never kept): the same stops fed the truth — the next candidate's
  acceptance probability before its draw, read in hindsight — the room a pre-draft forecast has on dev.

``evaluate.levers`` names the levers tried. Each variant and the head as exported decode the dev prompts with the threshold stop (``h`` chosen on dev
for each of them over ``evaluate.thresholds``) and with the goodput stop; a lever's effect is its
throughput over the head's at the cost pair, with a 95 % paired-bootstrap interval over the dev prompts.
A lever is kept only if the interval's lower end is above 1. Writes ``levers.csv`` and ``levers.json``
under ``<evaluate.out_dir>/levers``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

import hydra
import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from accept_heads.evaluation.bootstrap import PromptCosts, generation_seconds, paired_draws, ratio_interval
from accept_heads.evaluation.costs import configured_model
from accept_heads.evaluation.inputs import PromptSet, discover, load_split
from accept_heads.evaluation.runs import Generation
from accept_heads.selection import best_value
from ahconf.entry import CONF_DIR, run_entry
from ahconf.schema import EvaluateJob
from data_gen.models import Trio, load_trio
from data_gen.prompts import check_prompt_choices
from data_gen.seeding import prompt_seed
from data_gen.shards import write_json_atomic
from decode import SpeculativeDecoder
from decode.artifacts.version import code_version
from decode.costs import CostModel
from decode.head import AcceptanceHead, head_features
from decode.metadata import ArtifactMetadata
from decode.policies import Decision, DraftRound, HeadEstimate, Policy, StopPolicy, TrueAcceptance
from decode.sampling import Sampling
from decode.stop_rules import Goodput, StopRule, Threshold

#: Round features of a candidate, in the order of a recalibration's weights.
FEATURES = ("bias", "logit", "position", "log_keep", "previous_accepted", "entropy", "entropy_change")
#: Which features each lever's logistic regression uses (the others keep weight 0).
LEVERS = {"platt": ("bias", "logit"), "decode-time": FEATURES, "pre-draft-linear": FEATURES}
#: Levers that forecast the next candidate's acceptance before it is drafted (fitted to ``Visit.next_accept``).
FORECASTS = ("pre-draft", "pre-draft-linear")

@dataclass(frozen=True)
class Visit:
    """A candidate the decoder drafted: its round features, its true acceptance, the head's inputs, and the next
    candidate's acceptance probability before it was drawn (None where no next candidate was drafted)."""

    x: np.ndarray
    accept: float
    hidden: torch.Tensor
    features: torch.Tensor | None
    next_accept: float | None = None


@dataclass(frozen=True)
class Recalibration:
    """``σ(w · x)`` over the round features ``x`` (:data:`FEATURES`) of a candidate."""

    lever: str
    weights: tuple[float, ...]

    def __call__(self, x: np.ndarray) -> float:
        return 1.0 / (1.0 + math.exp(-float(np.dot(self.weights, x))))


Forecaster = Recalibration | AcceptanceHead


class LeverPolicy(StopPolicy):
    """A head's stop with one lever: each candidate's round features are computed, recorded with its true acceptance
    probability and the next one's (``log``; needs hindsight), and the stop rule is fed the ``recalibration`` of the
    head's estimate instead of the estimate — or, with a ``forecaster``, drafts ``y_{i+1}`` while the rule says the
    forecast ``F̂_{i+1}`` of its acceptance pays (:meth:`~decode.stop_rules.StopRule.next_pays`)."""

    def __init__(self, head: AcceptanceHead, stop: StopRule, recalibration: Recalibration | None = None,
                 log: list | None = None, forecaster: Forecaster | None = None) -> None:
        super().__init__(HeadEstimate(head), stop)
        self.recalibration, self.log, self.forecaster = recalibration, log, forecaster
        self.needs_hindsight = log is not None
        self._last_accepted, self._previous_entropy = 0, 0.0
        self._peeking, self._open_visit = False, False

    def start_round(self) -> None:
        super().start_round()
        self._previous_entropy = 0.0
        self._peeking, self._open_visit = False, False

    def after_propose(self, state: DraftRound) -> Decision:
        if self.log is not None and self._open_visit:  # the previous candidate's visit learns what came next
            self.log[-1] = replace(self.log[-1], next_accept=state.expected_accepts[-1])
            self._open_visit = False
        if self._peeking:  # drafted only to read that label: withdrawn, its call uncounted
            self._peeking = False
            return Decision.DROP
        return super().after_propose(state)

    def end_round(self, drafted: int, verified: int, accepted: int) -> None:
        super().end_round(drafted, verified, accepted)
        self._last_accepted = accepted

    def decide(self, state: DraftRound, accept: float) -> Decision:
        hidden, features = cast(HeadEstimate, self.source).inputs(state)
        inputs = (hidden.float().cpu(), None if features is None else features.float().cpu())
        q = state.sampling.feature_probs(state.q_logits[state.i - 1])
        entropy = float(head_features(q, state.tokens[-1], ("entropy",))[0])  # the pre heads' H(q), nats
        clipped = min(max(accept, 1e-6), 1 - 1e-6)
        x = np.array([1.0, math.log(clipped / (1 - clipped)), state.i, math.log(max(self.keep, 1e-12)),
                      self._last_accepted, entropy, entropy - self._previous_entropy if state.i > 1 else 0.0])
        self._previous_entropy = entropy
        if self.forecaster is not None:
            self.observe(accept)
            pays = self.stop.next_pays(state.i, self.keep, self._forecast(x, inputs))
            decision = Decision.STOP if state.i >= self.k_min and not pays else Decision.CONTINUE
        else:
            decision = super().decide(state, self.recalibration(x) if self.recalibration else accept)
        if self.log is not None:
            self.log.append(Visit(x, state.accept_probs[-1], *inputs))
            self._open_visit = state.i < self.k_max
            if decision is Decision.STOP and self._open_visit:  # draft one more to read its label (withdrawn)
                self._peeking, decision = True, Decision.CONTINUE
        return decision

    def _forecast(self, x: np.ndarray, inputs: tuple[torch.Tensor, torch.Tensor | None]) -> float:
        """``F̂_{i+1}``: the forecaster's acceptance of the next, undrafted candidate."""
        if isinstance(self.forecaster, Recalibration):
            return self.forecaster(x)
        with torch.no_grad():
            return float(self.forecaster.predict(*inputs))


class PerfectPreDraft(StopPolicy):
    """The forecast stop fed the truth (a reference): whether ``y_i`` is drafted is decided on its true acceptance
    probability before its draw (read in hindsight from the drafted candidate, which is withdrawn with its draft
    call uncounted when the stop says it should not have been, as the realised oracle's; DESIGN §5), and the drafted
    candidates' true acceptance enters ``Π``. The decision never reads ``y_i`` or a verification draw, so every
    rule stays lossless. The head's companion use (and its price in a goodput stop) is kept."""

    def __init__(self, head: AcceptanceHead, stop: StopRule) -> None:
        super().__init__(TrueAcceptance(), stop)
        self.companion = HeadEstimate(head).companion

    def after_propose(self, state: DraftRound) -> Decision:
        if state.i > self.k_min and not self.stop.next_pays(state.i - 1, self.keep, state.expected_accepts[-1]):
            return Decision.DROP
        self.observe(state.accept_probs[-1])
        return Decision.CONTINUE


def labelled(log: list[Visit], lever: str) -> tuple[list[Visit], list[float]]:
    """The visits a lever learns from and their labels: the candidate's own acceptance, or for a forecast the next
    candidate's acceptance before it was drawn (visits where none was drafted are left out)."""
    if lever in FORECASTS:
        visits = [v for v in log if v.next_accept is not None]
        return visits, [float(v.next_accept) for v in visits]
    return log, [v.accept for v in log]


def fit(lever: str, log: list[Visit]) -> Recalibration:
    """Soft-label logistic regression of the lever's label (:func:`labelled`) on its features (L-BFGS, a little L2)."""
    used = torch.tensor([name in LEVERS[lever] for name in FEATURES], dtype=torch.float64)
    log, labels = labelled(log, lever)
    x = torch.tensor(np.stack([v.x for v in log]), dtype=torch.float64)
    y = torch.tensor(labels, dtype=torch.float64)
    scale = x.abs().amax(0).clamp_min(1.0)  # features of order one
    weights = torch.zeros(len(FEATURES), dtype=torch.float64)
    weights[FEATURES.index("logit")] = 1.0
    weights.requires_grad_(True)
    optimiser = torch.optim.LBFGS([weights], max_iter=200, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        optimiser.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits((x / scale) @ (weights * used), y)
        value = value + 1e-6 * (weights * used).pow(2).sum()
        value.backward()
        return value

    optimiser.step(loss)
    return Recalibration(lever, tuple(float(w) for w in (weights * used / scale).detach()))


def retrain(head: AcceptanceHead, log: list[Visit], seed: int, epochs: int = 40,
            lever: str = "retrained") -> tuple[AcceptanceHead, dict]:
    """A copy of ``head`` fine-tuned on the visited candidates against the lever's label (:func:`labelled`;
    soft-label BCE, Adam); the epoch with the lowest held-out loss (a fifth of the candidates) is kept. Returns the
    head and its held-out losses before and after."""
    model = copy.deepcopy(head).train()
    log, label_list = labelled(log, lever)
    hidden = torch.stack([v.hidden for v in log])
    features = torch.stack([v.features for v in log]) if log[0].features is not None else None
    labels = torch.tensor(label_list)
    order = torch.randperm(len(log), generator=torch.Generator().manual_seed(seed))
    held, used = order[: len(log) // 5], order[len(log) // 5 :]

    def loss(rows: torch.Tensor) -> torch.Tensor:
        logits = model(hidden[rows], None if features is None else features[rows])
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[rows])

    optimiser = torch.optim.Adam(model.parameters(), lr=3e-4, weight_decay=1e-4)
    with torch.no_grad():
        before = best = float(loss(held))
    state = copy.deepcopy(model.state_dict())
    for _ in range(epochs):
        for rows in used[torch.randperm(len(used), generator=torch.Generator().manual_seed(seed + _))].split(256):
            optimiser.zero_grad()
            loss(rows).backward()
            optimiser.step()
        with torch.no_grad():
            held_loss = float(loss(held))
        if held_loss < best:
            best, state = held_loss, copy.deepcopy(model.state_dict())
    model.load_state_dict(state)
    model.metadata = dict(head.metadata)
    return model.eval(), {"held_out_bce_before": before, "held_out_bce_after": best, "held_out": len(held)}


@dataclass(frozen=True)
class Variant:
    """A head with one lever (``lever=None``: the head as exported): a ``recalibration`` of its estimate, a
    retrained ``model`` in its place, or a ``forecaster`` of the next candidate's acceptance."""

    head: str
    lever: str | None
    recalibration: Recalibration | None = None
    model: AcceptanceHead | None = None
    forecaster: Forecaster | None = None
    perfect: bool = False  # the pre-draft stops on the truth: a reference, never kept

    @property
    def name(self) -> str:
        return self.lever or "as exported"


@dataclass
class Lab:
    """What every decode here needs: the models, the cost pair, the run's sampling and settings."""

    job: EvaluateJob
    trio: Trio
    sampling: Sampling
    cost: CostModel

    def policy(self, head: AcceptanceHead, stop: str, threshold: float, recalibration: Recalibration | None,
               log: list | None = None, forecaster: Forecaster | None = None, perfect: bool = False) -> Policy:
        k_min, k_max = ArtifactMetadata.of(head).k_range(self.job.head.k_min, self.job.head.k_max)
        rule: StopRule = (Goodput(self.cost, k_min, k_max, companion=bool(head.config.companion_features))
                          if stop == "goodput" else Threshold(threshold, k_min, k_max))
        if perfect:
            return PerfectPreDraft(head, rule)
        return LeverPolicy(head, rule, recalibration, log, forecaster)

    def decode(self, head: AcceptanceHead, policy: Policy, prompts: PromptSet) -> PromptCosts:
        """Every prompt of ``prompts`` with ``policy`` (per-prompt seeds as the evaluation's): modelled seconds."""
        decoder = SpeculativeDecoder(self.trio.target, self.trio.draft, rule=ArtifactMetadata.of(head).build_rule(),
                                     policy=policy, companion=self.trio.companion if policy.companion else None,
                                     sampling=self.sampling)
        generations = []
        for prompt in prompts.prompts:
            seed = prompt_seed(self.job.seed, prompt.prompt_id)
            out = decoder.generate(prompt.token_ids, max_new_tokens=self.job.evaluate.max_new_tokens, seed=seed)
            generations.append(asdict(Generation.of(prompt.prompt_id, seed, out.stats, out.sequences,
                                                    len(prompt.token_ids))))
        frame = pd.DataFrame(generations)
        return PromptCosts(tuple(frame["prompt_id"]), frame["generated"].to_numpy(float),
                           np.asarray(generation_seconds(frame, self.cost), dtype=float))


def throughput(run: PromptCosts) -> float:
    return float(run.generated.sum() / run.seconds.sum())


def measure(lab: Lab, head: AcceptanceHead, variant: Variant, dev: PromptSet,
            thresholds: list[float]) -> dict[str, tuple[float | None, PromptCosts]]:
    """The variant's dev runs: the threshold stop at its best ``h`` on dev, and the goodput stop."""
    head, lever = variant.model or head, (variant.recalibration, None, variant.forecaster, variant.perfect)
    runs = {h: lab.decode(head, lab.policy(head, "threshold", h, *lever), dev) for h in thresholds}
    best = best_value(list(runs), [throughput(r) for r in runs.values()])
    goodput = lab.decode(head, lab.policy(head, "goodput", 1.0, *lever), dev)
    return {"threshold": (best, runs[best]), "goodput": (None, goodput)}


def lever_rows(job: EvaluateJob) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Fit every lever on each head's train-split rounds and measure it on dev; the table and the fits."""
    notes: dict[str, str] = {}
    trio = load_trio(job.models, job.paths.zoo_dir)
    sampling = Sampling(**asdict(job.sampling))
    artifacts, _ = discover(job.paths.head_dir, trio, sampling, notes)
    context = trio.target.config.max_position_embeddings
    e = job.evaluate
    dev = load_split(job.prompts, e, job.seed, trio.tokenizer, context, "dev", e.prompts["dev"])
    train = load_split(job.prompts, e, job.seed, trio.tokenizer, context, "train", e.prompts["dev"])  # as many
    lab = Lab(job, trio, sampling, configured_model(job.cost, None))
    thresholds = list(e.thresholds or job.head.thresholds)
    rows, fits = [], {}
    heads = {n: h for n, h in artifacts.heads.items() if not h.config.companion_features}
    tried = job.evaluate.levers
    with tqdm(total=len(heads) * (1 + len(tried)), desc="levers", unit="variant", dynamic_ncols=True) as bar:
        for name, head in heads.items():
            log: list = []
            recorded = ArtifactMetadata.of(head).threshold
            lab.decode(head, lab.policy(head, "threshold", 0.5 if recorded is None else recorded, None, log), train)
            linear = {lever: fit(lever, log) for lever in LEVERS if lever in tried}
            fits[name] = {"rounds_candidates": len(log),
                          "with_next_candidate": sum(v.next_accept is not None for v in log),
                          **{lever: dict(zip(FEATURES, r.weights)) for lever, r in linear.items()}}
            variants = [Variant(name, None)] + [
                Variant(name, lever, forecaster=r) if lever in FORECASTS else Variant(name, lever, recalibration=r)
                for lever, r in linear.items()]
            if "retrained" in tried:
                retrained, fits[name]["retrained"] = retrain(head, log, job.seed)
                variants.append(Variant(name, "retrained", model=retrained))
            if "pre-draft" in tried:
                forecaster, fits[name]["pre-draft"] = retrain(head, log, job.seed, lever="pre-draft")
                variants.append(Variant(name, "pre-draft", forecaster=forecaster))
            if "perfect-pre-draft" in tried:
                variants.append(Variant(name, "perfect-pre-draft", perfect=True))
            measured = {}
            for variant in variants:
                bar.set_postfix_str(f"{name} {variant.name}", refresh=False)
                measured[variant.name] = measure(lab, head, variant, dev, thresholds)
                bar.update()
            draws = paired_draws(len(dev.prompts), job.seed)
            for variant in variants:
                for stop, (h, run) in measured[variant.name].items():
                    base_h, base = measured["as exported"][stop]
                    low, high = ratio_interval(run, base, draws)
                    rows.append({"head": name, "lever": variant.name, "stop": stop, "h": h, "base_h": base_h,
                                 "dev_throughput": throughput(run), "effect": throughput(run) / throughput(base),
                                 "effect_lo": low, "effect_hi": high,
                                 "kept": bool(variant.lever) and not variant.perfect and low > 1.0})
    return pd.DataFrame(rows), {"fits": fits, "notes": notes}


def print_levers(table: pd.DataFrame) -> None:
    out = Table(title="levers on dev — throughput at the cost pair over the head as exported [95% paired-bootstrap "
                      "CI over dev prompts]; kept only if the interval is above 1", title_justify="left")
    for column in ("head", "lever", "stop", "h (dev)", "dev tok / modelled s", "effect [95% CI]", "kept"):
        out.add_column(column, justify="left" if column in ("head", "lever", "stop") else "right")
    for _, row in table.iterrows():
        h = "—" if pd.isna(row["h"]) else f"{row['h']:g}"
        out.add_row(row["head"], row["lever"], row["stop"], h, f"{row['dev_throughput']:.2f}",
                    f"{row['effect']:.3f}× [{row['effect_lo']:.3f}, {row['effect_hi']:.3f}]",
                    "reference" if row["lever"] == "perfect-pre-draft" else "yes" if row["kept"] else "no")
    Console(width=160).print(out)


def run_levers(job: EvaluateJob) -> pd.DataFrame:
    """Fit, measure, write and print the lever table."""
    table, described = lever_rows(job)
    out = Path(job.evaluate.out_dir) / "levers"
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "levers.csv.partial"
    table.to_csv(partial, index=False)
    partial.replace(out / "levers.csv")
    write_json_atomic(out / "levers.json", {"command": "accept_heads.levers", "code_version": code_version(),
                                            "fit_prompts (train split)": job.evaluate.prompts["dev"], "dev_prompts": job.evaluate.prompts["dev"],
                                            "cost": asdict(job.cost), "seed": job.seed, **described})
    print_levers(table)
    print(f"levers: {out / 'levers.csv'}, {out / 'levers.json'}")
    return table


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_entry(cfg, "accept_heads.levers", lambda config: run_levers(config.evaluate_job()), check_prompt_choices)


if __name__ == "__main__":
    main()
