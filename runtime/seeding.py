"""Per-prompt seeds shared by collection and evaluation: a prompt's draws depend on its id only."""

from __future__ import annotations

import hashlib


def prompt_seed(seed: int, prompt_id: str, stream: str = "") -> int:
    """Per-prompt seed: a response does not depend on batch composition or on the rank.

    ``stream`` names an independent stream of the same prompt (the collection draws its draft
    candidates from ``"draft"``, so they do not depend on how the response was produced).
    """
    key = f"{seed}/{prompt_id}" + (f"/{stream}" if stream else "")
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") & (2**63 - 1)
