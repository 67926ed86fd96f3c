"""How a feature draft is fed inside the round loop: the target's features from its own verifying forwards.

:class:`FeatureTape` holds, per buffer row and position, the target's feature there (fused to the draft's
width). The target's runner writes it from every counted forward (``output_hidden_states``; no second target
forward) and trims it when the target rolls back, so it only ever holds features of committed tokens.

:class:`FeatureFed` wraps the draft's runner. Position ``t`` reads the tape's feature of ``t − 1`` where the
target has read ``t − 1``, else the draft's own output there (the latest drafting step's; ``docs/design.md``
§8). A rollback keeps only the cache positions that read the target's features, so a round's accepted
candidates are fed again with the target's features in the next round's first draft forward (as EAGLE does),
one forward as before. A row's first step is the target's alone (:meth:`FeatureTape.ready`): the draft has no
feature of the prompt before the target has read it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from decode.feature_draft import FeatureDraftForCausalLM, is_feature_draft, target_features


class FeatureTape:
    """The target's fused features ``values [rows, length, H]``; ``known[row]``: positions written (a prefix)."""

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

    def truncate(self, row: int, length: int) -> None:
        """Forget the features past ``length`` (the target rolled back to ``length`` tokens)."""
        self.known[row] = min(self.known[row], length)

    def ready(self, row: int) -> bool:
        """Whether the draft can draft for ``row``: the target has read its prompt."""
        return self.known[row] > 0


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

    def uncount_last_call(self) -> None:
        self.inner.uncount_last_call()

    def close(self) -> None:
        self.inner.close()


def draft_runner(inner, tape: FeatureTape | None):
    """The draft's runner as the round loop takes it: ``inner`` itself, or fed from ``tape`` (a feature draft)."""
    return inner if tape is None else FeatureFed(inner, tape)


def feature_tape(draft, rows: int, length: int) -> FeatureTape | None:
    """A tape for a feature draft decoding ``rows`` buffer rows of ``length`` positions; None for any other draft."""
    return FeatureTape(draft, rows, length) if is_feature_draft(draft) else None
