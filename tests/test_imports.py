"""The inference library imports without the training stack."""

from __future__ import annotations

import subprocess
import sys

BLOCK_TRAINING_STACK = """
import importlib.machinery
import sys
BLOCKED = ("hydra", "lightning", "pytorch_lightning", "wandb", "omegaconf", "datasets")
class _HidingPathFinder(importlib.machinery.PathFinder):
    # The training stack looks uninstalled: find_spec says None, import raises ModuleNotFoundError
    # (libraries that probe for optional packages, e.g. accelerate for wandb, see it as absent).
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return None
        return super().find_spec(name, path, target)
sys.meta_path[:] = [_HidingPathFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
import decode
import decode.hub
print("ok", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
"""


def test_decode_imports_without_hydra_lightning_wandb():
    result = subprocess.run([sys.executable, "-c", BLOCK_TRAINING_STACK], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok []"


def test_the_block_itself_works():
    """Negative control: the same guard makes an import of hydra fail."""
    code = BLOCK_TRAINING_STACK.replace("import decode\n", "import hydra\n", 1)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "No module named 'hydra'" in result.stderr
