"""The Hydra entry point in subprocesses: two-process CPU DDP and a 2 x 2 multirun sweep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from decode.artifacts.serialization import load_head


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "accept_heads.train", *args], capture_output=True, text=True,
                            timeout=300, cwd=cwd)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def _data_dir(train_overrides: list[str]) -> Path:
    return Path(train_overrides[-1].split("=", 1)[1]) / "tiny" / "data"


def test_ddp_on_two_cpu_processes(train_overrides, tmp_path, repo_root):
    _run([*train_overrides, f"paths.root={tmp_path}", f"paths.data_dir={_data_dir(train_overrides)}", "trainer=ddp",
          "trainer.accelerator=cpu", "trainer.devices=2", "trainer.fast_dev_run=true", "trainer.num_workers=0"],
         repo_root)
    head = load_head(tmp_path / "tiny" / "heads" / "head.safetensors")
    assert head.metadata.dev_metrics["val/binary_kl"] > 0 and head.threshold is None  # h: the evaluation's to choose


def test_multirun_sweep_exports_one_head_per_job(train_overrides, tmp_path, repo_root):
    _run(["-m", "head.depth=1,2", "loss.w_rej=1,6", *train_overrides, f"paths.root={tmp_path}",
          f"paths.data_dir={_data_dir(train_overrides)}", "trainer.max_epochs=1",
          "logger=none"], repo_root)
    exports = sorted((tmp_path / "tiny" / "heads").glob("*/head.safetensors"))
    assert len(exports) == 4
    settings = set()
    for path in exports:
        head = load_head(path)
        config = head.metadata.train_config
        assert head.config.depth == config["head"]["depth"] and config["head"]["name"] == path.parent.name
        settings.add((config["head"]["depth"], config["loss"]["w_rej"]))
    assert settings == {(1, 1.0), (1, 6.0), (2, 1.0), (2, 6.0)}
    assert exports[3].parent.name == "003_head.depth=2,loss.w_rej=6"
