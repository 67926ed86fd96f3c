"""A draft kind behind one interface: what the decoders, the collection, training and the exports ask of a draft.

A :class:`Drafter` is registered by its draft's config class (:func:`register_drafter`), as speculators registers a
draft algorithm by its config and vLLM picks a proposer by ``speculative_config.method``; :func:`drafter_of` finds a
model's. A causal LM of no registered kind is a plain draft (:mod:`decode.drafts.plain`). ``docs/design.md`` §8
describes the kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from torch import Tensor
from transformers import PretrainedConfig, PreTrainedModel


class TargetObserver(Protocol):
    """What a draft kind records of the target's forwards (the target's runner reports every counted forward)."""

    def seen(self, hidden_states: tuple[Tensor, ...], fed: dict[int, tuple[int, int, int]]) -> None:
        """One forward's ``hidden_states`` (per layer ``[B, w, H]``) fed ``fed[row] = (b, start, n)``: cache row ``b``
        read the buffer positions ``start .. start + n − 1``, its last ``n`` columns."""
        ...

    def forget(self, row: int, length: int) -> None:
        """The target rolled ``row`` back to ``length`` tokens."""
        ...


def unchanged(runner: Any) -> Any:
    """A draft's runner as it is (a kind that reads nothing of the target)."""
    return runner


@dataclass(frozen=True)
class DraftFeed:
    """How one decode feeds a draft: what the target's runner reports to, and the draft's runner around the plain one.

    ``wrap`` takes and returns a :class:`decode.loops.round_loop.Runner`; the round loop asks the wrapped runner
    whether a row can draft yet (``ready``).
    """

    observer: TargetObserver | None = None  # told of every target forward (its runner then returns hidden states)
    draft_hidden: bool = False  # the draft's runner captures its final hidden states
    wrap: Callable[[Any], Any] = unchanged


class Drafter:
    """One draft kind (``docs/design.md`` §8). Subclass it, set the class attributes and register it.

    ``depth_dependent``: a candidate's ``q`` depends on its depth in a round (collection labels, and heads read, every
    depth of a round); ``reads_target``: teacher-forcing it needs the target's forward; ``assisted_generation``:
    transformers' assistant loop can run it; ``vllm_method``: the speculative method vLLM serves it with.
    """

    name: ClassVar[str]
    config_class: ClassVar[type[PretrainedConfig]]
    depth_dependent: ClassVar[bool] = False
    reads_target: ClassVar[bool] = False
    assisted_generation: ClassVar[bool] = True
    vllm_method: ClassVar[str] = "draft_model"

    def feed(self, draft: PreTrainedModel, rows: int, length: int) -> DraftFeed:
        """How a decode of ``rows`` buffer rows of ``length`` positions feeds ``draft``."""
        return DraftFeed()

    def forward_inputs(self, model: PreTrainedModel, ids: Tensor) -> dict[str, Tensor]:
        """What a timed forward of ``model`` feeds for the tokens ``ids [B, n]``."""
        return {"input_ids": ids}

    def labelled_depths(self, depths: int) -> int:
        """How many depths of a round collection labels, of the ``depths`` configured."""
        return depths if self.depth_dependent else 1

    def round_states(self, target: PreTrainedModel, draft: PreTrainedModel, input_ids: Tensor,
                     attention_mask: Tensor, depths: int) -> list[Tensor]:
        """The draft's outputs (its output layer's input) ``[B, L, H]`` at depths ``1 .. depths`` of a round along
        ``input_ids [B, L]``, teacher-forced: what a depth-dependent kind is labelled and its heads trained on."""
        raise NotImplementedError(f"a {self.name} draft's q does not depend on its depth in a round")


DRAFTERS: dict[type[PretrainedConfig], Drafter] = {}


def register_drafter(cls: type[Drafter]) -> type[Drafter]:
    """Class decorator: register a draft kind under its config class (a later registration replaces it)."""
    DRAFTERS[cls.config_class] = cls()
    return cls


def drafter_of(model: PreTrainedModel | PretrainedConfig) -> Drafter:
    """The kind of ``model`` (or of a model with this config): the registered kind of its config class or of a base
    of it, or of its ``model_type`` (a copy of the class loaded by another import); else the plain kind."""
    config = model if isinstance(model, PretrainedConfig) else model.config
    for cls in type(config).__mro__:
        if cls in DRAFTERS and cls is not PretrainedConfig:
            return DRAFTERS[cls]
    model_type = getattr(config, "model_type", None)
    kinds = [d for cls, d in DRAFTERS.items() if cls.model_type and cls.model_type == model_type]  # "" for the base
    return kinds[-1] if kinds else DRAFTERS[PretrainedConfig]
