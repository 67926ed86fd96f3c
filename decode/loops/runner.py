"""A model with its own KV cache: incremental forwards, rollback, call counting, hidden capture."""

from __future__ import annotations

from types import TracebackType

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from decode.cache_api import cache_kwargs, drop_last
from decode.compile.model import CompiledModel
from decode.drafts import TargetObserver


def vocab_size(model: PreTrainedModel) -> int:
    """Width of a causal LM's logits: its output layer's ``out_features`` (a reduced-vocabulary head,
    :class:`decode.subset_vocab.SubsetVocabHead`, scores fewer rows than it returns)."""
    head = model.get_output_embeddings()
    return getattr(head, "out_features", head.weight.shape[0])


def context_length(models: list[PreTrainedModel]) -> int | None:
    """The shortest context (``max_position_embeddings``) among ``models``; None when none declares one."""
    declared = [int(m.config.max_position_embeddings) for m in models
                if getattr(m.config, "max_position_embeddings", None) is not None]
    return min(declared) if declared else None


class HiddenCapture:
    """Records the final hidden states (the LM head's input) ``[batch, positions, H]`` of each forward."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.states: Tensor | None = None
        self._hook = model.get_output_embeddings().register_forward_hook(self._record)

    def _record(self, module: torch.nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
        self.states = args[0]

    def remove(self) -> None:
        """Remove the forward hook."""
        self._hook.remove()


class RunnerBase:
    """What both runners share: an optional :class:`HiddenCapture`, removed by :meth:`close` / ``with``."""

    def __init__(self, model: PreTrainedModel, capture_hidden: bool) -> None:
        self._capture = HiddenCapture(model) if capture_hidden else None

    def _captured(self) -> Tensor | None:
        return self._capture.states if self._capture is not None else None

    def close(self) -> None:
        """Remove the hidden-state hook."""
        if self._capture is not None:
            self._capture.remove()
            self._capture = None

    def __enter__(self):
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class ModelRunner(RunnerBase):
    """Feeds a model the unseen part of a token buffer and keeps its ``DynamicCache`` in step.

    ``consumed`` is the number of buffer tokens in the cache; :meth:`rollback` crops it. ``calls``
    counts the forwards charged to the cost model (see :meth:`uncount_last_call`). With
    ``capture_hidden`` the final hidden states (the LM head's input) of the kept positions are
    recorded in :attr:`hidden` by a forward hook.

    The cache is built from the model's config, so it has the model's layer types: full attention,
    sliding window (Mistral) or both (Gemma-2/3). Past recording is on (the cache API's
    ``activate_past_recording``): sliding-window layers keep the states that leave their window
    until the next :meth:`rollback`, which crops them and trims them back to the window. A rollback
    therefore cannot go below what the previous one left cached on such layers (:attr:`floor`).

    With an ``observer`` (the target of a draft kind that reads it, :class:`decode.drafts.DraftFeed`) every forward
    also reports its hidden states of the positions it read, and every rollback the length kept.
    """

    def __init__(self, model: PreTrainedModel, vocab: int, capture_hidden: bool = False,
                 observer: TargetObserver | None = None, compiled: CompiledModel | None = None) -> None:
        super().__init__(model, capture_hidden and compiled is None)
        self.model = model
        self.vocab = vocab
        self.observer = observer
        self.compiled = compiled
        self._keep = 0
        if compiled is None:
            self.cache = DynamicCache(config=model.config)
            self.cache.activate_past_recording()
            self._sliding = any(self.cache.is_sliding)
        else:
            self.cache, self._sliding = None, False  # a static cache from the pool at the first feed
        self.consumed = 0
        #: The shortest length :meth:`rollback` can restore (sliding-window layers dropped older states).
        self.floor = 0
        self.calls = 0
        self._last_charged = False

    @property
    def hidden(self) -> Tensor | None:
        """Final hidden states ``[positions, H]`` of the latest forward (with ``capture_hidden``)."""
        if self.compiled is not None:
            return None if self.compiled.hidden is None else self.compiled.hidden[0, -self._keep:]
        states = self._captured()
        return None if states is None else states[0]

    def feed(self, tokens: Tensor, end: int, keep: int, inputs: Tensor | None = None) -> Tensor:
        """Run ``tokens[:, consumed:end]``; return float logits ``[keep, vocab]`` of the last positions.

        ``inputs [1, length, H]``: the feature each buffer position reads, for a feature draft.
        """
        extra = {} if inputs is None else {"features": inputs[:, self.consumed:end]}
        if self.observer is not None:
            extra["output_hidden_states"] = True
        if self.compiled is None:
            out = self.model(input_ids=tokens[:, self.consumed:end], **cache_kwargs(self.model, self.cache),
                             logits_to_keep=keep, **extra)
        else:
            if self.cache is None:
                self.cache = self.compiled.acquire(tokens.shape[1])
            out = self.compiled(tokens[:, self.consumed:end], self.cache, keep, **extra)
        self._keep = keep
        if self.observer is not None:
            self.observer.seen(out.hidden_states, {0: (0, self.consumed, end - self.consumed)})
        self.consumed = end
        self.calls += 1
        self._last_charged = True
        return out.logits[0, -keep:, : self.vocab].float()

    def close(self) -> None:
        """Remove the hidden-state hook; give a static cache back to its pool."""
        super().close()
        if self.compiled is not None and self.cache is not None:
            self.compiled.release(self.cache)
            self.cache = None

    def uncount_last_call(self) -> None:
        """Stop charging the latest :meth:`feed`: it served as hindsight (:attr:`decode.draft_round.Decision.DROP`)."""
        if not self._last_charged:
            raise RuntimeError("no charged call to uncount: none yet, or the latest is already uncounted")
        self.calls -= 1
        self._last_charged = False

    def rollback(self, length: int) -> None:
        """Drop cached tokens beyond ``length``; sliding-window layers also forget what left their window.

        What stays cached becomes the :attr:`floor` of a sliding-window cache, also where nothing is
        dropped (``length >= consumed``: the call only trims). Raises ``RuntimeError`` below the
        floor, or where tokens must be dropped from a cache that cannot crop them exactly (e.g.
        recurrent linear-attention states).
        """
        name = type(self.model).__name__
        if self.observer is not None:
            self.observer.forget(0, length)
        if length < self.floor:
            raise RuntimeError(
                f"{name}: cannot roll back to {length} tokens: its sliding-window cache layers dropped the states "
                f"before {self.floor} at the previous rollback. A rollback must not go below the previous one."
            )
        if self.consumed > length:
            if not self.cache.is_croppable:
                layers = sorted({type(layer).__name__ for layer in self.cache.layers if not layer.is_croppable})
                raise RuntimeError(
                    f"{name}: its cache layers ({', '.join(layers)}) cannot be rolled back, which speculative "
                    "decoding needs on every rejection. Use a model with attention-only layers (full or sliding "
                    "window) as target, draft, companion or ensemble member."
                )
            drop_last(self.cache, self.consumed - length)
            self.consumed = length
        elif self._sliding:
            drop_last(self.cache, 0)  # trims the sliding-window layers back to their window
        if self._sliding:
            self.floor = self.consumed


class OneRow:
    """A :class:`ModelRunner` behind the rows interface of the round loop (:class:`decode.loops.round_loop.Runner`):
    a token buffer of one row, index 0. Its cache is the runner's own (sliding-window layers included)."""

    rows = (0,)

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    @property
    def calls(self) -> int:
        return self.runner.calls

    @property
    def row_calls(self) -> list[int]:
        return [self.runner.calls]

    def feed(self, tokens: Tensor, ends: dict[int, int], keep: int, inputs: Tensor | None = None) -> dict[int, Tensor]:
        return {0: self.runner.feed(tokens, ends[0], keep, inputs)}

    def consumed_of(self, row: int) -> int:
        """Tokens of ``row`` in the cache."""
        return self.runner.consumed

    def ready(self, row: int) -> bool:
        """A model fed tokens alone drafts from the first step."""
        return True

    def hidden_of(self, row: int) -> Tensor | None:
        return self.runner.hidden

    def rollback(self, lengths: dict[int, int], rows: list[int] | None = None) -> None:
        if 0 in lengths:
            self.runner.rollback(lengths[0])

    def uncount_last_call(self, row: int) -> None:
        self.runner.uncount_last_call()

    def close(self) -> None:
        self.runner.close()
