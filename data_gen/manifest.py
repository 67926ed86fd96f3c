"""The collection manifest (what was collected, how, how much): built and read here; a run's progress; its summary."""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console
from rich.table import Table

from ahconf.schema import CollectJob, ConfigError, RulesConfig, SamplingConfig
from data_gen.labels import (
    candidate_column,
    companion_columns,
    depth_column,
    indicator_rules,
    label_rules,
    stored_depths,
)
from data_gen.shards import MANIFEST_FILE, complete_shards, load_split
from decode.artifacts.version import code_version
from decode.json_types import JSONDict
from decode.rules import RuleSpec
from decode.sampling import Sampling

if TYPE_CHECKING:
    from runtime.models import Trio

# 2: companion indicators per rule (sv_*_<rule>), logits sliced to the shared vocabulary; 3: draft candidates from
# each prompt's own stream, response_logprob / target_entropy columns, the responses source and the sampling check
MANIFEST_VERSION = 3
#: |z| above this (or a greedy argmax agreement below AGREEMENT_FLOOR) says the responses are not samples of the
#: run's transform: under the hypothesis that they are, |z| > 4 has probability 6e-5.
Z_LIMIT = 4.0
AGREEMENT_FLOOR = 0.99


@dataclass(frozen=True)
class ModelEntry:
    """One model of the collection as ``models`` records it (what code reads of it)."""

    id: str  # as configured: a hub id, a path, ``zoo:<role>`` or ``real:<pair>/<role>``
    revision: str | None


@dataclass(frozen=True)
class CollectionManifest:
    """``manifest.json`` of a collected dataset: built by :func:`build_manifest`, read by :func:`read_manifest`.

    ``models``: role → the model's description (``id``, ``revision``, ...) plus the shared
    ``tokenizer_hash`` and ``vocab_size``; ``rules``: label column → the rule's spec; ``splits``:
    split → counts, means and the :func:`sampling_check` recomputed from its complete shards, plus
    this run's progress; ``responses``: where the responses came from (null: generated in the job).
    """

    manifest_version: int
    exp_name: str
    models: JSONDict
    tokenizer_hash: str
    sampling: JSONDict
    rules: dict[str, RuleSpec]
    fuzzy: str
    companion_indicators: dict[str, JSONDict]
    prompts: JSONDict
    max_new_tokens: int
    seed: int
    code_version: str
    python: str
    world_size: int
    wall_seconds: float
    splits: dict[str, JSONDict]
    responses: JSONDict | None

    def to_dict(self) -> JSONDict:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: JSONDict, source: str = "the manifest") -> CollectionManifest:
        """The record of a parsed ``manifest.json``; one that lacks a field is refused, naming it."""
        missing = [f.name for f in fields(cls) if f.name not in doc]
        if missing:
            raise ConfigError(f"{source} (manifest_version {doc.get('manifest_version')}) lacks {', '.join(missing)}; "
                             f"collect the data again with this version (manifest_version {MANIFEST_VERSION})")
        return cls(**{f.name: doc[f.name] for f in fields(cls)})

    def model(self, role: str) -> ModelEntry | None:
        """The ``role`` model (None when the data was collected without one)."""
        description = self.models.get(role)
        if not isinstance(description, dict):
            return None
        return ModelEntry(id=description["id"], revision=description.get("revision"))

    @property
    def vocab_size(self) -> int:
        """The vocabulary the trio's logits were sliced to."""
        return self.models["vocab_size"]

    def positions(self) -> dict[str, int]:
        """Labelled positions per split."""
        return {split: stats["labelled_positions"] for split, stats in self.splits.items()}


def read_manifest(data_dir: str | Path) -> tuple[CollectionManifest, str]:
    """The collection manifest of ``data_dir`` and the SHA-256 of its bytes (recorded in exported artifacts)."""
    path = Path(data_dir) / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no collected data at {data_dir} ({MANIFEST_FILE} missing); run `python -m data_gen.collect` first"
        )
    raw = path.read_bytes()
    return CollectionManifest.from_dict(json.loads(raw), str(path)), hashlib.sha256(raw).hexdigest()


@dataclass
class SplitProgress:
    """What this invocation did for one split (the manifest recounts the data itself)."""

    prompts_available: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    shards_total: int = 0
    shards_written: int = 0
    response_tokens: int = 0
    seconds: float = 0.0


def _mean(table, column: str) -> float | None:
    if column not in table.column_names:
        return None
    values = np.concatenate([np.asarray(v, dtype=np.float64) for v in table[column]] or [np.zeros(0)])
    values = values[~np.isnan(values)]  # a feature draft's deeper columns: NaN where no round reaches the position
    return float(values.mean()) if values.size else None


