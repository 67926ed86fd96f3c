"""Saving and loading an evaluation's results (pandas / pyarrow only: the notebooks start here).

Layout of ``evaluate.out_dir``::

    results.parquet      the table; the metadata JSON is also in the Parquet schema (key ``accept_heads``)
    results.csv          the same table (list columns as JSON), a ``#`` header line naming the sidecar
    results.json         metadata sidecar: models, heads, profile, prompt sets, seeds, cost models, latency,
                         cost fit, selection
    generations.parquet  one row per generated sequence (counts, verified length of every round)
    calibration.parquet  heads' dev predictions vs labels (reliability diagrams)
    source_calibration.parquet  each league source's P̂ against observed outcomes in decoding (AUROC, ECE, Brier)
    batch_axis.parquet   throughput per policy and batch size (``evaluate.batch_axis.sizes``; empty without)
    wallclock.parquet    measured tokens/s per method at batch 1, beside the modelled figures
                         (``evaluate.wallclock.sets``; empty without); ``wallclock_timings.parquet`` per decode
    figures/*.png
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from accept_heads.evaluation.metadata import EvaluationMetadata

RESULTS_ENV = "ACCEPT_HEADS_RESULTS"
DEFAULT_ROOT = "runs/tiny/eval"
METADATA_KEY = b"accept_heads"
LIST_COLUMNS = ("per_position_acceptance", "position_offered", "position_accepted", "rounds_by_length")


@dataclass
class Results:
    """One evaluation's table, per-generation records, calibration predictions and metadata."""

    root: Path
    table: pd.DataFrame
    generations: pd.DataFrame
    calibration: pd.DataFrame
    metadata: EvaluationMetadata
    batch_axis: pd.DataFrame = field(default_factory=pd.DataFrame)
    wallclock: pd.DataFrame = field(default_factory=pd.DataFrame)
    wallclock_timings: pd.DataFrame = field(default_factory=pd.DataFrame)
    source_calibration: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def figure_dir(self) -> Path:
        return self.root / "figures"


def _json(payload: dict) -> str:
    return json.dumps(payload, indent=2, sort_keys=True, default=str)


def save_results(results: Results) -> dict[str, Path]:
    """Write every file of the layout above; returns their paths by name."""
    root = results.root
    root.mkdir(parents=True, exist_ok=True)
    paths = {name: root / name for name in ("results.parquet", "results.csv", "results.json",
                                            "generations.parquet", "calibration.parquet", "batch_axis.parquet",
                                            "wallclock.parquet", "wallclock_timings.parquet",
                                            "source_calibration.parquet")}
    text = _json(results.metadata.to_dict())
    arrow = pa.Table.from_pandas(results.table, preserve_index=False)
    pq.write_table(arrow.replace_schema_metadata({**(arrow.schema.metadata or {}), METADATA_KEY: text.encode()}),
                   paths["results.parquet"])
    flat = results.table.copy()
    for column in LIST_COLUMNS:
        if column in flat:
            flat[column] = flat[column].map(json.dumps)
    with paths["results.csv"].open("w") as handle:
        handle.write("# accept_heads.evaluate results; metadata in results.json (and in results.parquet)\n")
        flat.to_csv(handle, index=False)
    paths["results.json"].write_text(text + "\n")
    results.generations.to_parquet(paths["generations.parquet"], index=False)
    results.calibration.to_parquet(paths["calibration.parquet"], index=False)
    results.batch_axis.to_parquet(paths["batch_axis.parquet"], index=False)
    results.wallclock.to_parquet(paths["wallclock.parquet"], index=False)
    results.wallclock_timings.to_parquet(paths["wallclock_timings.parquet"], index=False)
    results.source_calibration.to_parquet(paths["source_calibration.parquet"], index=False)
    return paths


def results_root(root: str | Path | None = None) -> Path:
    """``root``, else ``$ACCEPT_HEADS_RESULTS``, else ``runs/tiny/eval``."""
    return Path(root or os.environ.get(RESULTS_ENV) or DEFAULT_ROOT)


def load_results(root: str | Path | None = None) -> Results:
    """Load what :func:`save_results` wrote (see :func:`results_root` for the default location)."""
    root = results_root(root)
    if not (root / "results.parquet").is_file():
        raise FileNotFoundError(f"no evaluation results at {root}; run `python -m accept_heads.evaluate` first "
                                f"or set {RESULTS_ENV}")
    table = pq.read_table(root / "results.parquet")
    metadata = EvaluationMetadata.from_dict(json.loads(table.schema.metadata[METADATA_KEY]))

    def optional(name: str) -> pd.DataFrame:  # absent in results written before the batch axis / wall clock / league
        return pd.read_parquet(root / name) if (root / name).is_file() else pd.DataFrame()

    return Results(root, table.to_pandas(), pd.read_parquet(root / "generations.parquet"),
                   pd.read_parquet(root / "calibration.parquet"), metadata, optional("batch_axis.parquet"),
                   optional("wallclock.parquet"), optional("wallclock_timings.parquet"),
                   optional("source_calibration.parquet"))
