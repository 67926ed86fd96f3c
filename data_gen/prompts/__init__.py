"""Prompt sets: where prompts come from (builtin corpus, hub datasets, local files) and how they are templated.

    from data_gen.prompts import load_prompts, render
    prompts = load_prompts("builtin", "test", style="function", size=100)
    text = render(prompts[0], tokenizer, "raw")
"""

from data_gen.prompts.choices import check_prompt_choices
from data_gen.prompts.load import SOURCES, STYLES, available_splits, load_prompts, parse_source, source_kind, validate
from data_gen.prompts.templates import TEMPLATES, render
from data_gen.prompts.types import Prompt, PromptSourceError

__all__ = [
    "SOURCES",
    "STYLES",
    "TEMPLATES",
    "Prompt",
    "PromptSourceError",
    "available_splits",
    "check_prompt_choices",
    "load_prompts",
    "parse_source",
    "render",
    "source_kind",
    "validate",
]
