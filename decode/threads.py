"""Torch's CPU thread count, set in one place: :class:`torch_threads`."""

from __future__ import annotations

import torch


class torch_threads:
    """Torch's intra-op thread count set to ``n`` (None: left as it is): for the rest of the process when called, and
    back to the count before when used as a context manager and its block ends (as ``torch.set_grad_enabled``)."""

    def __init__(self, n: int | None) -> None:
        self.n, self.previous = n, torch.get_num_threads()
        if n is not None:
            torch.set_num_threads(n)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        if self.n is not None:
            torch.set_num_threads(self.previous)
