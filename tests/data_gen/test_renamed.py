"""The builders' old command names forward to model_build for one release (data_gen.renamed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _help(module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, check=False, capture_output=True,
                          text=True, timeout=300)


def test_the_old_name_says_the_new_one_and_runs_it():
    old, new = _help("data_gen.zoo"), _help("model_build.zoo")
    assert old.returncode == new.returncode == 0, old.stderr
    assert old.stderr.splitlines()[0] == ("note: python -m data_gen.zoo is now python -m model_build.zoo "
                                          "(the old name works for this release)")
    assert old.stdout == new.stdout


def test_every_old_command_has_a_forwarder_to_its_new_module():
    for old in ("zoo", "real", "feature_draft"):
        text = (ROOT / "data_gen" / old / "__main__.py").read_text()
        assert f'forward("data_gen.{old}", "model_build.{old}")' in text
    assert ('forward("data_gen.feature_draft.ablation", "model_build.feature_draft.ablation")'
            in (ROOT / "data_gen" / "feature_draft" / "ablation.py").read_text())
