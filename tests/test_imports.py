"""The inference library imports without the training stack."""

from __future__ import annotations

import subprocess
import sys

BLOCK_TRAINING_STACK = """
import sys
class _Block:
    blocked = ("hydra", "lightning", "pytorch_lightning", "wandb", "omegaconf", "datasets")
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.blocked:
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, _Block())
import decode
import decode.hub
print("ok", sorted(m for m in sys.modules if m.split(".")[0] in _Block.blocked))
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
    assert "blocked" in result.stderr
