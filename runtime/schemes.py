"""Model ids with a scheme (``zoo:<role>``, ``real:<pair>/<role>``): the resolvers the model builders declare.

A resolver installs models on first use, which is the model builders' work (:mod:`model_build`, a layer above this
one), so this module names none of them: model_build declares each as a package entry point of the group
:data:`GROUP` in ``pyproject.toml``, named by its scheme, and this module loads the one an id's scheme asks for on
first use (tests/test_imports.py checks that every scheme has one, a function of model_build). Every entry point
that loads models (collection, regeneration, training, evaluation, benchmarks) resolves through here, so none of
them has to import model_build or register a scheme.

A resolver takes the id without its prefix and the configured ``paths.zoo_dir`` (the zoo's install directory;
other schemes ignore it) and returns the directory to load, installed and verified.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from ahconf.schema import REAL_PREFIX, ZOO_PREFIX
from decode.artifacts.hub import ModelLoadError

Resolver = Callable[[str, "str | None"], Path]  # (id without its prefix, paths.zoo_dir) -> directory to load

GROUP = "accept_heads.model_schemes"  # the entry-point group of the resolvers, each named by its scheme
SCHEMES = (ZOO_PREFIX, REAL_PREFIX)  # the id prefixes the config knows (ahconf.schema)


def declared() -> dict[str, EntryPoint]:
    """Id prefix → the installed entry point of its resolver (:data:`GROUP`)."""
    return {f"{point.name}:": point for point in entry_points(group=GROUP)}


@cache
def resolver(prefix: str) -> Resolver:
    """The resolver declared for ``prefix``, loaded on first use."""
    point = declared().get(prefix)
    if point is None:
        raise ModelLoadError(f"no resolver of {prefix} ids is installed (entry points {GROUP!r}): install the project "
                             "again (`make setup`, or `pip install -e .`)")
    return point.load()


def resolve_id(model_id: str, zoo_dir: str | None = None) -> str:
    """``model_id`` as a path to load: an id with a scheme of :data:`SCHEMES` through its resolver, any other id
    (a hub id, a local path, a ``.gguf`` file) as given."""
    for prefix in SCHEMES:
        if model_id.startswith(prefix):
            return str(resolver(prefix)(model_id[len(prefix):], zoo_dir))
    return model_id
