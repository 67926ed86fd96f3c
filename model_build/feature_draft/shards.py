"""What a feature draft trains on, in resumable shards: the target's responses, then its features and top-k.

Two kinds of shard under one directory, each a safetensors file written whole and renamed into place, so an
interrupted run keeps every finished shard and redoes only the one it was writing:

* ``responses-NNNNN.safetensors``: the target's responses to a slice of the prompts under one of the plan's
  temperatures (each prompt with its own seeded stream, so a shard's content does not depend on which others
  exist): shard ``i`` is pass ``i // shards_per_pass`` (its temperature; 0 is greedy) over slice
  ``i % shards_per_pass`` of the prompts;
* ``teacher-NNNNN.safetensors``: for the same sequences, the target's feature at every position (the hidden
  states a feature draft reads, :attr:`decode.drafts.feature_model.FeatureDraftConfig.feature_layers`) and its top-k
  next-token probabilities there. Prompt positions count as well as response ones: the target's distribution is
  the label, not the next token (``docs/design.md`` §8).

Every shard's metadata names what made it (the prompt slice, the seed, the target's weights' sha256); a shard
made by another run configuration is refused, never mixed in.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from data_gen.generation import generate_responses
from data_gen.memory import release_freed_memory
from decode.drafts.feature_model import target_features
from decode.sampling import Sampling
from runtime.seeding import prompt_seed

RESPONSES, TEACHER = "responses", "teacher"


class ShardMismatchError(ValueError):
    """A shard on disk was made by another configuration; the message names it and the fix."""


@dataclass(frozen=True)
class ShardPlan:
    """How prompts become shards: ``prompts_per_shard`` prompts each, responses of up to ``response_tokens``, one
    pass over the prompts per temperature (0: greedy)."""

    prompts_per_shard: int = 256
    response_tokens: int = 128
    generation_batch: int = 64
    teacher_batch: int = 16
    top_k: int = 32
    seed: int = 0
    target_sha256: str = ""
    feature_layers: tuple[int, ...] = ()
    temperatures: tuple[float, ...] = (1.0,)

    def shards_per_pass(self, prompts: int) -> int:
        """Shards one pass over ``prompts`` prompts takes."""
        return (prompts + self.prompts_per_shard - 1) // self.prompts_per_shard

    def fingerprint(self, kind: str) -> dict[str, str]:
        """The metadata every shard of ``kind`` carries (what must match for it to be reused)."""
        fields = asdict(self)
        if tuple(fields["temperatures"]) == (1.0,):  # a single T = 1 pass fingerprints as before passes existed
            fields.pop("temperatures")
        if kind == RESPONSES:  # responses do not depend on how the teacher reads them
            for name in ("teacher_batch", "top_k", "feature_layers"):
                fields.pop(name)
        return {"kind": kind, "plan": json.dumps(fields, sort_keys=True)}


@dataclass(frozen=True)
class Sequences:
    """Prompt + response token sequences, concatenated."""

    tokens: Tensor  # [N] int32, every sequence's prompt then response
    lengths: Tensor  # [S] int32
    prompt_lengths: Tensor  # [S] int32

    def split(self) -> list[tuple[list[int], list[int]]]:
        """Per sequence: (prompt ids, response ids)."""
        out, at = [], 0
        for length, prompt in zip(self.lengths.tolist(), self.prompt_lengths.tolist()):
            ids = self.tokens[at:at + length].tolist()
            out.append((ids[:prompt], ids[prompt:]))
            at += length
        return out

    def tensors(self) -> dict[str, Tensor]:
        return {"tokens": self.tokens, "lengths": self.lengths, "prompt_lengths": self.prompt_lengths}

    @classmethod
    def of(cls, pairs: list[tuple[list[int], list[int]]]) -> Sequences:
        return cls(tokens=torch.tensor([t for p, r in pairs for t in p + r], dtype=torch.int32),
                   lengths=torch.tensor([len(p) + len(r) for p, r in pairs], dtype=torch.int32),
                   prompt_lengths=torch.tensor([len(p) for p, _ in pairs], dtype=torch.int32))


def shard_file(directory: Path, kind: str, index: int) -> Path:
    """Where shard ``index`` of ``kind`` lives."""
    return directory / f"{kind}-{index:05d}.safetensors"


def read_shard(path: Path, plan: ShardPlan, kind: str, tensors: bool = True) -> dict[str, Tensor] | None:
    """The shard's tensors, or None where it does not exist; refuses one made by another plan. Without
    ``tensors``, only the check: an empty dict where the shard exists."""
    if not path.is_file():
        return None
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata() or {}
        if {k: metadata.get(k) for k in ("kind", "plan")} != plan.fingerprint(kind):
            raise ShardMismatchError(f"{path} was made by another configuration ({metadata.get('plan')}); "
                                     "use another --data-dir or delete it")
        if not tensors:
            return {}
        return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (a safetensors handle, not a dict)


@dataclass
class ShardTimes:
    """Where a shard run's time went: seconds generating responses and in the teacher pass, and what each made."""

    response_seconds: float = 0.0
    response_tokens: int = 0  # response tokens generated by this run
    teacher_seconds: float = 0.0
    teacher_positions: int = 0  # positions the teacher pass labelled in this run

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "response_tokens_per_second": self.response_tokens / max(self.response_seconds, 1e-9),
                "teacher_positions_per_second": self.teacher_positions / max(self.teacher_seconds, 1e-9)}


