"""Batched target generation that keeps the target's per-step logits, and teacher-forced scoring.

The target samples responses under the run's sampling transform with left padding and a KV cache;
its raw logits at every step are kept, so the target never runs a second time. The draft and the
companion are then run once over ``[prompt, response]`` (teacher forcing) to get their logits at
the same positions. Responses produced elsewhere (:mod:`data_gen.responses`) take the same path
with the target teacher-forced too (:func:`given_batch`): one forward per model per batch.

**Vocabulary.** Checkpoints of one family may pad their output layers to different sizes (e.g.
152,064 rows for Qwen2.5-72B, 151,936 for 0.5B). Every logit tensor here is sliced to the shared
``vocab`` (:attr:`runtime.models.Trio.vocab`, the minimum over the models, as
:class:`decode.loops.speculative_decoder.SpeculativeDecoder` computes it), and the target *samples* its response from
the sliced logits too: the decoder's output is distributed as the sliced ``p``, so that is the
distribution the labels describe. The padding rows beyond it are never tokens of the tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Generator, Tensor
from transformers import PreTrainedModel

from decode.compile.batch_steps import BatchSteps
from decode.drafts import drafter_of
from decode.loops.prompt_input import left_pad
from decode.sampling import Sampling


@dataclass
class Batch:
    """Left-padded prompts followed by right-padded responses, one row per prompt."""

    prompt_lengths: list[int]
    response_lengths: list[int]  # tokens generated per row, EOS included when emitted
    input_ids: Tensor  # [B, P + T]: pads | prompt | response | pads
    attention_mask: Tensor  # [B, P + T]
    prompt_width: int  # P
    target_logits: Tensor  # [B, T, V] raw target logits (shared vocabulary) predicting response token t

    @property
    def response_width(self) -> int:
        return self.input_ids.shape[1] - self.prompt_width

    def prompt_ids(self, row: int) -> list[int]:
        return self.input_ids[row, self.prompt_width - self.prompt_lengths[row] : self.prompt_width].tolist()

    def response_ids(self, row: int) -> Tensor:
        return self.input_ids[row, self.prompt_width : self.prompt_width + self.response_lengths[row]]


def _positions(mask: Tensor) -> Tensor:
    return (mask.cumsum(-1) - 1).clamp_min(0)


class _GumbelNoise:
    """Per-row Gumbel noise drawn from each row's own generator, a chunk of steps at a time.

    ``argmax(logits + noise)`` is an exact sample of ``softmax(logits)`` (the Gumbel-max trick),
    so a whole batch samples in one vectorised op while every row keeps its own random stream.
    """

    def __init__(self, generators: list[Generator], vocab: int, device: torch.device, chunk: int = 32) -> None:
        self.generators, self.vocab, self.device, self.chunk = generators, vocab, device, chunk
        self.noise: Tensor | None = None

    def at(self, step: int) -> Tensor:
        if step % self.chunk == 0:
            uniform = torch.stack([torch.rand(self.chunk, self.vocab, generator=g, device=g.device)
                                   for g in self.generators]).to(self.device)
            self.noise = -torch.log(-torch.log(uniform))
        assert self.noise is not None
        return self.noise[:, step % self.chunk]


@torch.inference_mode()
def generate_responses(
    target: PreTrainedModel,
    prompts: list[list[int]],
    *,
    sampling: Sampling,
    max_new_tokens: int,
    eos_token_id: int | None,
    pad_token_id: int,
    generators: list[Generator],
    vocab: int,
    keep_logits: bool = True,
    compiled: bool = False,
) -> Batch:
    """Sample one response per prompt from ``target`` and keep its raw logits at every step.

    Logits are sliced to the first ``vocab`` entries before sampling (see the module docstring).
    Without ``keep_logits`` the batch's ``target_logits`` is empty (a caller that needs only the
    responses does not hold ``[B, T, V]`` floats). ``compiled``: the steps after the prompts run compiled over
    static caches grown by a bucket of columns (:class:`decode.compile.batch_steps.BatchSteps`).
    Each row draws from its own generator, so a prompt's response does not depend on which other
    prompts share its batch. A row stops after EOS; afterwards it is padded and masked.
    """
    device = target.device
    ids, prompt_mask = left_pad(prompts, pad_token_id, device)
    width = ids.shape[1]
    position = prompt_mask.sum(-1, keepdim=True)
    steps = BatchSteps(target, compiled)
    logits = steps.prefill(ids, prompt_mask, _positions(prompt_mask))[:, :vocab]
    noise = _GumbelNoise(generators, logits.shape[-1], device)
    finished = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    lengths = torch.zeros(len(prompts), dtype=torch.long, device=device)
    steps_logits, steps_tokens = [], []
    for step in range(max_new_tokens):
        if keep_logits:
            steps_logits.append(logits)
        if sampling.greedy:
            tokens = logits.argmax(-1)
        else:
            tokens = (sampling.warp(logits) + noise.at(step)).argmax(-1)
        tokens = torch.where(finished, torch.full_like(tokens, pad_token_id), tokens)
        lengths += (~finished).long()
        steps_tokens.append(tokens)
        if eos_token_id is not None:
            finished |= tokens == eos_token_id
        if step + 1 == max_new_tokens or bool(finished.all()):
            break
        logits = steps.step(tokens, position)[:, :vocab]
        position = position + 1
    responses = torch.stack(steps_tokens, dim=1)
    response_mask = torch.arange(responses.shape[1], device=device)[None, :] < lengths[:, None]
    return Batch(
        prompt_lengths=[len(p) for p in prompts],
        response_lengths=lengths.tolist(),
        input_ids=torch.cat([ids, responses], dim=1),
        attention_mask=torch.cat([prompt_mask, response_mask.long()], dim=1),
        prompt_width=width,
        target_logits=torch.stack(steps_logits, dim=1) if keep_logits else torch.empty(0),
    )


def given_batch(target: PreTrainedModel, prompts: list[list[int]], responses: list[list[int]], *, pad_token_id: int,
                vocab: int) -> Batch:
    """A :class:`Batch` of given responses, its ``target_logits`` from one teacher-forced target forward.

    The same layout as :func:`generate_responses` builds (left-padded prompts, right-padded
    responses), so every later step treats both alike.
    """
    device = target.device
    ids, prompt_mask = left_pad(prompts, pad_token_id, device)
    lengths = [len(r) for r in responses]
    tail = torch.full((len(responses), max(lengths)), pad_token_id, dtype=torch.long)
    for row, response in enumerate(responses):
        tail[row, : len(response)] = torch.tensor(response, dtype=torch.long)
    response_mask = torch.arange(tail.shape[1])[None, :] < torch.tensor(lengths)[:, None]
    batch = Batch(
        prompt_lengths=[len(p) for p in prompts],
        response_lengths=lengths,
        input_ids=torch.cat([ids, tail.to(device)], dim=1),
        attention_mask=torch.cat([prompt_mask, response_mask.long().to(device)], dim=1),
        prompt_width=ids.shape[1],
        target_logits=torch.empty(0),
    )
    batch.target_logits = teacher_forced_logits(target, batch, vocab)
    return batch


@torch.inference_mode()
def teacher_forced_logits(model: PreTrainedModel, batch: Batch, vocab: int) -> Tensor:
    """``[B, T, vocab]`` logits of ``model`` predicting each response token from its true prefix."""
    ids = batch.input_ids.to(model.device)
    mask = batch.attention_mask.to(model.device)
    width = batch.response_width
    out = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), logits_to_keep=width + 1)
    return out.logits[:, :-1, :vocab]


@torch.inference_mode()
def round_depth_logits(target: PreTrainedModel, draft: PreTrainedModel, batch: Batch, vocab: int,
                       depths: int) -> list[Tensor]:
    """``[B, T, vocab]`` logits of a depth-dependent draft predicting each response token at depths ``1 .. depths`` of
    a round (:meth:`decode.drafts.Drafter.round_states`): depth 1 is :func:`teacher_forced_logits`' counterpart."""
    ids = batch.input_ids.to(target.device)
    mask = batch.attention_mask.to(target.device)
    width = batch.response_width
    head = draft.get_output_embeddings()
    states = drafter_of(draft).round_states(target, draft, ids, mask, depths)
    return [head(hidden[:, -width - 1:-1])[..., :vocab] for hidden in states]
