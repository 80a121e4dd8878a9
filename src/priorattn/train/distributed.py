"""One process or many: the same training code runs plain or under ``torchrun`` (DDP or FSDP).

``torchrun`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; with more than one process the
process group uses gloo on CPU and nccl on GPUs. Collectives here are no-ops for one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class Process:
    """This process's place in the run and the device it trains on."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    grouped: bool = False  # whether this process joined a process group (and leaves it at the end)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        """The sum of ``t`` over all processes, on ``t``'s device (nccl reduces on the GPU)."""
        if not self.distributed:
            return t
        summed = t.to(self.device, copy=True)
        dist.all_reduce(summed)
        return summed.to(t.device)

    def all_gather(self, t: Tensor) -> list[Tensor]:
        """``t`` from every process in rank order (same shape everywhere), on ``t``'s device."""
        if not self.distributed:
            return [t]
        out = [torch.empty_like(t, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(out, t.to(self.device))
        return [x.to(t.device) for x in out]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def start_process(group_alone: bool = False) -> Process:
    """Join the ``torchrun`` process group if there is one; pick the device. ``group_alone``: a
    process started without ``torchrun`` makes a group of its own (FSDP shards over a group, of one
    process too)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if world_size == 1 and not group_alone:
        return Process(device=device)
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(device)
        backend = "nccl" if cuda else "gloo"
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend)
        else:  # no torchrun: no rendezvous address either
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return Process(dist.get_rank(), dist.get_world_size(), device, grouped=True)


def end_process(process: Process) -> None:
    if process.grouped and dist.is_initialized():
        dist.destroy_process_group()
