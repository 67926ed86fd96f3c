"""Per-prompt seeds shared by collection and evaluation: a prompt's draws depend on its id only."""

from __future__ import annotations

import hashlib


def prompt_seed(seed: int, prompt_id: str) -> int:
    """Per-prompt seed: a response does not depend on batch composition or on the rank."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{prompt_id}".encode()).digest()[:8], "little") & (2**63 - 1)
