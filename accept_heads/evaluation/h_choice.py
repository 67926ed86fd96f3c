"""Each head's stop threshold ``h``, chosen on dev like every other parameter, and its one record beside the head.

The evaluation decodes a head's dev grid of ``h`` (``evaluate.grids.head`` over the ``h`` stop's declared grid) with
its own runners, chooses ``h`` by :func:`accept_heads.evaluation.table.select` and writes, per head, a
:class:`decode.artifacts.threshold_choice.ThresholdChoice` (:func:`record_choices`): the key (the head file's and the
dev prompts' sha256 and the decoding settings; the prices are recorded but no part of it), each ``h``'s totals and
per-prompt records, and the chosen ``h``, which ``decode.load_head`` then reads. A later evaluation whose key matches
reuses those per-prompt rows instead of decoding them again (:func:`recorded_runs`); otherwise they are decoded, with
one note saying why (DESIGN §5).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from accept_heads.evaluation.choice import Choice
from accept_heads.measure.costing import costed
from accept_heads.measure.families import HEAD_THRESHOLD
from accept_heads.measure.inputs import Artifacts, PromptSet
from accept_heads.measure.runs import DecoderRunner, Generation, GenerationRecord, Record, RunSpec
from ahconf.rule_config import build_rule
from decode.artifacts.gguf import file_sha256
from decode.artifacts.serialization import save_threshold_choice
from decode.artifacts.threshold_choice import ThresholdChoice, choice_path
from decode.costs import CostModel
from decode.json_types import JSONDict

#: The generation fields that may be NaN (no quality scored on dev): null in the record.
_NAN_FIELDS = ("target_agreement", "target_nll")


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
    models = {role: {"id": model.id, "revision": model.revision, "dtype": model.dtype}
              for role in roles if (model := getattr(description, role)) is not None}
    built = build_rule(rule, runner.rules, value=rule_param)
    return {"models": models, "tokenizer_hash": description.tokenizer_hash,
            "sampling": asdict(built.transform(runner.sampling)), "rule": built.spec(),
            "seed": runner.seed, "max_new_tokens": runner.max_new_tokens, "k_min": runner.k_min,
            "k_max": runner.k_max, "compile": runner.compile}


def choice_key(spec: RunSpec, artifacts: Artifacts, runner: DecoderRunner, dev: PromptSet, cost: JSONDict) -> JSONDict:
    """The key of the head ``spec`` reads: what its dev rows depend on (``cost``: the evaluation's
    ``Pricing.record``)."""
    name = str(spec.artifact)
    settings = sweep_settings(runner, spec.rule, spec.rule_param, artifacts.heads[name].config.companion_features)
    # a threshold stop's rows do not depend on the sources' measured prices (re-timed by every evaluation), only the
    # choice among them, which the evaluation makes again at its own
    prices = {key: value for key, value in cost.items() if key != "sources"}
    return {"head_sha256": file_sha256(artifacts.head_files[name]), "prompts_sha256": prompts_sha256(dev),
            "settings": settings, "cost": prices}


def _head_runs(specs: Sequence[RunSpec], artifacts: Artifacts, dev: PromptSet) -> dict[str, list[RunSpec]]:
    """The dev runs of ``specs`` of each exported head at its threshold ``h``, by head, in spec order."""
    runs: dict[str, list[RunSpec]] = {}
    for spec in specs:
        if spec.family == HEAD_THRESHOLD and spec.set == dev.name and spec.artifact in artifacts.head_files:
            runs.setdefault(str(spec.artifact), []).append(spec)
    return runs


def recorded_runs(specs: Sequence[RunSpec], artifacts: Artifacts, runner: DecoderRunner, dev: PromptSet,
                  cost: JSONDict, notes: dict[str, str]) -> dict[RunSpec, list[GenerationRecord]]:
    """The records of each head's dev runs of ``specs`` that its threshold choice holds under the same key (``cost``:
    the evaluation's ``Pricing.record``); a note for each head whose record does not match."""
    reused: dict[RunSpec, list[GenerationRecord]] = {}
    for name, runs in _head_runs(specs, artifacts, dev).items():
        path = choice_path(artifacts.head_files[name])
        if not path.is_file():
            continue
        choice = ThresholdChoice.read(path)
        differs = choice.differences(choice_key(runs[0], artifacts, runner, dev, cost))
        if differs:
            notes[f"h_choice[{name}]"] = (f"head[{name}]'s recorded dev runs ({path.name}) not reused (different "
                                          f"{', '.join(differs)}): its h grid decoded here")
            continue
        for spec in runs:
            rows = choice.generations(float(spec.param))
            if rows is not None:
                reused[spec] = [_generation(row).record(spec, dev, "decode") for row in rows]
    return reused


def in_spec_order(specs: Sequence[RunSpec], reused: dict[RunSpec, list[GenerationRecord]],
                  decoded: Sequence[GenerationRecord]) -> list[Record]:
    """Every dev record, in the order of ``specs``: the reused ones and the decoded ones."""
    by_run: dict[RunSpec, list[GenerationRecord]] = {}
    for record in decoded:
        by_run.setdefault(record.run, []).append(record)
    return [record for spec in specs for record in reused.get(spec, by_run.get(spec, []))]


def record_choices(specs: Sequence[RunSpec], records: Sequence[Record], choices: list[Choice], artifacts: Artifacts,
                   runner: DecoderRunner, dev: PromptSet, cost: CostModel, priced: JSONDict) -> list[Path]:
    """Write each head's threshold choice beside it (and re-render its model card): the key, each ``h`` of its dev
    runs in ``specs`` with their totals at ``cost`` and per-prompt ``records``, and the ``h`` of its dev choice in
    ``choices`` (``priced``: the evaluation's ``Pricing.record``); the records' paths."""
    written = []
    for name, runs in _head_runs(specs, artifacts, dev).items():
        chosen = next((c for c in choices if c.family == HEAD_THRESHOLD and c.artifact == name), None)
        if chosen is None:  # no dev run of it generated a token
            continue
        own = [r for r in records if isinstance(r, GenerationRecord) and r.run in runs]
        table = costed(own, cost).set_index("param")
        rows = tuple(_row(float(spec.param), table.loc[float(spec.param)], [r for r in own if r.run == spec])
                     for spec in runs)
        choice = ThresholdChoice(**choice_key(runs[0], artifacts, runner, dev, priced), prompts=asdict(dev.describe()),
                                 threshold=chosen.value, rows=rows)
        written.append(save_threshold_choice(choice, artifacts.head_files[name]))
    return written


def _row(h: float, run: pd.Series, records: list[GenerationRecord]) -> JSONDict:
    """One ``h``'s row of a threshold choice: its totals over the dev prompts and each prompt's record."""
    throughput = float(run["throughput_cost"])
    return {"h": h, "generated": int(run["generated"]), "draft_calls": int(run["draft_calls"]),
            "target_calls": int(run["target_calls"]), "discarded": int(run["discarded"]),
            "modelled_s": float(run["generated"]) / throughput if throughput > 0 else 0.0, "throughput": throughput,
            "generations": [{k: None if k in _NAN_FIELDS and math.isnan(v) else v
                             for k, v in asdict(r.generation).items()} for r in records]}


def _generation(row: JSONDict) -> Generation:
    """A per-prompt record of a threshold choice, as the evaluation's :class:`Generation`."""
    return Generation(**{k: math.nan if k in _NAN_FIELDS and v is None else v for k, v in row.items()})