def read_sequences(path: Path) -> Sequences:
    """The token sequences of a response or teacher shard, without its other tensors."""
    with safe_open(str(path), "pt") as handle:
        return Sequences(handle.get_tensor("tokens"), handle.get_tensor("lengths"), handle.get_tensor("prompt_lengths"))


def write_shard(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
    """Write the shard whole, then rename it into place (no half-written shard is ever read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=metadata)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def seed_label(first: int, temperature_pass: int) -> str:
    """The name of prompt ``first``'s random stream in pass ``temperature_pass`` (the first pass keeps the names
    shards had before passes existed)."""
    return f"train/{first}" if temperature_pass == 0 else f"train/pass{temperature_pass}/{first}"


def response_shard(target: PreTrainedModel, prompts: list[list[int]], first: int, plan: ShardPlan, eos: int | None,
                   pad: int, vocab: int, temperature_pass: int = 0) -> Sequences:
    """The target's response to each of ``prompts`` (global indices from ``first``) at the pass's temperature, EOS
    included, in the prompts' order.

    Generated in batches of similar prompt lengths (less left padding); every prompt samples from its own stream.
    """
    sampling = Sampling(temperature=plan.temperatures[temperature_pass])
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    responses: dict[int, list[int]] = {}
    for start in range(0, len(order), plan.generation_batch):
        rows = order[start:start + plan.generation_batch]
        generators = [torch.Generator().manual_seed(prompt_seed(plan.seed, seed_label(first + i, temperature_pass)))
                      for i in rows]
        batch = generate_responses(target, [prompts[i] for i in rows], sampling=sampling,
                                   max_new_tokens=plan.response_tokens, eos_token_id=eos, pad_token_id=pad,
                                   generators=generators, vocab=vocab, keep_logits=False)
        responses.update((i, batch.response_ids(row).tolist()) for row, i in enumerate(rows))
        del batch
        release_freed_memory()
    return Sequences.of([(prompt, responses[i]) for i, prompt in enumerate(prompts)])


@torch.inference_mode()
def teacher_shard(target: PreTrainedModel, sequences: Sequences, plan: ShardPlan) -> dict[str, Tensor]:
    """Features ``[N, F]`` (bf16) and top-k ``[N, k]`` next-token ids / probabilities of every position."""
    pairs = sequences.split()
    total = int(sequences.lengths.sum())
    features: Tensor | None = None
    top_ids = torch.empty(total, plan.top_k, dtype=torch.int32)
    top_probs = torch.empty(total, plan.top_k, dtype=torch.float16)
    pad = target.config.pad_token_id or 0
    at = 0
    for start in range(0, len(pairs), plan.teacher_batch):
        chunk = [p + r for p, r in pairs[start:start + plan.teacher_batch]]
        ids = torch.full((len(chunk), max(map(len, chunk))), pad, dtype=torch.long)
        for row, seq in enumerate(chunk):
            ids[row, :len(seq)] = torch.tensor(seq)
        out = target(input_ids=ids.to(target.device), output_hidden_states=True)
        feats = target_features(out.hidden_states, plan.feature_layers)
        if features is None:
            features = torch.empty(total, feats.shape[-1], dtype=torch.bfloat16)
        top = out.logits.float().log_softmax(-1).topk(plan.top_k, dim=-1)
        for row, seq in enumerate(chunk):
            span = slice(at, at + len(seq))
            features[span] = feats[row, :len(seq)].cpu()
            top_ids[span] = top.indices[row, :len(seq)].cpu().to(torch.int32)
            top_probs[span] = top.values[row, :len(seq)].exp().cpu().half()
            at += len(seq)
        del out
    assert features is not None, "a teacher shard holds at least one sequence"
    return {**sequences.tensors(), "features": features, "top_ids": top_ids, "top_probs": top_probs}


def responses(target: PreTrainedModel, prompts: list[list[int]], directory: Path, plan: ShardPlan, index: int,
              eos: int | None, pad: int, vocab: int, times: ShardTimes) -> Sequences:
    """Response shard ``index``: read where it was made, else generated and written."""
    stored = read_shard(shard_file(directory, RESPONSES, index), plan, RESPONSES)
    if stored is not None:
        return Sequences(stored["tokens"], stored["lengths"], stored["prompt_lengths"])
    temperature_pass, part = divmod(index, plan.shards_per_pass(len(prompts)))
    first = part * plan.prompts_per_shard
    started = time.perf_counter()
    sequences = response_shard(target, prompts[first:first + plan.prompts_per_shard], first, plan, eos, pad, vocab,
                               temperature_pass)
    write_shard(shard_file(directory, RESPONSES, index), sequences.tensors(), plan.fingerprint(RESPONSES))
    times.response_seconds += time.perf_counter() - started
    times.response_tokens += int((sequences.lengths - sequences.prompt_lengths).sum())
    return sequences


def build_shards(target: PreTrainedModel, prompts: list[list[int]], directory: Path, plan: ShardPlan,
                 eos: int | None, pad: int, vocab: int, shards: int,
                 on_shard: Callable[[int], None] | None = None, teacher: bool = True,
                 times: ShardTimes | None = None) -> list[Path]:
    """Make (or keep) the first ``shards`` response and teacher shards; the teacher shards' paths (without
    ``teacher``: only the response shards, and their paths). ``times`` adds up where this run's time went.

    Resumable: finished shards made by the same plan are kept; one made by another plan is refused.
    """
    times = times if times is not None else ShardTimes()
    available = plan.shards_per_pass(len(prompts)) * len(plan.temperatures)
    if shards > available:
        raise ValueError(f"{shards} shards need {shards * plan.prompts_per_shard} prompts over "
                         f"{len(plan.temperatures)} temperature passes; there are {len(prompts)} prompts "
                         f"({available} shards)")
    paths = []
    for index in tqdm(range(shards), desc="target data shards", unit="shard"):
        path = shard_file(directory, TEACHER if teacher else RESPONSES, index)
        if read_shard(path, plan, TEACHER if teacher else RESPONSES, tensors=False) is None:
            sequences = responses(target, prompts, directory, plan, index, eos, pad, vocab, times)
            if teacher:
                started = time.perf_counter()
                write_shard(path, teacher_shard(target, sequences, plan), plan.fingerprint(TEACHER))
                times.teacher_seconds += time.perf_counter() - started
                times.teacher_positions += int(sequences.lengths.sum())
            release_freed_memory()
        if on_shard is not None:
            on_shard(index)
        paths.append(path)
    return paths
