"""Train a student's layers on the target's own responses: soft cross-entropy to the target's top-k probabilities.

The student's first layers are the target's (frozen), so their output is computed once, in the
teacher pass that also records the target's top-k next-token probabilities at every response
position (:func:`teacher_pass`). Training then runs only the trained layers, the final norm and
the output layer (frozen rows of the target's embeddings) over those stored hidden states, one
batch of whole sequences at a time (``docs/real.md``).
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm
from transformers import LlamaForCausalLM

from data_gen.memory import release_freed_memory
from data_gen.schedule import warmup_cosine

from .recipe import PairRecipe, StudentShape


@dataclass
class TeacherRow:
    """One prompt + response, as the students train on it."""

    tokens: Tensor  # [L] prompt then response ids
    prompt_length: int
    hidden: dict[int, Tensor]  # target layer count → [L, H] bf16 hidden state after that many layers
    top_ids: Tensor  # [R, k] int32: the target's k likeliest next tokens at each response position
    top_probs: Tensor  # [R, k] fp16: their probabilities

    @property
    def positions(self) -> int:
        """Response positions (each predicts one response token)."""
        return len(self.tokens) - self.prompt_length


@torch.inference_mode()
def teacher_pass(target: LlamaForCausalLM, sequences: list[tuple[list[int], list[int]]], layers: set[int], top_k: int,
                 batch: int = 16) -> list[TeacherRow]:
    """Run the target once over every (prompt, response): the hidden states the students start from, and the
    top-k targets of every response position.

    Every row's tensors are views of a few buffers allocated up front: thousands of small tensors kept
    between the forwards' large temporaries fragment the heap until it holds many times the data.
    """
    lengths = [len(p) + len(r) for p, r in sequences]
    positions = [len(r) for _, r in sequences]
    width = target.config.hidden_size
    hidden = {n: torch.empty(sum(lengths), width, dtype=torch.bfloat16) for n in layers}
    top_ids = torch.empty(sum(positions), top_k, dtype=torch.int32)
    top_probs = torch.empty(sum(positions), top_k, dtype=torch.float16)
    tokens = torch.empty(sum(lengths), dtype=torch.long)
    embeddings = target.get_output_embeddings().weight
    pad = target.config.pad_token_id or 0
    rows: list[TeacherRow] = []
    at = answer_at = 0
    for start in tqdm(range(0, len(sequences), batch), desc="teacher pass", unit="batch"):
        chunk = sequences[start:start + batch]
        ids = torch.full((len(chunk), max(lengths[start:start + batch])), pad, dtype=torch.long)
        for row, (prompt, response) in enumerate(chunk):
            ids[row, : len(prompt) + len(response)] = torch.tensor(prompt + response)
        out = target.model(input_ids=ids, output_hidden_states=True)
        for row, (prompt, response) in enumerate(chunk):
            end, first = len(prompt) + len(response), len(prompt) - 1
            logits = (out.last_hidden_state[row, first:end - 1] @ embeddings.T).float()
            top = logits.log_softmax(-1).topk(top_k, dim=-1)
            span, answers = slice(at, at + end), slice(answer_at, answer_at + len(response))
            tokens[span] = ids[row, :end]
            for n in layers:
                hidden[n][span] = out.hidden_states[n][row, :end]
            top_ids[answers], top_probs[answers] = top.indices, top.values.exp()
            rows.append(TeacherRow(tokens=tokens[span], prompt_length=len(prompt),
                                   hidden={n: hidden[n][span] for n in layers},
                                   top_ids=top_ids[answers], top_probs=top_probs[answers]))
            at, answer_at = at + end, answer_at + len(response)
    return rows


class StudentTail(nn.Module):
    """The trained part of a student: its layers (copies of target layers), final norm, and output rows (frozen
    unless the shape trains its head)."""

    def __init__(self, target: LlamaForCausalLM, shape: StudentShape, subset: Tensor | None) -> None:
        super().__init__()
        self.shape = shape
        self.layers = nn.ModuleList()
        for index, source in enumerate(shape.init_from):
            layer = copy.deepcopy(target.model.layers[source]).float()
            layer.self_attn.layer_idx = shape.target_layers + index
            self.layers.append(layer)
        self.norm = copy.deepcopy(target.model.norm).float()
        self.rotary = target.model.rotary_emb
        rows = target.get_output_embeddings().weight.detach().float()
        head = rows if subset is None else rows[subset].clone()
        if shape.trained_head:
            self.head = nn.Parameter(head)
        else:
            self.register_buffer("head", head, persistent=False)
        # target id → column of the head, -1 off the subset
        columns = torch.full((rows.shape[0],), -1, dtype=torch.long)
        columns[subset if subset is not None else torch.arange(rows.shape[0])] = torch.arange(self.head.shape[0])
        self.register_buffer("columns", columns, persistent=False)

    def forward(self, hidden: Tensor) -> Tensor:
        """Logits over the head's rows ``[B, L, V']`` of stored hidden states ``[B, L, H]`` (right-padded)."""
        batch, length, _ = hidden.shape
        positions = torch.arange(length)[None].expand(batch, length)
        rotary = tuple(t.float() for t in self.rotary(hidden, positions))
        causal = torch.full((length, length), float("-inf")).triu(1)[None, None]
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=causal, position_ids=positions, position_embeddings=rotary)
        return self.norm(hidden) @ self.head.T

    def trained_state(self) -> dict[str, Tensor]:
        """The trained tensors under the student model's state-dict names."""
        state = {f"model.layers.{self.shape.target_layers + i}.{name}": tensor
                 for i, layer in enumerate(self.layers) for name, tensor in layer.state_dict().items()}
        state["model.norm.weight"] = self.norm.weight.detach()
        if self.shape.trained_head:
            state["lm_head.weight"] = self.head.detach()
        return state


