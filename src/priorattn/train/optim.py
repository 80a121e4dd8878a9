"""Optimizer and learning-rate schedule: three parameter groups, warmup then cosine to a floor; the
optimizer step every training loop takes (:func:`optimizer_step`)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..priors import Prior
from ..ssmax import SSMax
from .config import TrainConfig


def prior_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of every :class:`Prior` and :class:`SSMax` inside ``model``, each once (frozen
    ones included); ``model`` may be any module, the library's GPT or one's own."""
    modules = [m for m in model.modules() if isinstance(m, Prior | SSMax)]
    return list(dict.fromkeys(p for m in modules for p in m.parameters()))


def param_groups(model: nn.Module, config: TrainConfig) -> list[dict]:
    """Three groups: matrices with weight decay, norm weights and biases without, and the priors.

    Prior and SSMax parameters (found as submodules of any ``model``) get their own group with
    ``prior_lr`` and no weight decay: decay would pull a GGD or GOAT prior back towards its uniform
    start (the BAM code keeps them apart). Frozen parameters (e.g. GGD's ``mu`` unless trained) are
    left out. Groups with no parameters are dropped.
    """
    prior = {id(p) for p in prior_parameters(model)}
    decay, no_decay, priors = [], [], []
    for p in dict.fromkeys(model.parameters()):  # a tied head is one parameter
        if not p.requires_grad:
            continue
        if id(p) in prior:
            priors.append(p)
        elif p.dim() >= 2:
            decay.append(p)
        else:  # RMSNorm weights and any bias
            no_decay.append(p)
    groups = [
        dict(name="decay", params=decay, weight_decay=config.weight_decay, lr=config.lr),
        dict(name="no_decay", params=no_decay, weight_decay=0.0, lr=config.lr),
        dict(name="prior", params=priors, weight_decay=0.0, lr=config.prior_lr or config.lr),
    ]
    return [group for group in groups if group["params"]]


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW, or RAdam with decoupled weight decay (seed 003 App. C), over :func:`param_groups`."""
    groups = param_groups(model, config)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, betas=config.betas)
    return torch.optim.RAdam(groups, betas=config.betas, decoupled_weight_decay=True)


def lr_factor(step: int, config: TrainConfig) -> float:
    """Multiplier of each group's base lr at optimizer ``step`` (0-based).

    Linear warmup to 1 over ``warmup_steps``, then a half cosine down to ``min_lr_ratio`` at
    ``steps``; the floor holds after that.
    """
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    decay_steps = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / decay_steps)
    floor = config.min_lr_ratio
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config))


def clip_gradients(model: nn.Module, max_norm: float | None) -> float:
    """Clip the global gradient norm to ``max_norm`` (if given); the norm before clipping.

    Under FSDP the norm is that of the whole gradient: the sharded gradients' norm over all
    processes (a DTensor's) with the norm of the ones every process holds whole (priors, SSMax)."""
    params = [p for p in model.parameters() if p.grad is not None]
    sharded = [p for p in params if isinstance(p.grad, DTensor)]
    whole = [p for p in params if not isinstance(p.grad, DTensor)]
    norm = nn.utils.get_total_norm([p.grad for p in whole])
    if sharded:
        sharded_norm = nn.utils.get_total_norm([p.grad for p in sharded]).full_tensor()
        norm = torch.hypot(sharded_norm, norm.to(sharded_norm.device))
    if max_norm is not None:
        for group in (sharded, whole):  # one foreach kernel takes DTensors or plain tensors, not both
            nn.utils.clip_grads_with_norm_(group, max_norm, norm)
    return float(norm)


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    grad_clip: float | None,
) -> float:
    """Apply the gradients that the backward passes left in ``model``; their norm before clipping.

    In this order: the global gradient norm clipped to ``grad_clip`` (None: not clipped, the norm
    still measured), the optimizer's step, the gradients dropped (set to None, so the next step's
    backward starts from nothing), then ``scheduler``'s step, which sets the learning rate of the
    next optimizer step (None: the rate stays). Every training loop of the library (the language
    model's, the studies', ``hf extend``) updates its model here; the backward passes stay with the
    caller, since how a loss is formed and accumulated (micro-batches, processes, auxiliary losses)
    differs between them.
    """
    grad_norm = clip_gradients(model, grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return grad_norm
