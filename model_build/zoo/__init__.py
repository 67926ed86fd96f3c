"""The built-in ``tiny-code`` model trio (target / draft / companion): shipped with the package, rebuildable.

``ensure_zoo()`` installs the shipped reference build into the cache directory on first use (a copy,
sha256-checked; the same bytes on every machine) and verifies it at every load; ``rebuild_zoo()``
trains the recipe instead. ``python -m model_build.zoo`` does either from the command line and prints
the trio's models and realism figures. Where the zoo lives (``$ACCEPT_HEADS_ZOO_DIR``, the zoo
version) is :mod:`model_build.zoo.paths`.
"""

from model_build.model_store import ROLES

from .recipe import ModelShape, ZooRecipe
from .store import SHIPPED_DIR, Zoo, ZooError, ZooRealismError, ensure_zoo, rebuild_zoo
from .summary import realism_table, zoo_summary_table

__all__ = [
    "ROLES",
    "SHIPPED_DIR",
    "ModelShape",
    "Zoo",
    "ZooError",
    "ZooRealismError",
    "ZooRecipe",
    "ensure_zoo",
    "realism_table",
    "rebuild_zoo",
    "zoo_summary_table",
]
