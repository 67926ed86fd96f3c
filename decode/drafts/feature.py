"""The feature draft's kind (:class:`FeatureDrafter`, the model in :mod:`decode.drafts.feature_model`) and how it is
fed inside the round loop: the target's features from its own verifying forwards.

:class:`FeatureTape` holds, per buffer row and position, the target's feature there (fused to the draft's
width). It observes the target's runner: every counted forward reports its hidden states (``output_hidden_states``;
no second target forward) and every rollback trims it, so it only ever holds features of committed tokens.

:class:`FeatureFed` wraps the draft's runner. Position ``t`` reads the tape's feature of ``t − 1`` where the
target has read ``t − 1``, else the draft's own output there (the latest drafting step's; ``docs/design.md``
§8). A rollback keeps only the cache positions that read the target's features, so a round's accepted
candidates are fed again with the target's features in the next round's first draft forward (as EAGLE does),
one forward as before. A row's first step is the target's alone (:meth:`FeatureFed.ready`): the draft has no
feature of the prompt before the target has read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel

from decode.drafts.base import Drafter, DraftFeed, register_drafter
from decode.drafts.feature_model import (
    FeatureDraftConfig,
    FeatureDraftForCausalLM,
    target_features,
    teacher_forced_rounds,
)


class FeatureTape:
    """The target's fused features ``values [rows, length, H]``; ``known[row]``: positions written (a prefix). A
    :class:`decode.drafts.base.TargetObserver` of the target's runner."""

    def __init__(self, draft: FeatureDraftForCausalLM, rows: int, length: int) -> None:
        self.draft = draft
        self.values = torch.zeros(rows, length, draft.config.hidden_size, dtype=draft.dtype, device=draft.device)
        self.known = [0] * rows

    @property
    def layers(self) -> tuple[int, ...]:
        """The target's ``hidden_states`` the draft reads."""
        return self.draft.feature_layers

    def fused(self, hidden_states: Sequence[Tensor]) -> Tensor:
        """A forward's features ``[B, L, H]`` fused to the draft's width."""
        return self.draft.fuse_features(target_features(hidden_states, self.layers).to(self.values.device))

    def write(self, row: int, start: int, features: Tensor) -> None:
        """Record the target's features ``[n, H]`` of positions ``start .. start + n − 1`` of ``row``."""
        if start > self.known[row]:
            raise RuntimeError(f"row {row}: the target's features would leave a gap ({self.known[row]} to {start})")
        self.values[row, start:start + len(features)] = features
        self.known[row] = start + len(features)

    def seen(self, hidden_states: tuple[Tensor, ...], fed: dict[int, tuple[int, int, int]]) -> None:
        """Record the features of every row a target forward read (``fed[row] = (b, start, n)``)."""
        features = self.fused(hidden_states)
        for row, (b, start, n) in fed.items():
            self.write(row, start, features[b, features.shape[1] - n:])

    def forget(self, row: int, length: int) -> None:
        """Forget the features past ``length`` (the target rolled back to ``length`` tokens)."""
        self.known[row] = min(self.known[row], length)


class FeatureFed:
    """A feature draft's runner (:class:`decode.loops.runner.OneRow` or :class:`~decode.loops.batch_cache.BatchRunner`,
    capturing its hidden states) behind the :class:`~decode.loops.round_loop.Runner` interface, fed from a tape."""

    def __init__(self, inner, tape: FeatureTape) -> None:
        self.inner, self.tape = inner, tape
        #: The feature each buffer position reads (of the position before it) ``[rows, length, H]``.
        self.inputs = torch.zeros_like(tape.values)
        self.featured = [0] * len(tape.known)  # cache positions [0, featured) read the target's features
        self.own: dict[int, tuple[int, Tensor]] = {}  # row → (position, the draft's own output there [H])

    @property
    def rows(self) -> list[int] | tuple[int, ...]:
        return self.inner.rows

    @property
    def calls(self) -> int:
        return self.inner.calls

    @property
    def row_calls(self) -> list[int]:
        return self.inner.row_calls

    def ready(self, row: int) -> bool:
        """Whether the draft can draft for ``row``: the target has read its prompt."""
        return self.tape.known[row] > 0

    def feed(self, tokens: Tensor, ends: dict[int, int], keep: int) -> dict[int, Tensor]:
        for row, end in ends.items():
            self._prepare(row, self.inner.consumed_of(row), end)
        logits = self.inner.feed(tokens, ends, keep, inputs=self.inputs)
        for row, end in ends.items():
            self.own[row] = (end - 1, self.inner.hidden_of(row)[-1])
        return logits

    def _prepare(self, row: int, start: int, end: int) -> None:
        """Fill the features positions ``start .. end − 1`` of ``row`` read."""
        if start >= end:
            return
        known = self.tape.known[row]
        tape_end = min(end, known + 1)  # positions whose previous position the target has read
        if start == 0:
            self.inputs[row, 0] = 0  # the first token has no position before it
        first = max(start, 1)
        if tape_end > first:
            self.inputs[row, first:tape_end] = self.tape.values[row, first - 1:tape_end - 1]
        own_from = max(tape_end, start)
        if own_from < end:
            position, feature = self.own.get(row, (-1, None))
            if end - own_from != 1 or position != own_from - 1:
                raise RuntimeError(f"row {row}: positions {own_from}..{end - 1} need features neither the target nor "
                                   "the latest draft step has computed (a feature draft drafts one token per step, "
                                   "after the target's first step)")
            self.inputs[row, own_from] = feature
        if start <= self.featured[row] and tape_end > start:
            self.featured[row] = tape_end

    def hidden_of(self, row: int) -> Tensor | None:
        return self.inner.hidden_of(row)

    def rollback(self, lengths: dict[int, int], rows: list[int] | None = None) -> None:
        kept = {row: min(length, self.featured[row]) for row, length in lengths.items()}
        for row, length in kept.items():
            self.featured[row] = length
        self.inner.rollback(kept, rows)

    def uncount_last_call(self, row: int) -> None:
        self.inner.uncount_last_call(row)

    def close(self) -> None:
        self.inner.close()


@register_drafter
class FeatureDrafter(Drafter):
    """A draft that reads the target's features (EAGLE-style, ``docs/design.md`` §8): fed from a :class:`FeatureTape`,
    its ``q`` depends on the depth in a round, served by vLLM's eagle3 method (an eagle3 first layer)."""

    name = "feature"
    config_class = FeatureDraftConfig
    depth_dependent = True
    reads_target = True
    assisted_generation = False  # transformers' assistant loop cannot feed it the target's features
    vllm_method = "eagle3"

    def feed(self, draft: FeatureDraftForCausalLM, rows: int, length: int) -> DraftFeed:
        tape = FeatureTape(draft, rows, length)
        return DraftFeed(observer=tape, draft_hidden=True, wrap=lambda inner: FeatureFed(inner, tape))

    def forward_inputs(self, model: PreTrainedModel, ids: Tensor) -> dict[str, Tensor]:
        """The tokens and features of the draft's width (zeros: what it reads does not change what it computes)."""
        return {"input_ids": ids, "features": ids.new_zeros((*ids.shape, model.config.hidden_size), dtype=model.dtype)}

    def round_states(self, target: PreTrainedModel, draft: Any, input_ids: Tensor, attention_mask: Tensor,
                     depths: int) -> list[Tensor]:
        return teacher_forced_rounds(target, draft, input_ids, attention_mask, depths)
