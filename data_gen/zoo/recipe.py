"""The zoo's recipe: every size, step and seed knob of the build, in one dataclass."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ROLES: tuple[str, ...] = ("target", "draft", "companion")
STUDENT_ROLES: tuple[str, ...] = ("draft", "companion")


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

    vocab_size: int = 512  # short tokens (~1.7 characters): a target trainable in minutes is confident on many
    context: int = 256
    target: ModelShape = field(default_factory=lambda: ModelShape(4, 256, 4, 688, seed=1))
    draft: ModelShape = field(default_factory=lambda: ModelShape(2, 128, 2, 344, seed=2))
    companion: ModelShape = field(default_factory=lambda: ModelShape(1, 192, 3, 512, seed=3))
    # Target pre-training (next-token cross-entropy).
    target_steps: int = 500
    target_batch: int = 16
    target_lr: float = 3e-3
    # Distillation of draft and companion from the target (shared target forward).
    distil_steps: int = 300
    draft_steps: int | None = 240  # the draft stops earlier (a real draft is clearly weaker); None: distil_steps
    distil_batch: int = 16
    distil_lr: float = 3e-3
    distil_kl_weight: float = 0.5  # loss = w * KL(target || student) + (1 - w) * CE
    draft_kl_weight: float | None = 0.9  # the draft's own w (None: distil_kl_weight)
    # Folded into the target after distillation (logits / T): like an instruction-tuned target, its
    # responses are sharper than the text it and the students learned from (data_gen.zoo.models).
    target_temperature: float = 0.85
    warmup_fraction: float = 0.05
    precision: str = "auto"  # auto | bf16 | fp32: bf16 autocast of training forwards (weights stay float32);
    # auto = bf16 only where the CPU runs it natively (data_gen.zoo.precision)
    weight_decay: float = 0.1
    data_seed: int = 0
    # Evaluation on dev-split modules.
    eval_windows: int = 96  # held-out loss: this many full-context windows of dev text
    accept_prompts: int = 64  # acceptance: this many dev prompts ...
    accept_prompt_tokens: int = 64  # ... of this many tokens, starting at a line boundary,
    accept_response_tokens: int = 128  # ... each followed by this many target-sampled tokens
    eval_seed: int = 1234
    train_module_limit: int | None = None  # None: all train-split modules (tests use a few)

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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, stored in ``zoo.json``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ZooRecipe:
        """Inverse of :meth:`to_dict`."""
        fields = dict(data)
        for role in ROLES:
            fields[role] = ModelShape(**fields[role])
        return cls(**fields)
