"""Compiled forwards (``compile=True``): static KV caches and ``torch.compile`` for the short feeds of a round.

:class:`CompileConfig` (settings), :class:`CompiledModel` (one model's forwards, :mod:`.model`), :class:`CachePool`
(its static caches, :mod:`.pool`), :class:`CompiledModels` (who owns and closes them, :mod:`.owner`),
:class:`~decode.compile.store.GraphStore` (where the graphs are kept for later processes, :mod:`.store`). The rules each
follows and why: docs/design.md, "Compiled forwards: the rules".
"""

from decode.compile.config import DEFAULT, GEMMS, SHORT, CompileConfig
from decode.compile.model import COMPILE_ERRORS, CompiledModel, CompileLog
from decode.compile.owner import CompiledModels, attached, compile_log, compile_refusal
from decode.compile.pool import CachePool

__all__ = ["COMPILE_ERRORS", "DEFAULT", "GEMMS", "SHORT", "CachePool", "CompileConfig", "CompileLog", "CompiledModel",
           "CompiledModels", "attached", "compile_log", "compile_refusal"]
