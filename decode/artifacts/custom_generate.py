"""The ``custom_generate/`` folder of a head repo: transformers' string door to :mod:`decode.loops.hf_generate`.

``target.generate(**inputs, assistant_model=draft, custom_generate="org/head", trust_remote_code=True)``
(or a local folder in place of the repo id) runs the folder's ``generate.py``, which decodes with the
repo's head (or SV profile) through :func:`decode.generate_from_repo`. The file names the
repo it was written for, since transformers runs it from its module cache, not from the repo.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

FOLDER = "custom_generate"
FILES = (f"{FOLDER}/generate.py", f"{FOLDER}/requirements.txt")

_GENERATE = '''"""transformers' custom_generate entry for the accept-heads {kind} in {source}
(written by accept_heads.push_head).

    target.generate(**inputs, assistant_model=draft, custom_generate="{source}", trust_remote_code=True)
"""

from decode import generate_from_repo

SOURCE = {source!r}
REVISION = {revision!r}
KIND = {kind!r}
FILENAME = {filename!r}


def generate(model, *args, **kwargs):
    return generate_from_repo(model, SOURCE, REVISION, KIND, FILENAME, *args, **kwargs)
'''


def _requirement() -> str:
    """The package the entry imports, at least at the version that wrote it."""
    try:
        return f"accept-heads>={metadata.version('accept-heads')}"
    except metadata.PackageNotFoundError:
        return "accept-heads"


def write_custom_generate(directory: str | Path, source: str, kind: str, filename: str,
                          revision: str | None = None) -> list[str]:
    """Write ``directory/custom_generate/`` for the artifact ``filename`` (``kind``: head or sv_profile) that
    ``source`` (a hub repo id or a local folder) serves; returns the paths written, relative to ``directory``."""
    folder = Path(directory) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "generate.py").write_text(
        _GENERATE.format(source=source, revision=revision, kind=kind, filename=filename), encoding="utf-8")
    (folder / "requirements.txt").write_text(f"{_requirement()}\n", encoding="utf-8")
    return list(FILES)
