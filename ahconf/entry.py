"""What every Hydra entry point shares: config → typed objects, dry runs, one-line errors."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from ahconf.schema import Config, ConfigError, register_configs
from decode.artifacts.hub import ModelLoadError, quiet_hub_logs
from decode.compile.store import CompiledStoreNotice

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
USER_ERRORS = (ConfigError, ModelLoadError, FileNotFoundError)  # bad input: one line, never a traceback

register_configs()


def to_config(cfg: DictConfig) -> Config:
    """Resolve every interpolation and build the typed config (runs the ``__post_init__`` checks)."""
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, Config)
    return config


#: Deprecation messages one library raises about its use of another, which nothing on our side can change
#: (message regexes): torch deprecates the ``LeafSpec`` check Lightning's fit loop makes.
OTHER_LIBRARIES_DEPRECATIONS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated",)


def no_advertisement(record: logging.LogRecord) -> bool:
    """Drop Lightning's "💡 Tip" lines (an advertisement for its cloud logger, printed by every Trainer)."""
    return not str(record.msg).startswith("💡 Tip")


def one_line_notices() -> None:
    """Our own notices (:class:`~decode.compile.store.CompiledStoreNotice`) print as one ``note:`` line, without the
    file and source line a warning adds; every other warning prints as before."""
    shown = warnings.showwarning
    if getattr(shown, "one_line_notices", False):
        return

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, CompiledStoreNotice):
            print(f"note: {message}", file=file or sys.stderr, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    show.one_line_notices = True
    warnings.showwarning = show


def quiet_library_output() -> None:
    """Keep the terminal for our own progress bars and tables: no per-file loading/saving bars, none of
    :data:`OTHER_LIBRARIES_DEPRECATIONS`, and our notices on one line (:func:`one_line_notices`)."""
    import datasets
    import transformers

    one_line_notices()

    for message in OTHER_LIBRARIES_DEPRECATIONS:
        warnings.filterwarnings("ignore", message, FutureWarning)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(no_advertisement)
    quiet_hub_logs()
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def run_entry(cfg: DictConfig, command: str, task: Callable[[Config], Any], check: Callable[[Config], None]) -> Any:
    """Validate ``cfg`` and ``check`` it; on ``dry_run`` print it and stop; else run ``task`` with clean errors.

    ``check`` validates what the schema cannot see (the prompt choices: ``data_gen.prompts``); it
    runs on a dry run too. Errors in :data:`USER_ERRORS` print ``error: ...`` and exit with status 2.
    """
    quiet_library_output()
    try:
        config = to_config(cfg)
        check(config)
        if config.dry_run:
            print(OmegaConf.to_yaml(cfg, resolve=True), end="")
            print(f"[{command}] dry run: config '{config.exp_name}' is valid; nothing was loaded.")
            return None
        return task(config)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
