"""Target pre-training and two-student distillation loops."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import LlamaForCausalLM

from data_gen.schedule import warmup_cosine
from decode.artifacts.hub import native_bf16

from .recipe import ZooRecipe
from .windows import random_windows


def lr_factor(step: int, total: int, warmup_fraction: float) -> float:
    """The zoo's schedule: warm-up over ``warmup_fraction`` of the steps, cosine to 10 % of the peak."""
    return warmup_cosine(step, max(1, round(total * warmup_fraction)), total, 0.1)


def _optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def training_precision(requested: str) -> tuple[str, str | None]:
    """The precision a rebuild trains in, and a warning when it is not the requested one.

    ``bf16`` autocast needs native bfloat16; without it the rebuild falls back to ``fp32`` (the shipped
    trio's precision, whose realism the rebuild measures and prints like any other).
    """
    if requested == "bf16" and not native_bf16():
        return "fp32", ("this CPU has no native bfloat16 (no AVX-512 BF16 or AMX), where bf16 autocast is emulated "
                        "and slow: training in fp32 instead")
    return requested, None


def _autocast(enabled: bool):
    """bf16 autocast of the training forwards; enabled only by :func:`training_precision`'s ``bf16``."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else nullcontext()


def _step(optimizer: torch.optim.Optimizer, model: torch.nn.Module, loss: torch.Tensor, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def next_token_loss(logits: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of ``logits`` over ``windows``."""
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, vocab), windows[:, 1:].reshape(-1))


def train_target(model: LlamaForCausalLM, stream: torch.Tensor, recipe: ZooRecipe, autocast_bf16: bool) -> float:
    """Train ``model`` with next-token cross-entropy; returns the final training loss."""
    generator = torch.Generator().manual_seed(recipe.data_seed)
    optimizer = _optimizer(model, recipe.target_lr, recipe.weight_decay)
    model.train()
    loss_value = float("nan")
    bar = tqdm(range(recipe.target_steps), desc="zoo: train target", unit="step")
    for step in bar:
        windows = random_windows(stream, recipe.target_batch, recipe.context, generator).to(model.device)
        with _autocast(autocast_bf16):
            logits = model(input_ids=windows).logits
        loss = next_token_loss(logits, windows)
        _step(optimizer, model, loss, recipe.target_lr * lr_factor(step, recipe.target_steps, recipe.warmup_fraction))
        loss_value = loss.item()
        bar.set_postfix(loss=f"{loss_value:.3f}", refresh=False)
    model.eval()
    return loss_value


def distil_students(
    teacher: LlamaForCausalLM,
    students: dict[str, LlamaForCausalLM],
    stream: torch.Tensor,
    recipe: ZooRecipe,
    autocast_bf16: bool,
) -> dict[str, float]:
    """Train every student on shared batches: distilled from ``teacher`` and / or on the text itself.

    Loss per student: ``w * KL(teacher || student) + (1 - w) * CE``, ``w = recipe.kl_weight(role)``;
    returns final losses. Where every ``w = 0`` (students trained on the data alone) the teacher is
    not run. Each student trains for ``recipe.steps(role)`` steps on the first batches of the shared sequence, with
    its own warm-up / cosine schedule over them.
    """
    generator = torch.Generator().manual_seed(recipe.data_seed + 1)
    optimizers = {role: _optimizer(m, recipe.distil_lr, recipe.weight_decay) for role, m in students.items()}
    weights = {role: recipe.kl_weight(role) for role in students}
    teacher.eval()
    for model in students.values():
        model.train()
    losses = {role: float("nan") for role in students}
    steps = {role: recipe.steps(role) for role in students}
    bar = tqdm(range(max(steps.values())), desc="zoo: train students", unit="step")
    for step in bar:
        windows = random_windows(stream, recipe.distil_batch, recipe.context, generator).to(teacher.device)
        teacher_logp = None
        if any(w > 0 for w in weights.values()):
            with torch.no_grad(), _autocast(autocast_bf16):
                teacher_logits = teacher(input_ids=windows).logits
            teacher_logp = F.log_softmax(teacher_logits.float(), dim=-1).flatten(0, 1)
        for role, model in students.items():
            if step >= steps[role]:
                continue
            lr = recipe.distil_lr * lr_factor(step, steps[role], recipe.warmup_fraction)
            with _autocast(autocast_bf16):
                logits = model(input_ids=windows).logits
            loss = (1.0 - weights[role]) * next_token_loss(logits, windows)
            if weights[role] > 0:
                student_logp = F.log_softmax(logits.float(), dim=-1).flatten(0, 1)
                kl = F.kl_div(student_logp, teacher_logp, log_target=True, reduction="batchmean")
                loss = loss + weights[role] * kl
            _step(optimizers[role], model, loss, lr)
            losses[role] = loss.item()
        bar.set_postfix({role: f"{value:.3f}" for role, value in losses.items()}, refresh=False)
    for model in students.values():
        model.eval()
    return losses
