"""``priorattn hf-extend``: extend a transformers model's context with a prior and fine-tuning."""

from __future__ import annotations

import argparse
from pathlib import Path

from .parsing import fail, int_at_least, positive_number, prior_specs


def hf_extend(args: argparse.Namespace) -> int:
    """Fine-tune a local transformers model with a prior at a longer length; save_pretrained to --out."""
    try:
        from ..hf.extend import extend
        from ..train import TrainConfig

        options = dict(steps=args.steps, batch_size=args.batch_size, lr=args.lr, prior_lr=args.prior_lr)
        options |= dict(warmup_steps=args.warmup, eval_sequences=args.eval_sequences, seed=args.seed)
        config = TrainConfig(data=args.data, seq_len=args.seq_len, **options)
        result = extend(
            args.model,
            args.out,
            config,
            prior=args.prior,
            remove_rope=args.remove_rope,
            progress=not args.quiet,
            shared_prior=args.shared_prior,
            prior_init=args.prior_init,
        )
    except (ValueError, FileNotFoundError, FileExistsError, ModuleNotFoundError) as e:
        fail(args, e)
    print(
        f"val loss at {result['seq_len']}: {result['val_loss_before']:.4f} before, "
        f"{result['val_loss_after']:.4f} after {result['steps']} steps "
        f"({result['seconds_per_step']:.2f} s/step); "
        f"model in {args.out} (priorattn.hf.from_pretrained)"
    )
    return 0


def add_hf_extend_parser(commands) -> None:
    from ..models.gpt import PRIOR_INITS
    from ..train.config import TrainConfig

    defaults = TrainConfig()
    p = commands.add_parser(
        "hf-extend",
        help="extend a transformers model's context: add a prior and fine-tune at a longer length",
        description=(
            "Load a local transformers causal LM (a save_pretrained directory; a directory or .json file "
            "with only a config builds a small random model, for a demo; nothing downloads), add a prior "
            "to every attention layer, fine-tune the model at --seq-len on --data with packed documents, "
            "and write it to --out with save_pretrained (load it with priorattn.hf.from_pretrained). "
            "Needs pip install 'priorattn[hf]'; see docs/hf.md."
        ),
    )
    p.add_argument("--model", required=True, help="model directory or config.json (PATH_OR_CONFIG)")
    p.add_argument("--prior", default="ggd", help=f"{prior_specs()} (ggd)")
    p.add_argument("--prior-init", choices=PRIOR_INITS, default="uniform", help="(uniform)")
    p.add_argument("--shared-prior", action="store_true", help="one prior for all layers (one per layer)")
    p.add_argument("--remove-rope", action="store_true", help="drop the model's RoPE: NoPE + prior")
    p.add_argument("--seq-len", type=int_at_least(1), required=True, help="the longer training length")
    p.add_argument("--steps", type=int_at_least(1), default=100, help="optimizer steps (100)")
    p.add_argument("--data", help="text folder, glob, file or hf:PATH[:COLUMN] (embedded Shakespeare)")
    p.add_argument("--batch-size", type=int_at_least(1), default=4, help="sequences per step (4)")
    p.add_argument("--lr", type=positive_number, default=1e-4, help="peak learning rate (1e-4)")
    p.add_argument("--prior-lr", type=positive_number, default=1e-2, help="prior parameters' rate (1e-2)")
    p.add_argument("--warmup", type=int_at_least(0), default=10, help="warmup steps (10)")
    p.add_argument(
        "--eval-sequences",
        type=int_at_least(1),
        default=defaults.eval_sequences,
        help=f"validation windows before and after ({defaults.eval_sequences})",
    )
    p.add_argument("--seed", type=int_at_least(0), default=0, help="(0)")
    p.add_argument("--out", type=Path, required=True, help="output model directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=hf_extend, parser=p)
