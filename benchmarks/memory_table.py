"""Training memory per GPU of every preset under DDP and FSDP, from the configs alone.

For each preset (``priorattn.models.presets``) and number of GPUs, the bytes each GPU holds for

- **parameters**: float32. DDP: all ``N``. FSDP: its ``1 / W`` share of the sharded ones, the
  priors' and SSMax's whole (``priorattn.train.parallel.replicated_parameters``), and the gathered
  working set: the outer group (embedding, final norm, head), gathered for the whole step, and two
  blocks (the one computing and the next, prefetched), in bfloat16 with ``--mixed-precision``.
- **gradients**: float32. DDP: ``N``, and with several GPUs ``N`` more in the reducer's buckets
  (DDP copies the gradients into them for the all-reduce). FSDP: the ``1 / W`` share, the priors'
  whole, and the unsharded gradients of the outer group and of one block before they are reduced.
- **optimizer state**: AdamW's two float32 moments, ``2 N`` (FSDP: sharded as the parameters).
- **activations**: what the backward pass keeps of one sequence at the preset's length, float32,
  counted per token (with the attention of one flash-style kernel, no ``L x L`` map), for each
  block ``6 d + q + k + v + o + 4 h + H + 2`` elements (``q, o = H Dh``, ``k, v = Hkv Dh``, ``h``
  the SwiGLU width) and outside the blocks ``3 d + V + 1`` and the token id; with
  ``--checkpoint-activations`` each block keeps only its input (``d``) and one block's activations
  exist at a time, during its recomputation. These counts are those that
  ``torch.autograd.graph.saved_tensors_hooks`` sees in a NoPE model
  (``tests/test_memory_table.py``); a prior adds its few lanes (2% for the tiny GOAT).

Not counted: the framework (CUDA context, allocator caches, kernels' workspaces), transient buffers
of the backward pass (the logits' gradient, ``V`` per token) and the communication buffers.
``A6000 seqs`` is how many sequences of one micro-batch fit beside the rest in the 48 GB of an
NVIDIA A6000, the GPU BAM trained on (seed 003 App. C: up to 6 of them).

    python benchmarks/memory_table.py                              # every preset, 1, 2 and 8 GPUs
    python benchmarks/memory_table.py --checkpoint-activations --mixed-precision
    python benchmarks/memory_table.py --presets small bam-1.1b --gpus 2 6
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from priorattn.models import GPT, GPTConfig, preset
from priorattn.models.presets import PRESETS
from priorattn.train.parallel import replicated_parameters

FLOAT32 = 4
BFLOAT16 = 2
A6000 = 48 * 1024**3  # bytes


@dataclass(frozen=True)
class Counts:
    """Parameters of a model, each counted once: ``total``; ``replicated``, those FSDP leaves whole
    on every GPU; ``outer``, the sharded ones outside the blocks (the outer FSDP group); ``block``,
    the sharded ones of the largest block."""

    total: int
    replicated: int
    outer: int
    block: int


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU."""

    parameters: int
    gradients: int
    optimizer: int

    @property
    def states(self) -> int:
        return self.parameters + self.gradients + self.optimizer


def counts(config: GPTConfig) -> Counts:
    """The :class:`Counts` of the model ``config`` builds (on the meta device: nothing allocated)."""
    with torch.device("meta"):
        model = GPT(config)
    whole = {id(p) for p in replicated_parameters(model)}

    def sharded(module) -> int:
        return sum(p.numel() for p in dict.fromkeys(module.parameters()) if id(p) not in whole)

    blocks = [sharded(block) for block in model.blocks]
    replicated = sum(p.numel() for p in replicated_parameters(model))
    total = model.num_parameters()
    return Counts(total, replicated, total - replicated - sum(blocks), max(blocks))


def activation_bytes(config: GPTConfig, seq_len: int, checkpointed: bool = False) -> int:
    """Bytes the backward pass keeps of one float32 sequence of ``seq_len`` tokens (module docstring);
    ``checkpointed``: with activation checkpointing per block."""
    d, h, heads = config.d_model, config.mlp_hidden, config.n_heads
    head_dim = config.head_dim or d // heads
    kv_heads = config.n_kv_heads or heads
    attention = 2 * heads * head_dim + 2 * kv_heads * head_dim  # q, o and k, v
    block = 6 * d + attention + 4 * h + heads + 2
    outside = 3 * d + config.vocab_size + 1
    blocks = config.n_layers * d + block if checkpointed else config.n_layers * block
    return seq_len * (FLOAT32 * (blocks + outside) + 8)  # and each token's int64 id


def ddp_memory(c: Counts, gpus: int) -> Memory:
    """Every GPU holds the whole model, its gradients (twice with several GPUs: DDP's buckets) and
    the optimizer's moments."""
    buckets = c.total if gpus > 1 else 0
    return Memory(FLOAT32 * c.total, FLOAT32 * (c.total + buckets), 2 * FLOAT32 * c.total)


def fsdp_memory(c: Counts, gpus: int, mixed_precision: bool = False) -> Memory:
    """Each GPU holds ``1 / gpus`` of the sharded parameters, gradients and moments, the replicated
    ones whole, and the gathered working set (module docstring)."""
    share = (c.total - c.replicated) / gpus
    gathered = (BFLOAT16 if mixed_precision else FLOAT32) * (c.outer + 2 * c.block)
    return Memory(
        round(FLOAT32 * (share + c.replicated) + gathered),
        round(FLOAT32 * (share + c.replicated + c.outer + c.block)),
        round(2 * FLOAT32 * (share + c.replicated)),
    )


def sequences_that_fit(memory: Memory, per_sequence: int, capacity: int = A6000) -> int:
    """Sequences of a micro-batch whose activations fit in ``capacity`` beside ``memory``'s states."""
    return max(0, (capacity - memory.states) // per_sequence)


def gib(n: int) -> str:
    return f"{n / 1024**3:.2f}"


def table(presets: list[str], gpus: list[int], checkpointed: bool, mixed_precision: bool) -> str:
    """The Markdown table: a row per preset, parallelism and number of GPUs; sizes in GiB."""
    lines = [
        "| preset | params | seq len | parallel | GPUs | parameters | gradients | optimizer | "
        "activations / seq | states + 1 seq | A6000 seqs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in presets:
        config = preset(name)
        c = counts(config)
        per_sequence = activation_bytes(config, config.seq_len, checkpointed)
        rows = [("DDP", n, ddp_memory(c, n)) for n in gpus]
        rows += [("FSDP", n, fsdp_memory(c, n, mixed_precision)) for n in gpus if n > 1]
        for parallel, n, memory in rows:
            lines.append(
                f"| {name} | {c.total / 1e6:.1f}M | {config.seq_len} | {parallel} | {n} | "
                f"{gib(memory.parameters)} | {gib(memory.gradients)} | {gib(memory.optimizer)} | "
                f"{gib(per_sequence)} | {gib(memory.states + per_sequence)} | "
                f"{sequences_that_fit(memory, per_sequence)} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--gpus", nargs="+", type=int, default=[1, 2, 8])
    parser.add_argument("--checkpoint-activations", action="store_true")
    parser.add_argument("--mixed-precision", action="store_true", help="FSDP's gathered parameters in bf16")
    args = parser.parse_args()
    if any(n < 1 for n in args.gpus):
        parser.error(f"--gpus: each must be >= 1, got {args.gpus}")
    print(table(args.presets, args.gpus, args.checkpoint_activations, args.mixed_precision))


if __name__ == "__main__":
    main()