def sampling_check(table, greedy: bool) -> JSONDict:
    """Are the responses samples of the run's transform? A test from the target's own distributions.

    Sampled transform: if each token ``x_t`` is drawn from the target's transformed ``p_t``, the
    surprisal ``-log p_t(x_t)`` has conditional mean ``H(p_t)``, so ``D_t = -log p_t(x_t) - H(p_t)`` is
    a martingale difference; ``z = Σ_r S_r / sqrt(Σ_r S_r²)`` over the responses' sums ``S_r`` is
    ≈ N(0, 1) for real samples and far from 0 for greedy, differently tempered or another model's
    text (a token outside the transform's support is counted and fails the check on its own).
    Greedy transform: the share of tokens equal to the target's argmax (1 up to ties).
    """
    if greedy:
        pairs = [(np.asarray(r), np.asarray(a)) for r, a in zip(table["response_ids"], table["target_argmax"])]
        agreement = float(np.mean(np.concatenate([r == a for r, a in pairs]))) if pairs else None
        return {"argmax_agreement": agreement, "passed": agreement is None or agreement >= AGREEMENT_FLOOR}
    surprisal = [-np.asarray(v, dtype=np.float64) for v in table["response_logprob"]]
    entropy = [np.asarray(v, dtype=np.float64) for v in table["target_entropy"]]
    outside = int(sum(np.isinf(s).sum() for s in surprisal))
    sums = np.array([(s - h)[np.isfinite(s)].sum() for s, h in zip(surprisal, entropy)])
    finite = np.concatenate([s[np.isfinite(s)] for s in surprisal] or [np.zeros(0)])
    z = float(sums.sum() / np.sqrt((sums**2).sum())) if (sums**2).sum() > 0 else 0.0
    return {"mean_surprisal": float(finite.mean()) if finite.size else None,
            "mean_entropy": float(np.concatenate(entropy).mean()) if entropy else None,
            "z": z, "outside_support": outside, "passed": abs(z) <= Z_LIMIT and outside == 0}


def companion_schema(sampling_config: SamplingConfig, rules: RulesConfig) -> dict[str, JSONDict]:
    """Per configured rule: its indicator columns, the transform and the candidate column they use.

    What :func:`decode.profile.companion_indicators` is called with at decode time, recorded so
    that the stored ``sv_*_<rule>`` columns describe themselves.
    """
    sampling = Sampling(**asdict(sampling_config))
    return {
        rule.name: {"columns": companion_columns(rule), "transform": rule.transform(sampling).to_dict(),
                    "candidate": candidate_column(rule)}
        for rule in indicator_rules(rules)
    }


def split_stats(root: Path, split: str, label_columns: list[str], indicator_columns: dict[str, dict[str, str]],
                greedy: bool) -> JSONDict:
    """Counts, means and the :func:`sampling_check` recomputed from the complete shards of ``split``.

    ``indicator_columns``: rule name → its companion columns (empty without a companion). A split
    without shards gets zeros.
    """
    if not complete_shards(root, split):
        return {"responses": 0, "response_tokens": 0, "labelled_positions": 0, "finished_with_eos": 0,
                "mean_label": dict.fromkeys(label_columns), "mean_divergence": dict.fromkeys(("js", "kl", "tv")),
                "mean_sv": {rule: {"x": None, "y": None} for rule in indicator_columns}, "sampling_check": None}
    table = load_split(root, split)
    response_tokens = int(sum(len(r) for r in table["response_ids"]))
    depths = stored_depths(table.column_names, label_columns[0]) if label_columns else 1
    by_depth = {c: [_mean(table, depth_column(c, d)) for d in range(1, depths + 1)] for c in label_columns}
    return ({"mean_label_by_depth": by_depth} if depths > 1 else {}) | {
        "responses": len(table),
        "response_tokens": response_tokens,
        "labelled_positions": response_tokens,
        "finished_with_eos": int(sum(table["finished"])),
        "mean_label": {c: _mean(table, c) for c in label_columns},
        "mean_divergence": {d: _mean(table, d) for d in ("js", "kl", "tv")},
        "mean_sv": {rule: {"x": _mean(table, c["x"]), "y": _mean(table, c["y"])}
                    for rule, c in indicator_columns.items()},
        "sampling_check": sampling_check(table, greedy),
    }


