"""Saving and loading an evaluation's results (pandas / pyarrow and the typed metadata record: the notebooks start
here).

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

Every file is written atomically (a temp file renamed into place), ``results.*`` last and ``results.parquet`` (what
:func:`load_results` reads first) very last; an earlier evaluation's ``results.*`` are removed before the first new
file lands (:func:`retire_results`). So a run killed at any moment leaves either no ``results.parquet`` or one whose
every file is its own: never a complete-looking mix of two evaluations, or a part of one.
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
from decode.artifacts.serialization import write_atomic

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


#: The files that hold the table; ``results.parquet`` is what :func:`load_results` looks for.
RESULTS_FILES = ("results.parquet", "results.csv", "results.json")


def retire_results(root: str | Path) -> None:
    """Remove an earlier evaluation's ``results.*`` from ``root``: from here until :func:`save_results` is done, the
    folder holds nothing that loads, or reads, as complete results (its other files may still be the earlier run's)."""
    for name in RESULTS_FILES:
        (Path(root) / name).unlink(missing_ok=True)


def save_results(results: Results) -> dict[str, Path]:
    """Write every file of the layout above, each atomically, ``results.parquet`` last (see the module's docstring);
    returns their paths by name."""
    root = results.root
    root.mkdir(parents=True, exist_ok=True)
    frames = {"generations.parquet": results.generations, "calibration.parquet": results.calibration,
              "batch_axis.parquet": results.batch_axis, "wallclock.parquet": results.wallclock,
              "wallclock_timings.parquet": results.wallclock_timings,
              "source_calibration.parquet": results.source_calibration}
    paths = {name: root / name for name in (*RESULTS_FILES, *frames)}
    retire_results(root)
    for name, data in frames.items():
        write_atomic(paths[name], lambda tmp, data=data: data.to_parquet(tmp, index=False))
    text = _json(results.metadata.to_dict())
    write_atomic(paths["results.json"], lambda tmp: tmp.write_text(text + "\n"))
    flat = results.table.copy()
    for column in LIST_COLUMNS:
        if column in flat:
            flat[column] = flat[column].map(json.dumps)

    def write_csv(tmp: Path) -> None:
        with tmp.open("w") as handle:
            handle.write("# accept_heads.evaluate results; metadata in results.json (and in results.parquet)\n")
            flat.to_csv(handle, index=False)

    write_atomic(paths["results.csv"], write_csv)
    arrow = pa.Table.from_pandas(results.table, preserve_index=False)
    arrow = arrow.replace_schema_metadata({**(arrow.schema.metadata or {}), METADATA_KEY: text.encode()})
    write_atomic(paths["results.parquet"], lambda tmp: pq.write_table(arrow, tmp))
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
