"""The plain draft: any causal LM fed tokens alone, in its own KV cache (``docs/design.md`` §8)."""

from __future__ import annotations

from transformers import PretrainedConfig

from decode.drafts.base import Drafter, register_drafter


@register_drafter
class PlainDrafter(Drafter):
    """A causal LM of no other registered kind: its ``q`` at a position is the same at every depth of a round."""

    name = "plain"
    config_class = PretrainedConfig
