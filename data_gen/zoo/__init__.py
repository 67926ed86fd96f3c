"""The built-in ``tiny-code`` model trio (target / draft / companion), trained offline on stdlib source.

``ensure_zoo()`` returns the cached zoo, building it on first use (about ten minutes on two CPU
cores); ``python -m data_gen.zoo`` does the same from the command line and prints a summary.
"""

from .build import ENV_VAR, Zoo, default_cache_dir, ensure_zoo
from .recipe import ROLES, ZOO_VERSION, ModelShape, ZooRecipe
from .summary import zoo_summary_table

__all__ = [
    "ENV_VAR",
    "ROLES",
    "ZOO_VERSION",
    "ModelShape",
    "Zoo",
    "ZooRecipe",
    "default_cache_dir",
    "ensure_zoo",
    "zoo_summary_table",
]
