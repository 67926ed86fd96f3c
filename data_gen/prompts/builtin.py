"""The offline ``builtin`` source: code prompts cut from the standard library, shipped with the project.

Styles ``function`` (a signature and docstring, continued with the body) and ``module`` (the first
lines of a module or top-level statement) of the modules of each split; how they are cut:
:mod:`data_gen.prompts.stdlib_prompts`. The sets are read from the package's data files
(:mod:`data_gen.prompts.shipped`), never from the running Python, so every Python decodes the same prompts.
"""

from __future__ import annotations

from functools import cache

from data_gen.prompts.shipped import prompt_set_file, read_records
from runtime.prompt import Prompt

SOURCE = "builtin"
STYLES: tuple[str, ...] = ("function", "module")


@cache
def builtin_prompts(split: str, style: str) -> tuple[Prompt, ...]:
    """All prompts of one split and style, in corpus order (module name, then position)."""
    return tuple(
        Prompt(id=record["id"], text=record["text"], source=SOURCE, split=split, style=style,
               reference=record["reference"])
        for record in read_records(prompt_set_file(split, style))
    )
