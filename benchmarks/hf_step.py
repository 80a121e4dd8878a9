"""A transformers model's fine-tuning step with a prior against the same step with its own attention.

A small Llama (d_model 256, 4 layers, 8 query and 2 key/value heads of width 32, byte vocabulary)
takes the fine-tuning step of ``python -m priorattn hf-extend`` (:func:`priorattn.hf.extend.summed_loss`:
packed windows of the embedded corpus with per-document positions, forward, cross-entropy,
backward; then AdamW over the library's parameter groups) with

- ``sdpa``: the model's own attention (``attn_implementation="sdpa"``), the baseline;
- the ``"priorattn"`` attention of :func:`priorattn.hf.add_prior` with a uniform prior (the same
  attention, through ``priorattn.attention``), GGD (BAM, RoPE kept), and GOAT and ALiBi with RoPE
  removed (NoPE + prior).

The configurations are timed round-robin in one process (the order rotating each round); the table
gives each one's median step time and its ratio to ``sdpa`` (time / sdpa's time).

    python benchmarks/hf_step.py                 # seq_len 1024, batch 2, 5 rounds of 2 steps
    python benchmarks/hf_step.py --quick         # seq_len 256, 3 rounds of 1 step
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from train_throughput import round_robin  # this script's directory is on sys.path
from transformers import AutoModelForCausalLM, LlamaConfig

import priorattn.hf as phf
from priorattn.data import Batches, prepare_data
from priorattn.data.packing import IGNORE_INDEX
from priorattn.hf.extend import summed_loss
from priorattn.train import TrainConfig
from priorattn.train.optim import build_optimizer

MODEL = dict(
    vocab_size=256,
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
)
#: name -> add_prior arguments; None keeps the model's own attention.
CONFIGURATIONS = {
    "sdpa (the model's own)": None,
    "priorattn, uniform, RoPE": dict(prior="uniform"),
    "priorattn, GGD (BAM), RoPE": dict(prior="ggd"),
    "priorattn, GOAT, no RoPE": dict(prior="goat", remove_rope=True),
    "priorattn, ALiBi, no RoPE": dict(prior="alibi", remove_rope=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="training steps per timed sample")
    parser.add_argument("--quick", action="store_true", help="seq_len 256, 3 rounds of 1 step")
    args = parser.parse_args()
    if args.quick:
        args.seq_len, args.rounds, args.steps = 256, 3, 1

    with tempfile.TemporaryDirectory() as run_dir:
        data = prepare_data(None, tokenizer="byte", seq_len=args.seq_len, run_dir=Path(run_dir))
    batches = Batches(data.train, args.batch_size, seed=0)
    config = TrainConfig(batch_size=args.batch_size, seq_len=args.seq_len)
    steps = {name: training_step(options, config, batches) for name, options in CONFIGURATIONS.items()}
    samples = round_robin(steps, args.rounds, args.steps)
    medians = {name: statistics.median(times) for name, times in samples.items()}
    base = medians[next(iter(medians))]
    print(
        f"\nLlama {MODEL['num_hidden_layers']} layers x d_model {MODEL['hidden_size']}, batch "
        f"{args.batch_size} x {args.seq_len} tokens, fp32, {torch.get_num_threads()} threads, median of "
        f"{args.rounds} samples x {args.steps} steps\n"
    )
    print("| attention | ms / step | time / sdpa's |")
    print("|---|---:|---:|")
    for name, median in medians.items():
        print(f"| {name} | {1e3 * median:.0f} | {median / base:.2f}x |")


def training_step(options: dict | None, config: TrainConfig, batches: Batches):
    """A closure running one optimizer step of a fresh model on the next batch."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**MODEL), attn_implementation="sdpa").train()
    if options is not None:
        phf.add_prior(model, seq_len=config.seq_len, **options)
    optimizer = build_optimizer(model, config)
    counter = iter(range(10**9))

    def step():
        tokens, targets, doc_ids = batches.batch(next(counter))
        loss = summed_loss(model, tokens, targets, doc_ids) / (targets != IGNORE_INDEX).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


if __name__ == "__main__":
    main()
