"""Model ids with a scheme (``zoo:<role>``, ``real:<pair>/<role>``): the table of their resolvers.

A resolver installs models on first use, which is the model builders' work (:mod:`model_build`, a layer above this
one), so :mod:`runtime.models` cannot import it. This module is the declared plugin table instead: :data:`SCHEMES`
maps each id prefix to the ``module:function`` that resolves it, imported by name on first use. It is the one place
below :mod:`model_build` that imports by name, and tests/test_imports.py holds it to that: every entry names a
resolver of :mod:`model_build` that exists, and no other module of the lower layers imports by name. Every entry
point that loads models (collection, regeneration, training, evaluation, benchmarks) resolves through this table,
so none of them has to remember to register a scheme.

A resolver takes the id without its prefix and the configured ``paths.zoo_dir`` (the zoo's install directory;
other schemes ignore it) and returns the directory to load, installed and verified.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from pathlib import Path

from ahconf.schema import REAL_PREFIX, ZOO_PREFIX

Resolver = Callable[[str, "str | None"], Path]  # (id without its prefix, paths.zoo_dir) -> directory to load

#: Id prefix -> ``module:function`` of its resolver.
SCHEMES: dict[str, str] = {
    ZOO_PREFIX: "model_build.zoo.store:resolve_zoo_id",
    REAL_PREFIX: "model_build.real.pair_store:resolve_pair_id",
}


@cache
def resolver(prefix: str) -> Resolver:
    """The resolver :data:`SCHEMES` names for ``prefix``, imported on first use."""
    module, _, name = SCHEMES[prefix].partition(":")
    return getattr(importlib.import_module(module), name)


def resolve_id(model_id: str, zoo_dir: str | None = None) -> str:
    """``model_id`` as a path to load: an id with a scheme of :data:`SCHEMES` through its resolver, any other id
    (a hub id, a local path, a ``.gguf`` file) as given."""
    for prefix in SCHEMES:
        if model_id.startswith(prefix):
            return str(resolver(prefix)(model_id[len(prefix):], zoo_dir))
    return model_id
