"""Where the built-in tiny-code model zoo lives on disk: the one lookup its builder and its readers share.

``data_gen.zoo`` builds the zoo into this directory; ``decode.bench`` and ``decode.bench_ensemble``
only read it (``from_pretrained`` directories ``target/``, ``draft/``, ``companion/``), so the
decode library never depends on the builder.
"""

from __future__ import annotations

import os
from pathlib import Path

ZOO_VERSION = "v4"  # bump whenever data_gen.zoo's default recipe or its build procedure changes
ENV_VAR = "ACCEPT_HEADS_ZOO_DIR"
METADATA_FILE = "zoo.json"  # written last: a directory without it holds no complete zoo
BUILD_COMMAND = "python -m data_gen.zoo"


def default_cache_dir() -> Path:
    """``$ACCEPT_HEADS_ZOO_DIR`` if set, else ``~/.cache/accept-heads/zoo/<ZOO_VERSION>``."""
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "accept-heads" / "zoo" / ZOO_VERSION


def is_built(root: Path) -> bool:
    """Whether ``root`` holds a complete zoo."""
    return (root / METADATA_FILE).is_file()


def built_zoo_dir() -> Path:
    """The default zoo directory; ``FileNotFoundError`` naming the build command when no zoo is built there."""
    root = default_cache_dir()
    if not is_built(root):
        raise FileNotFoundError(f"no built model zoo in {root}; build it first with `{BUILD_COMMAND}`")
    return root
