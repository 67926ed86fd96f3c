"""The one error type of prompt loading (the prompt record is :class:`runtime.prompt.Prompt`)."""

from __future__ import annotations

from ahconf.schema import ConfigError


class PromptSourceError(ConfigError):
    """A prompt source cannot be read: unreachable hub dataset, missing or malformed file, no prompts.

    A :class:`~ahconf.schema.ConfigError` (so a ``ValueError``): the entry points report it in one line.
    """
