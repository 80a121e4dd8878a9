"""``benchmarks/memory_table.py``: its parameter counts, its activation count against what autograd
keeps, and its per-GPU arithmetic."""

from __future__ import annotations

import pytest
import torch
from factories import benchmark_script

from priorattn.models import GPT, GPTConfig, preset
from priorattn.train.optim import prior_parameters


@pytest.fixture(scope="module")
def table():
    return benchmark_script("memory_table")


def test_counts_split_the_models_parameters(table):
    config = preset("tiny", prior="goat")
    model = GPT(config)
    c = table.counts(config)
    assert c.total == model.num_parameters()
    assert c.replicated == sum(p.numel() for p in prior_parameters(model)) > 0
    assert c.outer == model.embed.weight.numel() + model.norm.weight.numel()  # the head is tied
    assert c.outer + config.n_layers * c.block + c.replicated == c.total


def saved_bytes(model: GPT, tokens: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of the loss, parameters aside."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in parameters:
            kept[storage.data_ptr(), storage.nbytes()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens, targets=tokens)
    return sum(kept.values())


@pytest.mark.parametrize(
    "shape",
    [
        dict(d_model=64, n_heads=4),
        dict(d_model=64, n_heads=4, n_kv_heads=2, head_dim=24, mlp_hidden=96),  # every width its own
    ],
)
def test_activation_bytes_are_what_autograd_keeps(table, shape):
    config = GPTConfig(vocab_size=200, seq_len=40, n_layers=3, **shape)
    tokens = torch.randint(0, 200, (1, 40), generator=torch.Generator().manual_seed(0))
    kept = saved_bytes(GPT(config), tokens)
    assert abs(kept - table.activation_bytes(config, 40)) <= 16  # the loss's two scalars


def test_checkpointed_activations_keep_each_blocks_input_and_one_block(table):
    config = GPTConfig(vocab_size=100, seq_len=8, d_model=16, n_layers=3, n_heads=2, mlp_hidden=32)
    block = 6 * 16 + 4 * 16 + 4 * 32 + 2 + 2  # 290 elements per token
    outside = 3 * 16 + 100 + 1
    assert table.activation_bytes(config, 8) == 8 * (4 * (3 * block + outside) + 8)
    assert table.activation_bytes(config, 8, checkpointed=True) == 8 * (4 * (3 * 16 + block + outside) + 8)


def test_per_gpu_arithmetic(table):
    c = table.Counts(total=1000, replicated=10, outer=190, block=200)
    assert table.ddp_memory(c, 1) == table.Memory(4000, 4000, 8000)
    assert table.ddp_memory(c, 8) == table.Memory(4000, 8000, 8000)  # DDP's buckets copy the gradients
    # a share of 990 / 2 = 495 sharded, 10 whole; gathered: the outer group and two blocks
    assert table.fsdp_memory(c, 2) == table.Memory(4 * 505 + 4 * 590, 4 * (505 + 190 + 200), 8 * 505)
    assert table.fsdp_memory(c, 2, mixed_precision=True).parameters == 4 * 505 + 2 * 590
    assert table.sequences_that_fit(table.Memory(10, 20, 30), 25, capacity=160) == 4
    assert table.sequences_that_fit(table.Memory(100, 20, 30), 25, capacity=140) == 0
