"""``python -m accept_heads.train [+exp=NAME] [overrides]``: train acceptance heads / SV profiles."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from accept_heads.cli import CONF_DIR, run_entry
from accept_heads.config import Config, ConfigError


def train(config: Config) -> dict:
    """Train the configured acceptance predictor and export it (implemented in issue [4/6])."""
    raise ConfigError(
        "training is not available yet in this version; run with dry_run=true to validate a config"
    )


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_entry(cfg, "accept_heads.train", train)


if __name__ == "__main__":
    main()
