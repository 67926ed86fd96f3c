"""Response shards packed into one small file that can ship with the project, and unpacked into shards again.

Generating the target's responses is the slow part of a feature draft's data (about an hour on two cores for 1M
response tokens); the teacher pass and training need a machine's own run anyway. A pack keeps only the response
ids (``uint16`` where the vocabulary fits) and their lengths; the prompts are re-encoded from the shipped prompt
files on unpacking and must give the same lengths and the same sha256 of their ids, so a pack never pairs
responses with other prompts. The pack's own sha256 is checked against the one recorded beside it
(``<pack>.json``, written with it). Every file is written whole and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from decode.artifacts.gguf import file_sha256
from runtime.install import write_json

from .shards import RESPONSES, Sequences, ShardMismatchError, ShardPlan, read_shard, shard_file, write_shard


class PackError(ValueError):
    """A pack that does not match its record, its plan or its prompts; the message names the fix."""


def record_path(pack: Path) -> Path:
    """Where a pack's record (its sha256 and what it holds) lives."""
    return pack.with_name(pack.name + ".json")


def prompts_sha256(sequences: list[Sequences]) -> str:
    """The sha256 of every sequence's prompt ids, in order (what the pack's responses answer)."""
    digest = hashlib.sha256()
    for shard in sequences:
        for prompt, _ in shard.split():
            digest.update(json.dumps(prompt).encode())
    return digest.hexdigest()


def pack_responses(directory: Path, plan: ShardPlan, shards: int, pack: Path) -> dict:
    """Pack response shards ``0 .. shards − 1`` of ``directory`` into ``pack``; its record."""
    stored = []
    for index in range(shards):
        tensors = read_shard(shard_file(directory, RESPONSES, index), plan, RESPONSES)
        if tensors is None:
            raise PackError(f"response shard {index} is missing in {directory}; generate it first (--stage responses)")
        stored.append(Sequences(tensors["tokens"], tensors["lengths"], tensors["prompt_lengths"]))
    responses = [torch.tensor(r, dtype=torch.int64) for shard in stored for _, r in shard.split()]
    ids = torch.cat(responses) if responses else torch.empty(0, dtype=torch.int64)
    small = (int(ids.max()) if len(ids) else 0) < 2 ** 16
    tensors = {
        "response_ids": ids.to(torch.uint16 if small else torch.int32),  # [N] every response, in order
        "response_lengths": torch.tensor([len(r) for r in responses], dtype=torch.int32),  # [S]
        "prompt_lengths": torch.cat([shard.prompt_lengths for shard in stored]),  # [S]
        "shard_sizes": torch.tensor([len(shard.lengths) for shard in stored], dtype=torch.int32),  # [shards]
    }
    metadata = {**plan.fingerprint(RESPONSES), "prompts_sha256": prompts_sha256(stored)}
    write_shard(pack, tensors, metadata)
    record = {"file": pack.name, "sha256": file_sha256(pack), "shards": shards, "sequences": len(responses),
              "response_tokens": len(ids), "metadata": metadata}
    write_json(record_path(pack), record)
    return record


def read_pack(pack: Path, plan: ShardPlan) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The pack's tensors and metadata, checked against its record's sha256 and against ``plan``."""
    record_file = record_path(pack)
    if not pack.is_file() or not record_file.is_file():
        raise PackError(f"{pack} or its record {record_file.name} is missing; pack the shards first (--stage pack)")
    record = json.loads(record_file.read_text())
    if file_sha256(pack) != record["sha256"]:
        raise PackError(f"{pack} does not match the sha256 in {record_file.name}; fetch the file again")
    with safe_open(str(pack), "pt") as handle:
        metadata = handle.metadata() or {}
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (a safetensors handle, not a dict)
    if {k: metadata.get(k) for k in ("kind", "plan")} != plan.fingerprint(RESPONSES):
        raise PackError(f"{pack} was made by another configuration ({metadata.get('plan')}); "
                        "build with its options or generate the responses again")
    return tensors, metadata


def unpack_responses(pack: Path, plan: ShardPlan, prompts: list[list[int]], directory: Path) -> list[Path]:
    """Write the pack's response shards into ``directory`` (those already there are kept); their paths.

    ``prompts``: the run's encoded prompts, as :func:`model_build.feature_draft.shards.build_shards` takes them.
    """
    tensors, metadata = read_pack(pack, plan)
    per_pass = plan.shards_per_pass(len(prompts))
    ids = tensors["response_ids"].to(torch.int64)
    at = sequence = 0
    shards, paths = [], []
    for index, size in enumerate(tensors["shard_sizes"].tolist()):
        first = (index % per_pass) * plan.prompts_per_shard
        chunk = prompts[first:first + size]
        pairs = []
        for offset, prompt in enumerate(chunk):
            length = int(tensors["response_lengths"][sequence + offset])
            pairs.append((prompt, ids[at:at + length].tolist()))
            at += length
        if [len(p) for p in chunk] != tensors["prompt_lengths"][sequence:sequence + size].tolist():
            raise PackError(f"{pack} answers other prompts than this run's (shard {index}); "
                            "use the prompt options it was made with")
        sequence += size
        shards.append(Sequences.of(pairs))
    if prompts_sha256(shards) != metadata["prompts_sha256"]:
        raise PackError(f"{pack} answers other prompts than this run's; use the prompt options it was made with")
    for index, sequences in enumerate(shards):
        path = shard_file(directory, RESPONSES, index)
        try:
            kept = read_shard(path, plan, RESPONSES)
        except ShardMismatchError as error:
            raise PackError(str(error)) from error
        if kept is None:
            write_shard(path, sequences.tensors(), plan.fingerprint(RESPONSES))
        paths.append(path)
    return paths
