"""Who owns compiled forwards: :class:`CompiledModels`, opened by a decoder (``compile=True``) or passed to it.

One model has at most one open :class:`~decode.compile.model.CompiledModel` at a time (its frozen graphs write to the
caches they were compiled with, so two pools of one model would write to each other's caches). It is found through
the hook it installed on the model (:func:`attached`), so owners opening the same model share it; the last owner to
close it removes the hook. The rules: docs/design.md, "Compiled forwards: the rules".
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from transformers import PreTrainedModel, StaticCache
from transformers.cache_utils import StaticLayer

from decode.compile.config import DEFAULT, CompileConfig
from decode.compile.model import CompiledModel, CompileLog
from decode.compile.pool import HiddenSlot


def attached(model: PreTrainedModel) -> CompiledModel | None:
    """The open :class:`CompiledModel` of ``model`` (the owner of a :class:`HiddenSlot` hook on its output layer),
    or None."""
    for hook in model.get_output_embeddings()._forward_hooks.values():
        if isinstance(hook, HiddenSlot) and hook.owner is not None:
            return hook.owner
    return None


def compile_log(model: PreTrainedModel) -> CompileLog | None:
    """What compiling ``model`` has cost its open compiled forwards so far (None: it has none)."""
    compiled = attached(model)
    return None if compiled is None else compiled.log


def compile_refusal(model: PreTrainedModel, config: CompileConfig = DEFAULT) -> str | None:
    """Why ``model`` cannot run compiled here (one line), or None."""
    name = type(model).__name__
    if model.device.type == "cpu" and shutil.which("c++") is None and shutil.which("g++") is None:
        return f"{name}: no C++ compiler (c++ or g++) on PATH for torch.compile; decoding runs eager"
    probe = StaticCache(config=model.config, max_cache_len=config.bucket)
    if any(type(layer) is not StaticLayer for layer in probe.layers):
        layers = sorted({type(layer).__name__ for layer in probe.layers})
        return f"{name}: compiled decoding takes full-attention layers only, got {', '.join(layers)}; decoding runs eager"
    return None


class CompiledModels:
    """The compiled forwards this owner opened, closed together by :meth:`close` (or leaving a ``with`` block).

    ``refusal``: the one line :meth:`open` gave where a model cannot be compiled here (its decodes run eager).
    """

    def __init__(self, config: CompileConfig = DEFAULT) -> None:
        self.config = config
        self.refusal: str | None = None
        self._held: list[CompiledModel] = []

    def open(self, models: Sequence[PreTrainedModel]) -> list[CompiledModel] | None:
        """The :class:`CompiledModel` of each model (shared with any other owner that has it open), or None (and one
        warning line, kept in :attr:`refusal`) if any of them cannot be compiled here."""
        for model in models:
            refusal = compile_refusal(model, self.config) if attached(model) is None else None
            if refusal is not None:
                if refusal != self.refusal:
                    warnings.warn(refusal, stacklevel=3)
                self.refusal = refusal
                return None
        opened = []
        for model in models:
            compiled = attached(model)
            if compiled is None:
                compiled = CompiledModel(model, self.config)
            elif compiled.config != self.config:
                raise ValueError(f"{type(model).__name__} is open compiled with other settings ({compiled.config}); "
                                 "close its owner first, or open it with the same CompileConfig")
            if not any(compiled is held for held in self._held):
                compiled.users += 1
                self._held.append(compiled)
            opened.append(compiled)
        return opened

    def log(self, model: PreTrainedModel) -> CompileLog | None:
        """What compiling ``model`` has cost so far, if this owner holds it."""
        return next((held.log for held in self._held if held.model is model), None)

    def outcome(self, compiled: Sequence[CompiledModel | None]) -> tuple[CompileConfig | None, str | None]:
        """What a decode on ``compiled`` (the models' compiled forwards, None: eager) records
        (:attr:`decode.stats.DecodeStats.compile` and ``eager_reason``): the settings when it ran compiled, else None
        and why it ran eager, wholly or in part (the refusal, or each failed compilation's line)."""
        if self.refusal is not None and all(model is None for model in compiled):
            return None, self.refusal
        failed = [model.eager_reason for model in compiled if model is not None and model.eager_reason is not None]
        return (None, "; ".join(failed)) if failed else (self.config, None)

    def close(self) -> None:
        """Leave every compiled model held; those no other owner holds are closed (their hooks removed)."""
        for compiled in self._held:
            compiled.users -= 1
            if compiled.users == 0:
                compiled.close()
        self._held.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class DecoderForwards:
    """One decoder's compiled forwards: ``compile=True`` opens an owner it closes itself, a :class:`CompiledModels`
    passed in is its caller's to close, ``False`` decodes eager. The forwards open at first use."""

    def __init__(self, compile: bool | CompiledModels) -> None:
        self.enabled = compile is not False
        self._owns = compile is True
        self.owner = compile if isinstance(compile, CompiledModels) else CompiledModels()
        self._opened: list[CompiledModel | None] | None = None

    def open(self, models: Sequence[PreTrainedModel]) -> list[CompiledModel | None]:
        """Each model's compiled forwards (None each: eager), opened once until :meth:`close`."""
        if self._opened is None:
            compiled = self.owner.open(models) if self.enabled else None
            self._opened = compiled or [None] * len(models)
        return self._opened

    def outcome(self, compiled: Sequence[CompiledModel | None]) -> tuple[CompileConfig | None, str | None]:
        """What a decode on ``compiled`` records (:meth:`CompiledModels.outcome`)."""
        return self.owner.outcome(compiled)

    def close(self) -> None:
        """Close the owner this decoder opened (its hooks leave the models); the next use opens the forwards again."""
        if self._owns:
            self.owner.close()
        self._opened = None
