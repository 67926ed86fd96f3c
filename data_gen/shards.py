"""Arrow shards on disk: atomic writes, resumption, and the run's config fingerprint.

Layout of a collection directory::

    collect_config.json          fingerprint of the config that owns this directory
    <split>/shard_00000/         a complete HF ``datasets`` shard (save_to_disk), renamed into place
    <split>/.shard_00001.tmp-…   an incomplete shard being written (never read)
    manifest.json                written last, once every shard of the run is complete
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import datasets

from decode.json_types import JSONDict

FINGERPRINT_FILE = "collect_config.json"
MANIFEST_FILE = "manifest.json"
_SHARD_PREFIX = "shard_"


class CollectionDirError(ValueError):
    """The output directory belongs to another run configuration."""


def write_json_atomic(path: Path, payload: JSONDict) -> None:
    """Write JSON to a temp file beside ``path`` and rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
    os.replace(tmp, path)


def claim_directory(root: Path, fingerprint: JSONDict, *, overwrite: bool) -> None:
    """Make ``root`` the home of a run with ``fingerprint``; refuse a directory of another run."""
    marker = root / FINGERPRINT_FILE
    if marker.exists():
        existing = json.loads(marker.read_text())
        if existing == fingerprint:
            return
        if not overwrite:
            changed = sorted(k for k in set(existing) | set(fingerprint) if existing.get(k) != fingerprint.get(k))
            raise CollectionDirError(
                f"{root} holds data collected with a different config (differs in: {', '.join(changed)}); "
                "use another paths.data_dir, or pass collect.overwrite=true to replace it"
            )
        shutil.rmtree(root)
    write_json_atomic(marker, fingerprint)


def shard_path(root: Path, split: str, index: int) -> Path:
    return root / split / f"{_SHARD_PREFIX}{index:05d}"


def complete_shards(root: Path, split: str) -> list[Path]:
    """Complete shards of ``split`` in index order (temp directories are ignored)."""
    folder = root / split
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith(_SHARD_PREFIX))


def write_shard(root: Path, split: str, index: int, rows: list[dict[str, Any]], features: datasets.Features) -> Path:
    """Save ``rows`` as shard ``index`` of ``split``: written under a temp name, then renamed."""
    final = shard_path(root, split, index)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        datasets.Dataset.from_list(rows, features=features).save_to_disk(str(staging))
        os.rename(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def load_split(root: str | Path, split: str) -> datasets.Dataset:
    """All complete shards of ``split`` as one Arrow-backed dataset, in shard order."""
    shards = complete_shards(Path(root), split)
    if not shards:
        raise FileNotFoundError(
            f"no collected data for split '{split}' under {root}; run `python -m data_gen.collect` first"
        )
    return datasets.concatenate_datasets([datasets.load_from_disk(str(s)) for s in shards])
