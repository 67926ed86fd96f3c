"""What every Hydra entry point shares: config → typed objects, dry runs, one-line errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from accept_heads.config import Config, ConfigError, register_configs

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")

register_configs()


def user_errors() -> tuple[type[Exception], ...]:
    """Exception types that describe bad input: shown as one line, never as a traceback."""
    from data_gen.prompts import PromptSourceError
    from decode.hub import ModelLoadError

    return (ConfigError, ModelLoadError, FileNotFoundError, PromptSourceError)


def check_prompt_choices(config: Config) -> None:
    """Prompt source, splits, style, template and out-of-distribution sets exist (no data is read)."""
    from data_gen.prompts import parse_source, validate

    prompts = config.prompts
    try:
        for split in config.collect.splits:
            validate(prompts.source, split, prompts.style, prompts.template)
        for spec in prompts.ood:
            source, style = parse_source(spec)
            validate(source, "test", style)
    except ValueError as error:
        raise ConfigError(f"prompts: {error}") from error


def to_config(cfg: DictConfig) -> Config:
    """Resolve every interpolation and build the typed config (runs the ``__post_init__`` checks)."""
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, Config)
    return config


def quiet_library_output() -> None:
    """Keep the terminal for our own progress bars and tables: no per-file loading/saving bars."""
    import datasets
    import transformers

    from decode.hub import quiet_hub_logs

    quiet_hub_logs()
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def run_entry(cfg: DictConfig, command: str, task: Callable[[Config], Any]) -> Any:
    """Validate ``cfg``; on ``dry_run`` print it and stop; else run ``task`` with clean errors."""
    quiet_library_output()
    try:
        config = to_config(cfg)
        check_prompt_choices(config)
        if config.dry_run:
            print(OmegaConf.to_yaml(cfg, resolve=True), end="")
            print(f"[{command}] dry run: config '{config.exp_name}' is valid; nothing was loaded.")
            return None
        return task(config)
    except user_errors() as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
