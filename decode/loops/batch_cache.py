"""A model with one KV cache for a batch of rows of different lengths (batched decoding).

Rows share the cache's columns; a boolean ``mask [rows, columns]`` says which columns hold a token
of a row. Every forward appends ``w`` columns to all rows: a row fed ``n < w`` tokens is
left-padded with ``w − n`` masked columns, so the last ``keep`` columns of every row hold its
last tokens (one ``logits_to_keep`` for the batch). Tokens carry explicit ``position_ids`` (the
row's own count of tokens before them) and the 2-D ``mask`` is passed as the attention mask, so a
masked column is invisible whatever its place. Rolling a row back masks its dropped columns.

Two layouts deal with the holes this leaves:

* ``"holes"``: masked columns stay; trailing columns masked in every row are cropped, and the rows
  are re-packed as below only once the cache is over twice the longest row (bounded memory,
  amortised copies).
* ``"compact"``: after each :meth:`BatchRunner.rollback` every row's tokens are gathered to the
  right end of the cache (left padding), so the cache is ``max(valid length)`` columns wide.

``"holes"`` is the default: it was the faster on the micro models (figures: ``docs/batched.md``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from decode.cache_api import cache_kwargs, drop_last
from decode.drafts import TargetObserver
from decode.loops.runner import RunnerBase

Layout = Literal["holes", "compact"]
LAYOUTS: tuple[str, ...] = ("holes", "compact")


class BatchRunner(RunnerBase):
    """Feeds each row of a shared token buffer the unseen part of its tokens; one cache for all rows.

    ``rows`` lists the buffer rows held in the cache, in cache order; :meth:`rollback` can drop
    some (finished rows). ``consumed[b]`` is the number of tokens of cache row ``b`` in the cache.
    ``calls`` counts batched forwards and ``shapes`` records each one's ``(rows, tokens per row)``;
    ``row_calls[r]`` the forwards that fed buffer row ``r`` at least one token (what a batch-1
    decode of that row would have made). With ``capture_hidden``
    the final hidden states of the kept positions (the LM head's input) are recorded in
    :attr:`hidden` ``[rows, keep, H]``. With an ``observer`` (the target of a draft kind that reads it,
    :class:`decode.drafts.DraftFeed`) every forward reports its hidden states of the positions it read, and every
    rollback the lengths kept.
    """

    def __init__(
        self, model: PreTrainedModel, vocab: int, rows: int, layout: Layout = "holes", capture_hidden: bool = False,
        observer: TargetObserver | None = None,
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"unknown cache layout {layout!r}; valid: {', '.join(LAYOUTS)}")
        self.model, self.vocab, self.layout, self.observer = model, vocab, layout, observer
        self.cache = DynamicCache(config=model.config)
        if any(type(layer) is not DynamicLayer for layer in self.cache.layers):
            layers = sorted({type(layer).__name__ for layer in self.cache.layers})
            raise ValueError(
                f"{type(model).__name__}: batched decoding supports full-attention cache layers only, got "
                f"{', '.join(layers)} (DynamicLayer: sliding-window, indexed and recurrent layers cannot mask "
                "holes by column)"
            )
        super().__init__(model, capture_hidden)  # after the checks: a refused model keeps no hook
        self.device = model.device
        self.rows: list[int] = list(range(rows))
        self.consumed: list[int] = [0] * rows
        self.mask = torch.zeros(rows, 0, dtype=torch.bool, device=self.device)
        self.calls = 0
        self.shapes: list[tuple[int, int]] = []
        self.row_calls = [0] * rows
        self._charged: set[int] = set()  # the buffer rows the latest forward fed (and charged)

    @property
    def hidden(self) -> Tensor | None:
        """Final hidden states ``[rows, keep, H]`` of the latest forward (with ``capture_hidden``)."""
        return self._captured()

    def hidden_of(self, row: int) -> Tensor | None:
        """Final hidden states ``[keep, H]`` of buffer row ``row`` in the latest forward (with ``capture_hidden``)."""
        states = self._captured()
        return None if states is None else states[self.rows.index(row)]

    def uncount_last_call(self, row: int) -> None:
        """Stop charging buffer row ``row`` for the latest forward, which served it as hindsight
        (:attr:`decode.draft_round.Decision.DROP`); the batch's own count keeps it (the batch ran it)."""
        if row not in self._charged:
            raise RuntimeError(f"row {row}: no charged call to uncount (the latest forward did not feed it, or its "
                               "charge is already uncounted)")
        self.row_calls[row] -= 1
        self._charged.discard(row)

    @property
    def width(self) -> int:
        """Number of cache columns."""
        return self.mask.shape[1]

    def consumed_of(self, row: int) -> int:
        """Tokens of buffer row ``row`` in the cache."""
        return self.consumed[self.rows.index(row)]

    def ready(self, row: int) -> bool:
        """A model fed tokens alone drafts from the first step."""
        return True

    def feed(self, tokens: Tensor, ends: dict[int, int], keep: int, inputs: Tensor | None = None
             ) -> dict[int, Tensor]:
        """Run ``tokens[r, consumed_r : ends[r]]`` for the rows in ``ends`` (others get masked columns only).

        Returns, per fed row, float logits ``[keep, vocab]`` of its last ``keep`` tokens (a row fed
        fewer than ``keep`` tokens gets padding columns' logits first: callers keep ``keep`` within
        what every fed row was fed, or read only its last ones). ``inputs [rows, length, H]``: the feature
        each buffer position reads, for a feature draft.
        """
        index = {row: b for b, row in enumerate(self.rows)}
        counts = [0] * len(self.rows)
        for row, end in ends.items():
            counts[index[row]] = end - self.consumed[index[row]]
        w = max(counts)
        device = self.device
        consumed = torch.tensor(self.consumed, device=device)
        pad = w - torch.tensor(counts, device=device)
        j = torch.arange(w, device=device)
        positions = (consumed[:, None] + j[None, :] - pad[:, None]).clamp_min(0)  # padding columns: any position
        new_mask = j[None, :] >= pad[:, None]
        row_ids = torch.tensor(self.rows, device=tokens.device)
        input_ids = tokens[row_ids[:, None], positions.to(tokens.device)].to(device)
        extra = {} if inputs is None else {"features": inputs[row_ids[:, None].to(inputs.device), positions]}
        if self.observer is not None:
            extra["output_hidden_states"] = True
        self.mask = torch.cat([self.mask, new_mask], dim=1)
        out = self.model(
            input_ids=input_ids,
            attention_mask=self.mask.long(),
            position_ids=positions,
            **cache_kwargs(self.model, self.cache),
            logits_to_keep=keep,
            **extra,
        )
        if self.observer is not None:
            self.observer.seen(out.hidden_states, {row: (index[row], self.consumed[index[row]], counts[index[row]])
                                                   for row in ends if counts[index[row]]})
        self.calls += 1
        self.shapes.append((len(self.rows), w))
        logits = out.logits[..., : self.vocab].float()
        result: dict[int, Tensor] = {}
        self._charged = set()
        for row in ends:
            b = index[row]
            self.consumed[b] += counts[b]
            if counts[b]:
                self.row_calls[row] += 1
                self._charged.add(row)
            result[row] = logits[b]
        return result

    def rollback(self, lengths: dict[int, int], rows: list[int] | None = None) -> None:
        """Keep the first ``lengths[r]`` tokens of each listed row (rows already shorter keep theirs).

        ``rows``: then keep only these buffer rows (a subset of :attr:`rows`, in cache order) in the
        cache, dropping the others (finished rows). The layout is restored once, at the end.
        """
        keep = list(self.consumed)
        for b, row in enumerate(self.rows):
            if row in lengths:
                keep[b] = min(keep[b], lengths[row])
                if self.observer is not None:
                    self.observer.forget(row, keep[b])
        if keep != self.consumed:
            limit = torch.tensor(keep, device=self.device)[:, None]
            self.mask &= self.mask.cumsum(1) <= limit
            self.consumed = keep
        if rows is not None and rows != self.rows:
            index = {row: b for b, row in enumerate(self.rows)}
            selected = [index[row] for row in rows]
            self.cache.batch_select_indices(torch.tensor(selected, dtype=torch.long, device=self.device))
            self.mask = self.mask[selected]
            self.consumed = [self.consumed[b] for b in selected]
            self.rows = list(rows)
        if self.layout == "compact" or self.width > 2 * max(self.consumed, default=0):
            self._compact()
        else:
            self._crop_tail()

    def _crop_tail(self) -> None:
        """Drop trailing columns that no row uses."""
        used = self.mask.any(0).nonzero()
        width = int(used[-1, 0]) + 1 if used.numel() else 0
        if width < self.width:
            drop_last(self.cache, self.width - width)
            self.mask = self.mask[:, :width]

    def _compact(self) -> None:
        """Gather every row's tokens to the right end: the cache becomes ``max(consumed)`` columns wide."""
        width = max(self.consumed, default=0)
        counts = torch.tensor(self.consumed, device=self.device)
        compact = torch.arange(width, device=self.device)[None, :] >= (width - counts)[:, None]
        if width == self.width and torch.equal(self.mask, compact):
            return
        # A stable sort on the mask puts each row's masked columns first and its tokens, in order, last.
        order = torch.sort(self.mask.to(torch.uint8), dim=1, stable=True).indices[:, self.width - width :]
        for layer in self.cache.layers:
            if layer.get_seq_length() == 0:
                continue
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, index)
            layer.values = layer.values.gather(2, index)
        self.mask = compact