def _batches(rows: list[TeacherRow], tokens: int, generator: torch.Generator) -> list[list[TeacherRow]]:
    order = torch.randperm(len(rows), generator=generator).tolist()
    batches, current, size = [], [], 0
    for index in order:
        current.append(rows[index])
        size += len(rows[index].tokens)
        if size >= tokens:
            batches.append(current)
            current, size = [], 0
    return batches + ([current] if current else [])


def _loss(tail: StudentTail, chunk: list[TeacherRow], layer: int, bf16: bool) -> Tensor:
    """Soft cross-entropy ``−Σ_k p_k log q(y_k)`` over the response positions (targets off the head count zero)."""
    width = max(len(row.tokens) for row in chunk)
    hidden = torch.zeros(len(chunk), width, tail.head.shape[1])
    mask = torch.zeros(len(chunk), width, dtype=torch.bool)
    for i, row in enumerate(chunk):
        hidden[i, : len(row.tokens)] = row.hidden[layer].float()
        mask[i, row.prompt_length - 1: len(row.tokens) - 1] = True
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
        logits = tail(hidden)
    log_q = logits[mask].float().log_softmax(-1)
    columns = tail.columns[torch.cat([row.top_ids for row in chunk]).long()]
    probs = torch.cat([row.top_probs for row in chunk]).float() * (columns >= 0)
    return -(probs * log_q.gather(-1, columns.clamp_min(0))).sum(-1).mean()


def distil(target: LlamaForCausalLM, shape: StudentShape, subset: Tensor | None, rows: list[TeacherRow],
           recipe: PairRecipe, role: str, bf16: bool) -> tuple[StudentTail, float]:
    """Train one student's tail for its recipe's steps; the tail and its mean loss over the last tenth of the steps."""
    steps, tokens = recipe.steps[role], recipe.tokens_per_step[role]
    torch.manual_seed(recipe.seed)
    tail = StudentTail(target, shape, subset)
    params = [p for p in tail.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(recipe.seed)
    losses: list[float] = []
    batches: list[list[TeacherRow]] = []
    for step in tqdm(range(steps), desc=f"training the {role}", unit="step"):
        if not batches:
            batches = _batches(rows, tokens, generator)
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * warmup_cosine(step, recipe.warmup_steps, steps, 0.1)
        loss = _loss(tail, batches.pop(), shape.target_layers, bf16)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 20 == 19:
            release_freed_memory()  # batches of different shapes fragment the heap
    tail_losses = losses[-max(1, steps // 10):]
    return tail.eval(), sum(tail_losses) / len(tail_losses)
