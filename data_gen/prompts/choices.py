"""A config's prompt choices, checked by every entry point before anything is loaded (dry runs too)."""

from __future__ import annotations

from ahconf.schema import Config, ConfigError
from data_gen.prompts.load import parse_source, validate


def check_prompt_choices(config: Config) -> None:
    """Prompt source, splits, style, template and out-of-distribution sets exist (no data is read)."""
    prompts = config.prompts
    try:
        for split in config.collect.splits:
            validate(prompts.source, split, prompts.style, prompts.template)
        for spec in prompts.ood:
            source, style = parse_source(spec)
            validate(source, "test", style)
    except ValueError as error:
        raise ConfigError(f"prompts: {error}") from error
