"""The code version stamped into every artifact: package version plus git commit when available."""

from __future__ import annotations

import subprocess
from functools import lru_cache
from importlib import metadata as importlib_metadata
from pathlib import Path


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


@lru_cache(maxsize=1)
def code_version() -> str:
    """``<version>`` or ``<version>+g<sha>[.dirty]`` when the package runs from a git checkout."""
    try:
        version = importlib_metadata.version("accept-heads")
    except importlib_metadata.PackageNotFoundError:
        version = "unknown"
    sha = _git("rev-parse", "--short=12", "HEAD")
    if not sha:
        return version
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{version}+g{sha}{'.dirty' if dirty else ''}"
