"""Batch costs measured once per machine and model set, then reused by every run (DESIGN §7).

A goodput head, SV's joint lengths and the survival budget decide at measured batch prices; a process that times its
own table decides at that table's noise, so repeated runs of one job chose differently. Here the first run on a
machine measures the table (the median of repeated forwards, :func:`decode.batch_costs.measure_batch_costs`) and
stores it under ``$ACCEPT_HEADS_COSTS_DIR`` (default ``~/.cache/accept-heads/batch-costs``), keyed by what the
prices depend on: the CPU or GPU, torch and its thread count, the models (their ids, files and dtypes) and the grid.
Later runs read it; ``refresh`` measures again. Every run records the table it used and where it came from.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from data_gen.model_store import cache_dir
from data_gen.shards import write_json_atomic
from decode.batch_costs import BatchCosts, measure_batch_costs
from decode.json_types import JSONDict

COSTS_ENV = "ACCEPT_HEADS_COSTS_DIR"


def device_name() -> str:
    """The accelerator's name, else the CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def model_files(description: JSONDict) -> JSONDict:
    """Each model's weight files (size and modification time) where it resolves to a local directory: a rebuilt
    model at the same path is another model."""
    stamps: JSONDict = {}
    for role, spec in description.items():
        path = Path(spec["resolved"]) if isinstance(spec, dict) and spec.get("resolved") else None
        if path is not None and path.is_dir():
            stamps[role] = {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(path.glob("*.safetensors"))}
    return stamps


@dataclass(frozen=True)
class CostsSource:
    """Where a run's batch costs came from."""

    path: str  # the machine's stored table
    reused: bool  # read from an earlier run (False: measured by this one)
    key: JSONDict  # what the prices depend on

    def to_dict(self) -> JSONDict:
        return {"path": self.path, "reused": self.reused, "key": self.key}


def machine_batch_costs(target: PreTrainedModel, draft: PreTrainedModel, *, models: JSONDict, batches: list[int],
                        max_length: int, repeats: int, companion: PreTrainedModel | None = None,
                        refresh: bool = False, root: Path | None = None) -> tuple[BatchCosts, CostsSource]:
    """This machine's batch costs for ``models`` (a trio's description) at ``batches`` × ``1..max_length`` tokens:
    the stored table, else measured now and stored."""
    key: JSONDict = {"device": device_name(), "arch": platform.machine(), "torch": torch.__version__,
                     "threads": torch.get_num_threads(), "models": models, "files": model_files(models),
                     "batches": sorted(set(batches)), "max_length": max_length, "repeats": repeats,
                     "companion": companion is not None}
    name = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = (root or cache_dir(COSTS_ENV, "batch-costs")) / f"{name}.json"
    if path.is_file() and not refresh:
        stored: dict[str, Any] = json.loads(path.read_text())
        return BatchCosts.from_dict(stored["costs"]), CostsSource(str(path), True, key)
    print(f"measuring batch costs at B = {key['batches']} (stored for later runs: {path})", flush=True)
    costs = measure_batch_costs(target, draft, batches=batches, max_length=max_length, repeats=repeats,
                                companion=companion)
    write_json_atomic(path, {"key": key, "costs": costs.to_dict()})
    return costs, CostsSource(str(path), False, key)
