"""The zoo's recipe: every size, step and seed knob of the build, in one dataclass."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from decode.json_types import JSONDict
from model_build.model_store import ROLES

PRECISIONS: tuple[str, ...] = ("fp32", "bf16")


@dataclass(frozen=True)
class ModelShape:
    """Shape and initialisation seed of one Llama model."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    seed: int


@dataclass(frozen=True)
class ZooRecipe:
    """Every knob of a zoo build. The default instance is the real ``tiny-code`` zoo."""

    # short tokens (docs/log/figures-from-code-comments.md): a target trainable in minutes is confident on many
    vocab_size: int = 512
    context: int = 256
    target: ModelShape = field(default_factory=lambda: ModelShape(4, 256, 4, 688, seed=1))
    draft: ModelShape = field(default_factory=lambda: ModelShape(2, 128, 2, 344, seed=2))
    companion: ModelShape = field(default_factory=lambda: ModelShape(1, 192, 3, 512, seed=3))
    # Target pre-training (next-token cross-entropy).
    # batches of 16 × 256 tokens: most of one pass over the train split (docs/log/figures-from-code-comments.md)
    target_steps: int = 1000
    target_batch: int = 16
    target_lr: float = 3e-3
    # Distillation of draft and companion from the target (shared target forward).
    distil_steps: int = 1000
    draft_steps: int | None = 450  # the draft stops earlier (a real draft is clearly weaker); None: distil_steps
    distil_batch: int = 16
    distil_lr: float = 3e-3
    distil_kl_weight: float = 0.5  # loss = w * KL(target || student) + (1 - w) * CE
    draft_kl_weight: float | None = 0.9  # the draft's own w (None: distil_kl_weight)
    # Folded into the target after distillation (logits / T): like an instruction-tuned target, its
    # responses are sharper than the text it and the students learned from (model_build.zoo.architecture).
    target_temperature: float = 0.85
    warmup_fraction: float = 0.05
    precision: str = "fp32"  # fp32 | bf16: bf16 autocast of training forwards (weights stay float32); the
    # shipped trio trained in fp32 (bf16 is fast only on CPUs with native bfloat16 and trains other bytes)
    weight_decay: float = 0.1
    data_seed: int = 0
    # Realism figures (model_build.zoo.realism).
    eval_windows: int = 96  # held-out loss: this many full-context windows of dev text
    realism_prompts: int = 64  # prompts per set: line starts of dev modules, and the evaluation's two styles
    line_prompt_tokens: int = 64  # line-start prompts: this many tokens from a random line of a dev module
    prompt_budget: int = 128  # the evaluation's prompts: at most this many tokens (prompts.max_prompt_tokens)
    prompt_seed: int = 0  # ... picked by the evaluation's seeded shuffle (the config's seed)
    response_tokens: int = 96  # target responses (T = 1 and greedy) of this many tokens after each prompt
    degeneracy_tokens: int = 64  # greedy continuations checked for whitespace and loops: their first tokens
    eval_seed: int = 1234
    train_module_limit: int | None = None  # None: all train-split modules (tests use a few)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown zoo precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")

    def shape(self, role: str) -> ModelShape:
        """The shape of ``role`` (target, draft or companion)."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
        return getattr(self, role)

    def steps(self, role: str) -> int:
        """Training steps of ``role``."""
        if role == "target":
            return self.target_steps
        if role == "draft" and self.draft_steps is not None:
            return self.draft_steps
        self.shape(role)  # validates the name
        return self.distil_steps

    def kl_weight(self, role: str) -> float:
        """Distillation weight ``w`` of student ``role`` (loss ``w * KL + (1 - w) * CE``)."""
        if role == "draft" and self.draft_kl_weight is not None:
            return self.draft_kl_weight
        self.shape(role)  # validates the name
        return self.distil_kl_weight

    def to_dict(self) -> JSONDict:
        """JSON-ready form, stored in ``zoo.json``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: JSONDict) -> ZooRecipe:
        """Inverse of :meth:`to_dict`."""
        fields = dict(data)
        for role in ROLES:
            fields[role] = ModelShape(**fields[role])
        return cls(**fields)
