"""How the processes of a run share the model (``TrainConfig.parallel``): DDP replicates it, FSDP
shards it.

``"ddp"``: every process holds the whole model and DistributedDataParallel averages the gradients
(on one process, the plain model). ``"fsdp"``: FSDP2's ``fully_shard`` on each transformer block
and then on the whole model (the embedding, the final norm and the head form the outer group), so
each process keeps ``1 / world_size`` of every sharded parameter, its gradient and its optimizer
state, and gathers a block's parameters just before the block runs (forward and backward) and
frees them after it.

Prior and SSMax parameters are left out of the shards and stay whole on every process
(:func:`replicated_parameters`): they are few (576 for BAM's 120M model, seed 003 App. C), they
stay float32 under ``mixed_precision`` (GOAT's slope starts at 1e-13 per token), and the attention
routes call a prior through its methods (``fold``, ``log_prior``), which FSDP's forward hooks
would not see. Their gradients are averaged over the processes by one all-reduce after the
backward pass (:func:`average_replicated_gradients`), as DDP averages every gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from ..models import GPT
from .config import TrainConfig
from .distributed import Process
from .optim import prior_parameters


def wrap(model: GPT, config: TrainConfig, process: Process) -> nn.Module:
    """The module that trains ``model`` as ``config.parallel`` says, activations checkpointed per
    block if ``config.checkpoint_activations``: the model sharded in place (``"fsdp"``), wrapped
    in DDP (``"ddp"`` with several processes) or itself."""
    if config.checkpoint_activations:
        checkpoint_blocks(model)
    if config.parallel == "fsdp":
        return shard(model, process, config.mixed_precision)
    return DistributedDataParallel(model) if process.distributed else model


def checkpoint_blocks(model: GPT) -> None:
    """Each block's activations recomputed in the backward pass from the block's input, which is all
    the forward pass keeps (the wrapper forwards attribute reads and keeps the state dict's names)."""
    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block)


def shard(model: GPT, process: Process, mixed_precision: bool = False) -> GPT:
    """``model`` sharded in place over the process group: each block its own FSDP group, then the
    rest of the model; :func:`replicated_parameters` stay whole. ``mixed_precision``: the gathered
    parameters are bfloat16 and gradients are reduced in float32."""
    mesh = init_device_mesh(process.device.type, (process.world_size,))
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else MixedPrecisionPolicy()
    )
    whole = set(replicated_parameters(model))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, ignored_params=whole)
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=whole)
    return model


def replicated_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters FSDP leaves whole on every process: those of the priors and SSMax
    (:func:`~priorattn.train.optim.prior_parameters`), then any other 0-dimensional one (FSDP
    shards along a first dimension: a scalar head's global bandwidth), each once, in the same
    order on every process."""
    priors = prior_parameters(model)
    scalars = [p for p in model.parameters() if p.dim() == 0]
    return list(dict.fromkeys(priors + scalars))


def average_replicated_gradients(model: nn.Module, process: Process) -> None:
    """Under FSDP with several processes, the gradients of :func:`replicated_parameters` averaged
    over the processes in one all-reduce (FSDP averages the sharded ones itself); nothing otherwise."""
    if not (isinstance(model, FSDPModule) and process.distributed):
        return
    grads = [p.grad for p in replicated_parameters(model) if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.flatten() for g in grads]).to(process.device)
    dist.all_reduce(flat)
    flat /= process.world_size
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))
