"""The heads' dev sweeps that training recorded (:data:`~accept_heads.measure.threshold.SWEEP_FILE` beside each head):
reused as the evaluation's dev rows of a head when their key matches (the same head file, dev prompts, decoding
settings and prices), so the dev grid is not decoded twice; otherwise decoded, with one note saying why.
"""

from __future__ import annotations

from collections.abc import Sequence

from accept_heads.evaluation.plan import HEAD_THRESHOLD
from accept_heads.measure.inputs import Artifacts, PromptSet
from accept_heads.measure.runs import DecoderRunner, GenerationRecord, Record, RunSpec
from accept_heads.measure.threshold import SWEEP_FILE, RecordedSweep, SweepKey, prompts_sha256, sweep_settings
from decode.artifacts.gguf import file_sha256
from decode.json_types import JSONDict


def recorded_runs(specs: Sequence[RunSpec], artifacts: Artifacts, runner: DecoderRunner, dev: PromptSet,
                  cost: JSONDict, notes: dict[str, str]) -> dict[RunSpec, list[GenerationRecord]]:
    """The records of each dev run of ``specs`` that a head's recorded sweep holds under the same key (``cost``: the
    evaluation's ``Pricing.record``); a note for each head whose sweep does not match."""
    reused: dict[RunSpec, list[GenerationRecord]] = {}
    sweeps: dict[str, tuple[RecordedSweep, str]] = {}  # head → its recorded sweep and the head file's sha256
    for spec in specs:
        name = str(spec.artifact)
        path = artifacts.head_files.get(name)
        if spec.family != HEAD_THRESHOLD or spec.set != dev.name or path is None or not (path.parent / SWEEP_FILE).is_file():
            continue
        if name not in sweeps:
            sweeps[name] = RecordedSweep.read(path.parent / SWEEP_FILE), file_sha256(path)
        recorded, head_sha256 = sweeps[name]
        settings = sweep_settings(runner, spec.rule, spec.rule_param, artifacts.heads[name].config.companion_features)
        differs = recorded.key.differences(SweepKey(head_sha256, prompts_sha256(dev), settings, cost))
        run = recorded.run(float(spec.param))
        if differs or run is None:
            why = f"different {', '.join(differs)}" if differs else f"h = {spec.param:g} not swept"
            notes[f"h_sweep[{name}]"] = (f"head[{name}]'s recorded dev sweep ({SWEEP_FILE}) not reused ({why}): "
                                         "its dev grid decoded here")
            continue
        reused[spec] = [generation.record(spec, dev, "decode") for generation in run.generations]
    return reused


def in_spec_order(specs: Sequence[RunSpec], reused: dict[RunSpec, list[GenerationRecord]],
                  decoded: Sequence[GenerationRecord]) -> list[Record]:
    """Every dev record, in the order of ``specs``: the reused ones and the decoded ones."""
    by_run: dict[RunSpec, list[GenerationRecord]] = {}
    for record in decoded:
        by_run.setdefault(record.run, []).append(record)
    return [record for spec in specs for record in reused.get(spec, by_run.get(spec, []))]
