"""The standard-library text the project ships: the built-in prompt sets and the zoo's held-out text.

Cut once from Python 3.11.7's standard library and stored in ``data_gen/prompts/data`` as gzipped
JSON lines, each file's sha256 in ``manifest.json`` and checked whenever it is read, so every Python
decodes the same prompts and measures the trio on the same text (``docs/zoo.md``). Only
``python -m data_gen.prompts --rebuild`` (maintainers) writes them, from the running Python's.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from data_gen.prompts.types import PromptSourceError
from decode.json_types import JSONDict
from runtime.install import replace_dir, staging_dir, write_json

DATA_DIR = Path(__file__).resolve().parent / "data"
MANIFEST = "manifest.json"
HELD_OUT_FILE = "held-out-dev.jsonl.gz"  # the dev split's modules: the zoo's held-out loss and line-start prompts
REBUILD_COMMAND = "python -m data_gen.prompts --rebuild"
_RESTORE = "restore it from the repository (git checkout -- data_gen/prompts/data) or reinstall accept-heads"

Record = JSONDict  # a JSON document read from or written to disk


def prompt_set_file(split: str, style: str) -> str:
    """The shipped file of one built-in split and style, e.g. ``builtin-dev-function.jsonl.gz``."""
    return f"builtin-{split}-{style}.jsonl.gz"


def read_records(name: str, data_dir: Path = DATA_DIR) -> list[Record]:
    """The records of one shipped file, after checking its sha256; one-line :class:`PromptSourceError` otherwise."""
    path = data_dir / name
    entry = manifest(data_dir)["files"].get(name)
    if entry is None:
        raise PromptSourceError(f"{data_dir / MANIFEST} records no file {name}; {_RESTORE}")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise PromptSourceError(f"cannot read the shipped file {path} ({error.strerror}); {_RESTORE}") from None
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise PromptSourceError(f"{path} does not match its sha256 in {MANIFEST} (corrupt or modified); {_RESTORE}")
    lines = gzip.decompress(data).decode("ascii").split("\n")  # one JSON record per line, the last one empty
    return [json.loads(line) for line in lines[:-1]]


def manifest(data_dir: Path = DATA_DIR) -> Record:
    """``manifest.json``: the Python the files were cut with, and each file's sha256 and record count."""
    path = data_dir / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise PromptSourceError(f"the manifest {path} is unreadable ({type(error).__name__}); {_RESTORE}") from None


@lru_cache(maxsize=1)
def held_out_modules() -> tuple[tuple[str, str], ...]:
    """``(module name, source text)`` of every dev-split module, sorted by name: the zoo's held-out text."""
    return tuple((record["module"], record["text"]) for record in read_records(HELD_OUT_FILE))


def write_files(files: dict[str, Iterable[Record]], python: str, data_dir: Path = DATA_DIR) -> None:
    """Replace ``data_dir`` by ``files`` (name → records) and their manifest, atomically (maintainers only)."""
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(data_dir) as staging:
        staging.chmod(0o755)  # a package directory, not a private temp one
        entries = {}
        for name, records in sorted(files.items()):
            lines = [json.dumps(record) + "\n" for record in records]
            data = gzip.compress("".join(lines).encode("ascii"), compresslevel=9, mtime=0)  # mtime 0: same bytes
            (staging / name).write_bytes(data)
            entries[name] = {"sha256": hashlib.sha256(data).hexdigest(), "records": len(lines)}
        write_json(staging / MANIFEST, {"python": python, "made_by": REBUILD_COMMAND, "files": entries})
        replace_dir(staging, data_dir)
