"""Batch costs and cost profiles measured once per machine and model set, then reused by every run (DESIGN §5, §7).

A goodput head, SV's joint lengths and the survival budget decide at measured batch prices; a process that times its
own table decides at that table's noise, so repeated runs of one job chose differently. Here the first run on a
machine measures the table (the median of repeated forwards, :func:`decode.batch_costs.measure_batch_costs`) and
stores it under ``$ACCEPT_HEADS_COSTS_DIR`` (default ``~/.cache/accept-heads/batch-costs``), keyed by what the
prices depend on: the CPU or GPU, torch and its thread count, the models (their ids, files and dtypes) and the grid.
Later runs read it; ``refresh`` measures again. Every run records the table it used and where it came from.

The cost profile (:func:`machine_profile`, ``cost.source=measured``) is the same at batch 1, eager and compiled
(:func:`decode.loops.step_costs.measure_cost_profile`): one file per machine class and model set beside the batch
costs, measured again, with one printed line, when what it was measured with (torch, the models' files, their
dtypes) has changed since.
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

from data_gen.shards import write_json_atomic
from decode.batch_costs import BatchCosts, CostProfile, measure_batch_costs
from decode.compile.config import DEFAULT, SHORT
from decode.json_types import JSONDict
from decode.loops.step_costs import CONTEXT, measure_cost_profile
from decode.timing import device_name, machine_class
from runtime.install import cache_dir

COSTS_ENV = "ACCEPT_HEADS_COSTS_DIR"


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
    path = costs_dir(root) / f"{digest(key)}.json"
    if path.is_file() and not refresh:
        stored: dict[str, Any] = json.loads(path.read_text())
        return BatchCosts.from_dict(stored["costs"]), CostsSource(str(path), True, key)
    print(f"measuring batch costs at B = {key['batches']} (stored for later runs: {path})", flush=True)
    costs = measure_batch_costs(target, draft, batches=batches, max_length=max_length, repeats=repeats,
                                companion=companion)
    write_json_atomic(path, {"key": key, "costs": costs.to_dict()})
    return costs, CostsSource(str(path), False, key)


def costs_dir(root: Path | None = None) -> Path:
    """Where measured costs are stored: ``root``, else ``$ACCEPT_HEADS_COSTS_DIR``, else
    ``~/.cache/accept-heads/batch-costs``."""
    return root or cache_dir(COSTS_ENV, "batch-costs")


def digest(data: JSONDict) -> str:
    """A short name for ``data`` (sha256 of its JSON)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def profile_key(target: PreTrainedModel, draft: PreTrainedModel, companion: PreTrainedModel | None,
                models: JSONDict) -> JSONDict:
    """What a cost profile's prices depend on: the machine class (:func:`decode.timing.machine_class`: the device,
    its SIMD path and torch's threads), torch, the models (their description, files and dtypes), what is timed and the
    compiled forwards' settings."""
    dtypes = {role: str(model.dtype) for role, model in (("target", target), ("draft", draft), ("companion", companion))
              if model is not None}
    return {"machine": machine_class(target.device), "arch": platform.machine(), "torch": torch.__version__,
            "models": models, "files": model_files(models), "dtypes": dtypes, "context": CONTEXT, "lengths": SHORT,
            "compile": repr(DEFAULT)}


def profile_path(key: JSONDict, root: Path | None = None) -> Path:
    """The profile's file: one per machine class and model set (named by the models' ids), whatever torch or the
    models' files are (a profile measured with others is stale)."""
    models = key["models"]
    ids = {role: spec.get("id") for role, spec in models.items() if isinstance(spec, dict)}
    name = f"{models.get('name') or 'models'}-{digest({'machine': key['machine'], 'arch': key['arch'], 'ids': ids})}"
    return costs_dir(root) / f"profile-{name}.json"


def stale(stored: dict[str, Any] | None, key: JSONDict, compiled: bool) -> str | None:
    """Why the stored profile cannot price this run (None: it can)."""
    if stored is None:
        return "no cost profile of these models is stored for this machine"
    changed = sorted(name for name in key.keys() | stored["key"].keys() if stored["key"].get(name) != key.get(name))
    if changed:
        return f"the stored cost profile is stale ({', '.join(changed)} changed)"
    if compiled and stored["profile"].get("compiled") is None:
        return "the stored cost profile has no compiled forwards"
    return None


def machine_profile(target: PreTrainedModel, draft: PreTrainedModel, companion: PreTrainedModel | None = None, *,
                    models: JSONDict, repeats: int, compiled: bool = False, refresh: bool = False,
                    root: Path | None = None) -> tuple[CostProfile, CostsSource]:
    """This machine's cost profile of the models (``models``: the trio's description): the stored one, else (one
    printed line says why) measured now, with compiled forwards too where ``compiled``, and stored."""
    key = profile_key(target, draft, companion, models)
    path = profile_path(key, root)
    stored = json.loads(path.read_text()) if path.is_file() else None
    reason = "a new measurement was asked for" if refresh else stale(stored, key, compiled)
    if reason is None and stored is not None:
        return CostProfile.from_dict(stored["profile"]), CostsSource(str(path), True, key)
    forwards = "eager and compiled" if compiled else "eager"
    print(f"{reason}: measuring it ({key['machine']}, batch 1, {forwards} forwards; stored in {path})", flush=True)
    profile = measure_cost_profile(target, draft, companion, repeats=repeats, compiled=compiled)
    write_json_atomic(path, {"key": key, "profile": profile.to_dict()})
    return profile, CostsSource(str(path), False, key)
