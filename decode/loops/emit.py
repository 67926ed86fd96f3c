"""What a caller sees of a generation while it runs: each row's tokens as they become final.

A round commits several tokens at once, and under the ensemble rules its last one stays tentative
until the draft has checked it (the next round's first step). :class:`Emitter` hands the caller a
row's new tokens only once they are final, and lets the caller end the row there (a stopping
criterion), as HF's assisted generation checks its criteria once per round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

#: ``on_tokens(row, sequence, start)``: ``sequence`` is row ``row``'s prompt and final tokens ``[n]``,
#: its new tokens start at ``start``; returning True ends the row there.
OnTokens = Callable[[int, Tensor, int], bool]


class Emitter:
    """Calls ``on_tokens`` with each row's tokens past what it was last shown (nothing without a callback)."""

    def __init__(self, on_tokens: OnTokens | None, prompt_lengths: Sequence[int]) -> None:
        self.on_tokens = on_tokens
        self.shown = list(prompt_lengths)

    def __call__(self, row: int, tokens: Tensor, length: int) -> bool:
        """Show row ``row``'s final tokens ``tokens[:length]`` past the last call; True if the caller ends the row."""
        start = self.shown[row]
        if self.on_tokens is None or length <= start:
            return False
        self.shown[row] = length
        return bool(self.on_tokens(row, tokens[:length], start))
