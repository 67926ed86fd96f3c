"""``python -m accept_heads.structure``: the CLI (:mod:`accept_heads.structure`)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from accept_heads.structure.driver import run_structure
from ahconf.entry import CONF_DIR, run_entry
from data_gen.prompts import check_prompt_choices


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_entry(cfg, "accept_heads.structure", lambda config: run_structure(config.structure_job()),
              check_prompt_choices)


if __name__ == "__main__":
    main()
