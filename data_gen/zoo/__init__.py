"""The built-in ``tiny-code`` model trio (target / draft / companion), trained offline on stdlib source.

``ensure_zoo()`` returns the cached zoo, building it on first use (about ten minutes on two CPU
cores); ``python -m data_gen.zoo`` does the same from the command line and prints a summary.
Where the zoo is cached (``$ACCEPT_HEADS_ZOO_DIR``, the zoo version) is :mod:`decode.zoo_dir`.
"""

from .build import Zoo, ensure_zoo
from .recipe import ROLES, ModelShape, ZooRecipe
from .summary import zoo_summary_table

__all__ = [
    "ROLES",
    "ModelShape",
    "Zoo",
    "ZooRecipe",
    "ensure_zoo",
    "zoo_summary_table",
]
