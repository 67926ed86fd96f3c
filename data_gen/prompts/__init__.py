"""Prompt sets: where prompts come from (builtin corpus, hub datasets, local files), and a run's split encoded.

    from data_gen.prompts import load_prompts
    prompts = load_prompts("builtin", "test", style="function", size=100)

How a prompt becomes a model's text and token ids is :mod:`runtime.templates` and :mod:`runtime.encoding`.
"""

from data_gen.prompts.choices import check_prompt_choices
from data_gen.prompts.encoded import split_prompts
from data_gen.prompts.load import SOURCES, STYLES, available_splits, load_prompts, parse_source, source_kind, validate
from data_gen.prompts.types import PromptSourceError

__all__ = [
    "SOURCES",
    "STYLES",
    "PromptSourceError",
    "available_splits",
    "check_prompt_choices",
    "load_prompts",
    "parse_source",
    "source_kind",
    "split_prompts",
    "validate",
]
