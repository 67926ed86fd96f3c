"""The collection manifest (what was collected, how, how much): built and read here; a run's progress; its summary."""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ahconf.schema import CollectJob, ConfigError, RulesConfig, SamplingConfig
from data_gen.labels import candidate_column, companion_columns, indicator_rules, label_rules
from data_gen.shards import MANIFEST_FILE, complete_shards, load_split
from decode.artifacts.version import code_version
from decode.sampling import Sampling

if TYPE_CHECKING:
    from data_gen.models import Trio

MANIFEST_VERSION = 2  # 2: companion indicators per rule (sv_*_<rule>), logits sliced to the shared vocabulary


@dataclass(frozen=True)
class CollectionManifest:
    """``manifest.json`` of a collected dataset: built by :func:`build_manifest`, read by :func:`read_manifest`.

    ``models``: role → the model's description (``id``, ``revision``, ...) plus the shared
    ``tokenizer_hash`` and ``vocab_size``; ``rules``: label column → the rule's spec; ``splits``:
    split → counts and means recomputed from its complete shards, plus this run's progress.
    """

    manifest_version: int
    exp_name: str
    models: dict[str, Any]
    tokenizer_hash: str
    sampling: dict[str, Any]
    rules: dict[str, dict[str, Any]]
    fuzzy: str
    companion_indicators: dict[str, dict[str, Any]]
    prompts: dict[str, Any]
    max_new_tokens: int
    seed: int
    code_version: str
    python: str
    world_size: int
    wall_seconds: float
    splits: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], source: str = "the manifest") -> CollectionManifest:
        """The record of a parsed ``manifest.json``; one that lacks a field is refused, naming it."""
        missing = [f.name for f in fields(cls) if f.name not in doc]
        if missing:
            raise ConfigError(f"{source} (manifest_version {doc.get('manifest_version')}) lacks {', '.join(missing)}; "
                             f"collect the data again with this version (manifest_version {MANIFEST_VERSION})")
        return cls(**{f.name: doc[f.name] for f in fields(cls)})

    def model(self, role: str) -> dict[str, Any]:
        """The description of the ``role`` model (``{}`` when the data was collected without one)."""
        description = self.models.get(role)
        return description if isinstance(description, dict) else {}

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
    return float(values.mean()) if values.size else None


def companion_schema(sampling_config: SamplingConfig, rules: RulesConfig) -> dict[str, dict[str, Any]]:
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


def split_stats(root: Path, split: str, label_columns: list[str], indicator_columns: dict[str, dict[str, str]]
                ) -> dict[str, Any]:
    """Counts and means recomputed from the complete shards of ``split`` (zeros when it has none).

    ``indicator_columns``: rule name → its companion columns (empty without a companion).
    """
    if not complete_shards(root, split):
        return {"responses": 0, "response_tokens": 0, "labelled_positions": 0, "finished_with_eos": 0,
                "mean_label": dict.fromkeys(label_columns), "mean_divergence": dict.fromkeys(("js", "kl", "tv")),
                "mean_sv": {rule: {"x": None, "y": None} for rule in indicator_columns}}
    table = load_split(root, split)
    response_tokens = int(sum(len(r) for r in table["response_ids"]))
    return {
        "responses": len(table),
        "response_tokens": response_tokens,
        "labelled_positions": response_tokens,
        "finished_with_eos": int(sum(table["finished"])),
        "mean_label": {c: _mean(table, c) for c in label_columns},
        "mean_divergence": {d: _mean(table, d) for d in ("js", "kl", "tv")},
        "mean_sv": {rule: {"x": _mean(table, c["x"]), "y": _mean(table, c["y"])}
                    for rule, c in indicator_columns.items()},
    }


def build_manifest(
    job: CollectJob, trio: Trio, root: Path, progress: dict[str, SplitProgress], seconds: float, world_size: int
) -> CollectionManifest:
    """Everything needed to know what the dataset is and to regenerate it."""
    label_columns = label_rules(job.rules)
    companion = companion_schema(job.sampling, job.rules) if trio.companion is not None else {}
    indicator_columns = {rule: schema["columns"] for rule, schema in companion.items()}
    splits = {}
    for split, done in progress.items():
        splits[split] = {
            **split_stats(root, split, list(label_columns), indicator_columns),
            "prompts_available": done.prompts_available,
            "prompts_skipped": done.skipped,
            "shards": done.shards_total,
            "this_run": {"shards_written": done.shards_written, "response_tokens": done.response_tokens,
                         "seconds": round(done.seconds, 3)},
        }
    return CollectionManifest(
        manifest_version=MANIFEST_VERSION,
        exp_name=job.exp_name,
        models=trio.description,
        tokenizer_hash=trio.description["tokenizer_hash"],
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
    for column in manifest.rules:
        row(f"mean {column}", lambda s, c=column: fmt(s["mean_label"][c]))
    for name in ("js", "tv"):
        row(f"mean {name}(p, q)", lambda s, n=name: fmt(s["mean_divergence"][n]))
    for rule in manifest.companion_indicators:
        row(f"mean SV X / Y ({rule})", lambda s, r=rule: f"{fmt(s['mean_sv'][r]['x'])} / {fmt(s['mean_sv'][r]['y'])}")
    row("this run: seconds", lambda s: f"{s['this_run']['seconds']:.1f}")
    row(
        "this run: tokens/s",
        lambda s: f"{s['this_run']['response_tokens'] / max(s['this_run']['seconds'], 1e-9):.0f}",
    )
    Console().print(table)
    print(f"wall time {manifest.wall_seconds:.1f} s")
