"""The zoo on disk: install the shipped trio, verify it at every load, or replace it by a rebuild.

The project ships one reference build of the tiny-code trio (``model_build/zoo/tiny-code/``: three
``from_pretrained`` directories and ``zoo.json``, which records the version and the sha256 of every
file). :func:`ensure_zoo` copies it into the cache directory on first use — no training, the same
bytes on every machine — and checks every file against its recorded sha256 whenever it is loaded.
:func:`rebuild_zoo` trains the recipe instead (:mod:`model_build.zoo.build`) and installs the result
only when it meets every realism target, or when asked to.

Writes are atomic (a finished staging directory is renamed into place) and serialised by a file
lock next to the cache; a process that waits for the lock says so, and for whom. The steps are the real
pairs' too (:mod:`model_build.model_store`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decode.artifacts.hub import ModelLoadError
from model_build.model_store import InstalledModels, ModelStore, RealismMiss, read_record
from model_build.zoo.paths import ENV_VAR, INSTALL_COMMAND, METADATA_FILE, ZOO_VERSION, default_cache_dir

from .build import build_into
from .realism import Realism
from .recipe import ZooRecipe

SHIPPED_DIR = Path(__file__).resolve().parent / "tiny-code"


class ZooError(ModelLoadError):
    """A zoo directory cannot be used as it is; the message names the problem and the fix."""


class ZooRealismError(ZooError, RealismMiss):
    """A rebuild misses a realism target; nothing was installed. ``record`` describes the rebuild."""


STORE = ModelStore(name="zoo", models="trio", record_file=METADATA_FILE, env_var=ENV_VAR, error=ZooError,
                   realism_error=ZooRealismError)


@dataclass
class Zoo(InstalledModels):
    """A zoo on disk: one ``from_pretrained`` directory per role plus ``zoo.json`` (its ``record``).

    ``action`` says what this call did: ``verified`` (already installed), ``installed`` (the shipped
    trio copied in) or ``rebuilt``.
    """

    @property
    def realism(self) -> Realism:
        """The realism figures recorded when this trio was built."""
        return Realism.from_dict(self.record["realism"])


def shipped_metadata() -> dict[str, Any] | None:
    """``zoo.json`` of the shipped trio (None only before a maintainer first ships one)."""
    return read_record(SHIPPED_DIR / METADATA_FILE)


def ensure_zoo(cache_dir: str | Path | None = None, *, reinstall: bool = False) -> Zoo:
    """The zoo in ``cache_dir`` (default: :func:`model_build.zoo.paths.default_cache_dir`), verified file by file.

    An empty directory gets the shipped trio (copied, not trained). ``reinstall`` replaces whatever
    the directory holds (an old version, a rebuild, a corrupt file) with the shipped trio. Raises
    :class:`ZooError` (one line: the problem and the command that fixes it) when the directory holds
    another zoo version or a file that does not match its recorded sha256.
    """

    def install(staging: Path) -> None:
        if shipped_metadata() is None:
            raise ZooError(f"this installation of accept-heads has no shipped trio in {SHIPPED_DIR}; "
                           "reinstall the package (pip install -e .)")
        shutil.copytree(SHIPPED_DIR, staging, dirs_exist_ok=True)

    return STORE.ensure(_root(cache_dir), "installing the shipped tiny-code trio", reinstall=reinstall, verify=verify,
                        install=install, make=Zoo)


def rebuild_zoo(cache_dir: str | Path | None = None, recipe: ZooRecipe | None = None, *,
                require_realism: bool = True, ship: bool = False) -> Zoo:
    """Train ``recipe`` (default: the shipped trio's) and install the result in ``cache_dir``.

    A rebuild that misses a realism target raises :class:`ZooRealismError` and leaves the directory
    as it was, unless ``require_realism`` is off (``--force``; the tests' reduced recipes). ``ship``
    records it as the shipped reference build (maintainers write it into :data:`SHIPPED_DIR`).
    """

    def build(staging: Path) -> tuple[dict[str, Any], list[str]]:
        record = build_into(staging, recipe or ZooRecipe())
        if ship:
            record["origin"] = "shipped"
        else:
            shipped = shipped_metadata()
            record["matches_shipped"] = shipped is not None and record["files"] == shipped["files"]
        return record, Realism.from_dict(record["realism"]).failures()

    return STORE.rebuild(_root(cache_dir), "rebuilding the tiny-code trio", build, require_realism=require_realism,
                         make=Zoo)


def verify(root: Path, shown_as: Path | None = None) -> dict[str, Any]:
    """``zoo.json`` of the zoo in ``root`` after checking its version and every file's sha256."""
    shown = shown_as or root
    fix = f"restore the shipped trio with `{_fix_command(shown)}`"
    record = STORE.read(root, shown, fix)
    if record.get("zoo_version") != ZOO_VERSION:
        raise ZooError(f"the zoo in {shown} is version {record.get('zoo_version')!r}, this code uses "
                       f"{ZOO_VERSION!r}; replace it with the shipped trio: `{_fix_command(shown)}`")
    STORE.check_files(root, record, shipped_metadata(), shown, fix)
    return record


def _root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def _fix_command(root: Path) -> str:
    where = "" if root == default_cache_dir() else f" --cache-dir {root}"
    return f"{INSTALL_COMMAND} --reinstall{where}"


def resolve_zoo_id(role: str, zoo_dir: str | None) -> Path:
    """``zoo:<role>`` → that role's directory of the zoo in ``zoo_dir``, installed on first use (the resolver
    ``pyproject.toml`` declares for :mod:`runtime.schemes`)."""
    return ensure_zoo(zoo_dir).path(role)
