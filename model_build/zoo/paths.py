"""Where the built-in tiny-code model zoo lives on disk: the one lookup its installer and its readers share.

``model_build.zoo`` installs the shipped trio (or a rebuild) into this directory; ``benchmarks.decoding`` and
``benchmarks.ensemble`` only read it (``from_pretrained`` directories ``target/``, ``draft/``,
``companion/``), so the decode library never depends on the installer.
"""

from __future__ import annotations

from pathlib import Path

from runtime.install import cache_dir

ZOO_VERSION = "v5"  # bump whenever the shipped trio (model_build/zoo/tiny-code) or its recipe changes
ENV_VAR = "ACCEPT_HEADS_ZOO_DIR"
METADATA_FILE = "zoo.json"  # a directory without it holds no complete zoo
INSTALL_COMMAND = "python -m model_build.zoo"


def default_cache_dir() -> Path:
    """``$ACCEPT_HEADS_ZOO_DIR`` if set, else ``~/.cache/accept-heads/zoo/<ZOO_VERSION>``."""
    return cache_dir(ENV_VAR, "zoo", ZOO_VERSION)


def is_built(root: Path) -> bool:
    """Whether ``root`` holds a complete zoo."""
    return (root / METADATA_FILE).is_file()


def installed_zoo_dir() -> Path:
    """The default zoo directory; ``FileNotFoundError`` naming the install command when no zoo is installed there."""
    root = default_cache_dir()
    if not is_built(root):
        raise FileNotFoundError(f"no model zoo installed in {root}; install it first with `{INSTALL_COMMAND}`")
    return root
