"""The head's stop threshold ``h``: chosen once, after training, on the evaluation's dev prompts (DESIGN §5).

The head decodes the dev set every other choice is made on (``decoding.prompts.dev`` prompts of the configured
source, ``decoding.max_new_tokens`` each: :func:`accept_heads.measure.inputs.load_split`) at each ``h`` of
``head.thresholds``, as the evaluation's own runs (:class:`accept_heads.measure.runs.DecoderRunner`: the configured
models and dtypes, each prompt's seed, the evaluation's batching and torch threads), and the ``h`` with the highest
modelled throughput at the evaluation's ``cost`` model (:func:`accept_heads.measure.cost_models.pricing`) wins
(:func:`best_threshold`: :func:`accept_heads.measure.selection.best_value`, ties to the smaller). Training records it
in the head and the sweep's per-prompt records beside it (:data:`SWEEP_FILE`, a :class:`RecordedSweep` keyed by the
sha256 of the head file and of the dev prompts, the decoding settings and the prices); the evaluation, :class:`decode.policies.Head` and the
``generate`` door decode at it, and the evaluation takes the head's dev rows from that file when its key matches
(:mod:`accept_heads.evaluation.recorded_sweeps`) instead of decoding them again.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accept_heads.measure.cost_models import one_call_seconds, pricing
from accept_heads.measure.costing import costed
from accept_heads.measure.inputs import Artifacts, PromptSet, load_split
from accept_heads.measure.placement import alone_prompts
from accept_heads.measure.runs import DecoderRunner, Generation, RunSpec
from accept_heads.measure.selection import best_value
from ahconf.rule_config import build_rule, rule_value
from ahconf.schema import RulesConfig, TrainJob
from data_gen.shards import write_json_atomic
from decode.artifacts.gguf import file_sha256
from decode.costs import CostModel
from decode.head import AcceptanceHead
from decode.json_types import JSONDict
from decode.metadata import SweepRow
from decode.policies.sources import HeadEstimate
from decode.policies.stops import Threshold
from decode.policy_specs import SourceStopSpec
from decode.rules import Rule
from decode.sampling import Sampling
from decode.threads import torch_threads
from runtime.models import load_trio
from runtime.placement import place

#: The name the head goes by in its calibration runs.
NAME = "head"


#: The file beside an exported head that records its dev sweep (:class:`RecordedSweep`).
SWEEP_FILE = "h_sweep.json"

#: The generation fields that may be NaN (no quality scored on dev): null in the sweep file.
_NAN_FIELDS = ("target_agreement", "target_nll")


@dataclass(frozen=True)
class ThresholdRun:
    """One threshold's dev run: a generation per dev prompt, in the set's order."""

    threshold: float
    generations: tuple[Generation, ...]

    def to_dict(self) -> JSONDict:
        rows = [{k: None if k in _NAN_FIELDS and math.isnan(v) else v for k, v in asdict(g).items()}
                for g in self.generations]
        return {"threshold": self.threshold, "generations": rows}

    @classmethod
    def from_dict(cls, doc: JSONDict) -> ThresholdRun:
        rows = [{k: math.nan if k in _NAN_FIELDS and v is None else v for k, v in row.items()}
                for row in doc["generations"]]
        return cls(float(doc["threshold"]), tuple(Generation(**row) for row in rows))


@dataclass(frozen=True)
class SweepKey:
    """What a head's dev sweep decoded: equal keys decode equal dev rows, so the evaluation may reuse them."""

    head_sha256: str  # of the exported head.safetensors
    prompts_sha256: str  # of the dev prompts: ids and token ids (prompts_sha256)
    settings: JSONDict  # the decoding settings (sweep_settings)
    cost: JSONDict  # Pricing.record: the prices the sweep was modelled at

    def differences(self, other: SweepKey) -> list[str]:
        """The fields where ``other`` differs from this key (empty: the same sweep)."""
        names = {"head_sha256": "head", "prompts_sha256": "dev prompts", "settings": "settings", "cost": "cost"}
        return [label for name, label in names.items() if getattr(self, name) != getattr(other, name)]


@dataclass(frozen=True)
class Calibration:
    """The choice of ``h``: one row per threshold of the grid, the chosen one, the dev prompts decoded and the costs;
    the per-prompt runs and what decoded them (the :class:`RecordedSweep` written beside the head)."""

    rows: list[SweepRow]
    threshold: float
    prompts: JSONDict  # PromptSet.describe(): source, split, count and prompt ids
    max_new_tokens: int
    cost: JSONDict  # Pricing.record: the prices the sweep was modelled at and where they come from
    runs: tuple[ThresholdRun, ...] = ()  # one per row
    prompts_sha256: str = ""  # of the dev prompts (prompts_sha256)
    settings: JSONDict = field(default_factory=dict)  # sweep_settings

    def recorded(self, head_file: Path) -> RecordedSweep:
        """This sweep as recorded beside the exported ``head_file``."""
        key = SweepKey(file_sha256(head_file), self.prompts_sha256, self.settings, self.cost)
        return RecordedSweep(key, tuple(self.rows), self.threshold, self.runs)


