"""``python -m data_gen.collect [+exp=NAME] [overrides]``: collect labelled training data."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from accept_heads.cli import CONF_DIR, run_entry
from accept_heads.config import Config, ConfigError


def collect(config: Config) -> dict:
    """Collect target responses with per-token labels (implemented in issue [3/6])."""
    raise ConfigError(
        "collection is not available yet in this version; run with dry_run=true to validate a config"
    )


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_entry(cfg, "data_gen.collect", collect)


if __name__ == "__main__":
    main()