def build_manifest(
    job: CollectJob, trio: Trio, root: Path, progress: dict[str, SplitProgress], seconds: float, world_size: int,
    responses: JSONDict | None = None,
) -> CollectionManifest:
    """Everything needed to know what the dataset is and to regenerate it (``responses``: the record of the given
    responses' source, :meth:`data_gen.responses.ResponsesSource.record`; None when generated in the job)."""
    label_columns = label_rules(job.rules)
    companion = companion_schema(job.sampling, job.rules) if trio.companion is not None else {}
    indicator_columns = {rule: schema["columns"] for rule, schema in companion.items()}
    splits = {}
    for split, done in progress.items():
        splits[split] = {
            **split_stats(root, split, list(label_columns), indicator_columns, Sampling(**asdict(job.sampling)).greedy),
            "prompts_available": done.prompts_available,
            "prompts_skipped": done.skipped,
            "shards": done.shards_total,
            "this_run": {"shards_written": done.shards_written, "response_tokens": done.response_tokens,
                         "seconds": round(done.seconds, 3)},
        }
    return CollectionManifest(
        manifest_version=MANIFEST_VERSION,
        exp_name=job.exp_name,
        models=trio.description.to_dict(),
        tokenizer_hash=trio.description.tokenizer_hash,
        sampling=asdict(job.sampling),
        rules={column: rule.spec() for column, rule in label_columns.items()},
        fuzzy="labels are 1[divergence < T] on the stored js / kl / tv columns, for any T",
        companion_indicators=companion,
        prompts=asdict(job.prompts),
        max_new_tokens=job.collect.max_new_tokens,
        seed=job.seed,
        code_version=code_version(),
        python=platform.python_version(),
        world_size=world_size,
        wall_seconds=round(seconds, 3),
        splits=splits,
        responses=responses,
    )


def print_summary(manifest: CollectionManifest) -> None:
    """The end-of-run table, one column per split: prompts, tokens, positions, mean labels, X/Y, speed."""
    splits = manifest.splits
    table = Table(title=f"data_gen.collect — {manifest.exp_name}")
    table.add_column("")
    for split in splits:
        table.add_column(split, justify="right")

    def fmt(value: float | None) -> str:
        return "—" if value is None else f"{value:.3f}"

    def row(name: str, cell) -> None:
        table.add_row(name, *[cell(stats) for stats in splits.values()])

    row("prompts collected", lambda s: str(s["responses"]))
    row("prompts skipped", lambda s: ", ".join(f"{k} {v}" for k, v in s["prompts_skipped"].items()) or "0")
    row("response tokens", lambda s: str(s["response_tokens"]))
    row("labelled positions", lambda s: str(s["labelled_positions"]))
    depths = any("mean_label_by_depth" in s for s in splits.values())
    for column in manifest.rules:
        row(f"mean {column}", lambda s, c=column: fmt(s["mean_label"][c]))
        if depths:  # a feature draft's labels at each depth of a round
            row("  at depth 1, 2, ...", lambda s, c=column: " ".join(fmt(v) for v in s.get("mean_label_by_depth",
                                                                                              {}).get(c, [])))
    for name in ("js", "tv"):
        row(f"mean {name}(p, q)", lambda s, n=name: fmt(s["mean_divergence"][n]))
    for rule in manifest.companion_indicators:
        row(f"mean SV X / Y ({rule})", lambda s, r=rule: f"{fmt(s['mean_sv'][r]['x'])} / {fmt(s['mean_sv'][r]['y'])}")
    row("sampling check", lambda s: _check_cell(s["sampling_check"]))
    row("this run: seconds", lambda s: f"{s['this_run']['seconds']:.1f}")
    row(
        "this run: tokens/s",
        lambda s: f"{s['this_run']['response_tokens'] / max(s['this_run']['seconds'], 1e-9):.0f}",
    )
    Console().print(table)
    print(f"wall time {manifest.wall_seconds:.1f} s")
    for split, stats in splits.items():
        check = stats["sampling_check"]
        if check is not None and not check["passed"]:
            print(f"warning: the {split} responses do not look like samples of the run's transform "
                  f"({_check_cell(check)}); their labels describe another distribution — check the sampling "
                  "settings that produced them (docs/collect-and-train.md, 'Collecting from responses')",
                  file=sys.stderr)


def _check_cell(check: JSONDict | None) -> str:
    if check is None:
        return "—"
    if "argmax_agreement" in check:
        return f"argmax agreement {check['argmax_agreement']:.3f}"
    outside = f", {check['outside_support']} outside the support" if check["outside_support"] else ""
    return f"z = {check['z']:+.1f}{outside}"
