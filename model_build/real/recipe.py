"""How a real pair's draft and companion are built on its target: every shape, size, step and seed knob."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from decode.json_types import JSONDict
from model_build.model_store import STUDENT_ROLES


@dataclass(frozen=True)
class StudentShape:
    """A model built on the target: its first ``target_layers`` layers (copied, frozen), then trained layers.

    The trained layers start as copies of the target's layers ``init_from`` (its last ones: they map a
    hidden state to what the output layer reads). ``vocab_subset``: the number of tokens its output
    layer scores (a :class:`decode.subset_vocab.SubsetVocabHead` over the target's most frequent
    response tokens, starting as their rows of the target's embeddings, trained with
    ``trained_head``); None scores the whole vocabulary through the target's tied embeddings.
    """

    target_layers: int
    init_from: tuple[int, ...]
    vocab_subset: int | None = None
    trained_head: bool = False

    def __post_init__(self) -> None:
        if self.trained_head and self.vocab_subset is None:
            raise ValueError("trained_head needs a vocab_subset: the full output layer is the target's tied embeddings")

    @property
    def trained_layers(self) -> int:
        """How many layers are trained."""
        return len(self.init_from)

    @property
    def layers(self) -> int:
        """Its depth."""
        return self.target_layers + self.trained_layers


@dataclass(frozen=True)
class PairRecipe:
    """Every knob of a rebuild of the draft and companion (``python -m model_build.real --rebuild``)."""

    draft: StudentShape = field(default_factory=lambda: StudentShape(4, (29,), vocab_subset=8192, trained_head=True))
    companion: StudentShape = field(default_factory=lambda: StudentShape(8, (29,)))
    # The target's own responses to chat-wrapped train-split prompts (never HumanEval).
    train_prompts: int = 2048
    response_tokens: int = 128
    generation_batch: int = 64
    # Distillation: soft cross-entropy to the target's top-k probabilities at every response position.
    top_k: int = 64
    tokens_per_step: dict[str, int] = field(default_factory=lambda: {"draft": 8192, "companion": 4096})
    steps: dict[str, int] = field(default_factory=lambda: {"draft": 600, "companion": 200})
    lr: float = 1.5e-3
    warmup_steps: int = 20
    seed: int = 0
    # Realism figures: dev prompts of the evaluation's source, and HumanEval.
    realism_prompts: int = 48
    realism_tokens: int = 96
    latency_repeats: int = 30

    def shape(self, role: str) -> StudentShape:
        """The shape of a student role (draft or companion)."""
        if role not in STUDENT_ROLES:
            raise ValueError(f"unknown student role {role!r}; choose one of {', '.join(STUDENT_ROLES)}")
        return getattr(self, role)

    @classmethod
    def from_dict(cls, data: JSONDict) -> PairRecipe:
        """Inverse of :meth:`to_dict`."""
        students = {role: StudentShape(**{**data[role], "init_from": tuple(data[role]["init_from"])})
                    for role in STUDENT_ROLES}
        return cls(**{**data, **students})

    def to_dict(self) -> JSONDict:
        """JSON-ready form."""
        data = asdict(self)
        for role in STUDENT_ROLES:
            data[role]["init_from"] = list(data[role]["init_from"])
        return data
