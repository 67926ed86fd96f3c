"""``python -m accept_heads.levers``: the CLI (:mod:`accept_heads.levers`)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from accept_heads.levers.driver import run_levers
from ahconf.entry import CONF_DIR, run_entry
from data_gen.prompts import check_prompt_choices


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_entry(cfg, "accept_heads.levers", lambda config: run_levers(config.evaluate_job()), check_prompt_choices)


if __name__ == "__main__":
    main()