@dataclass(frozen=True)
class RecordedSweep:
    """A head's dev sweep as :data:`SWEEP_FILE` holds it: its key, the rows, the chosen ``h`` and the per-prompt runs."""

    key: SweepKey
    rows: tuple[SweepRow, ...]
    threshold: float
    runs: tuple[ThresholdRun, ...]

    def run(self, threshold: float) -> ThresholdRun | None:
        """The run at ``threshold`` (None: not swept)."""
        return next((run for run in self.runs if run.threshold == threshold), None)

    def write(self, path: Path) -> None:
        write_json_atomic(path, {"key": asdict(self.key), "rows": [asdict(row) for row in self.rows],
                                 "threshold": self.threshold, "runs": [run.to_dict() for run in self.runs]})

    @classmethod
    def read(cls, path: Path) -> RecordedSweep:
        doc = json.loads(path.read_text())
        return cls(SweepKey(**doc["key"]), tuple(SweepRow(**row) for row in doc["rows"]), float(doc["threshold"]),
                   tuple(ThresholdRun.from_dict(run) for run in doc["runs"]))


def prompts_sha256(prompts: PromptSet) -> str:
    """sha256 of a prompt set's ids and token ids, in order."""
    payload = json.dumps([[p.prompt_id, list(p.token_ids)] for p in prompts.prompts], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def sweep_settings(runner: DecoderRunner, rule: str, rule_param: float | None, companion: bool) -> JSONDict:
    """What decides a head's dev rows besides the head and the prompts: the models (the companion where the head
    reads it), the sampling the rule applies (:meth:`decode.rules.Rule.transform`: greedy's whatever the configured
    temperature), the rule, the seed, the token budget, the K range and compiled forwards."""
    roles = ("target", "draft", "companion") if companion else ("target", "draft")
    description = runner.trio.description
    models = {role: {k: description[role][k] for k in ("id", "revision", "dtype")}
              for role in roles if role in description}
    built = build_rule(rule, runner.rules, value=rule_param)
    return {"models": models, "tokenizer_hash": description.get("tokenizer_hash"),
            "sampling": asdict(built.transform(runner.sampling)), "rule": built.spec(),
            "seed": runner.seed, "max_new_tokens": runner.max_new_tokens, "k_min": runner.k_min,
            "k_max": runner.k_max, "compile": runner.compile}


def head_run(set_name: str, rule: str, rules: RulesConfig, threshold: float, head: str) -> RunSpec:
    """The dev run of ``head`` at ``threshold`` under ``rule``."""
    policy = SourceStopSpec(HeadEstimate.name, Threshold.name, threshold, head)
    return RunSpec(set=set_name, rule=rule, policy=policy, rule_param=rule_value(rule, rules))


def sweep_thresholds(runner: DecoderRunner, rule: Rule, rules: RulesConfig, dev: PromptSet,
                     thresholds: list[float], cost: CostModel) -> tuple[list[SweepRow], list[ThresholdRun]]:
    """Decode ``dev`` with head :data:`NAME` of ``runner`` at each threshold; a :class:`SweepRow` and the per-prompt
    :class:`ThresholdRun` per threshold."""
    rows, runs = [], []
    for threshold in thresholds:
        records = runner.run(head_run(dev.name, rule.name, rules, threshold, NAME), dev, with_quality=False)
        run = costed(records, cost).iloc[0]
        throughput = float(run["throughput_cost"])
        rows.append(SweepRow(threshold=threshold, generated=int(run["generated"]), draft_calls=int(run["draft_calls"]),
                             target_calls=int(run["target_calls"]), discarded=int(run["discarded"]),
                             modelled_time=run["generated"] / throughput if throughput > 0 else 0.0,
                             throughput=throughput))
        runs.append(ThresholdRun(threshold, tuple(record.generation for record in records)))
    return rows, runs


def best_threshold(rows: list[SweepRow]) -> float:
    """The threshold with the highest modelled throughput (the lowest threshold on ties)."""
    return best_value([row.threshold for row in rows], [row.throughput for row in rows])


def choose_threshold(job: TrainJob, head: AcceptanceHead, rule: Rule, sampling: Sampling) -> Calibration:
    """``h`` for a trained ``head`` (predicting acceptance probabilities: prior shift folded) of ``rule`` under
    ``sampling``, on the evaluation's dev prompts with the models as the evaluation loads them."""
    d = job.decoding
    trio = load_trio(job.models, job.paths.zoo_dir, with_companion=head.config.companion_features)
    place(trio)
    context = trio.target.config.max_position_embeddings
    dev = load_split(job.prompts, d, job.seed, trio.tokenizer, context, "dev", d.prompts["dev"])

    def companion_ratio() -> float | None:
        if not head.config.companion_features or trio.companion is None:
            return None
        prompt = dev.prompts[0].token_ids
        return (one_call_seconds(trio.companion, prompt, d.repeats)
                / one_call_seconds(trio.draft, prompt, d.repeats))

    runner = DecoderRunner(trio, sampling, job.rules, Artifacts(heads={NAME: head.to(trio.draft.device)}),
                           d.max_new_tokens, job.seed, job.head.k_min, job.head.k_max, batch_size=d.batch_size,
                           timed_prompts=alone_prompts(d, job.wallclock, len(dev.prompts)), compile=d.compile)
    with torch_threads(d.threads):
        priced = pricing(job.cost, trio, companion_ratio, compiled=d.compile, repeats=d.repeats, threads=d.threads)
        rows, runs = sweep_thresholds(runner, rule, job.rules, dev, [float(h) for h in job.head.thresholds],
                                      priced.model)
    settings = sweep_settings(runner, rule.name, rule_value(rule.name, job.rules), head.config.companion_features)
    return Calibration(rows, best_threshold(rows), dev.describe(), d.max_new_tokens, priced.record, tuple(runs),
                       prompts_sha256(dev), settings)
