"""Data-parallel collection under ``torchrun``: rank, world size, barriers (gloo on CPU, nccl on GPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """This process's place among the collection workers."""

    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def owns(self, shard_index: int) -> bool:
        """Shards are dealt round-robin: rank r writes shards r, r + size, r + 2·size, …"""
        return shard_index % self.size == self.rank

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()


def init_world() -> World:
    """Join the process group when launched by ``torchrun`` (``WORLD_SIZE`` > 1); else a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return World(rank=dist.get_rank(), size=dist.get_world_size())


def close_world(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def local_device(world: World) -> torch.device:
    """One GPU per local rank when there are GPUs, else the CPU."""
    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", world.rank)) % torch.cuda.device_count()
        return torch.device("cuda", index)
    return torch.device("cpu")
