"""``priorattn hf-extend``: extend a transformers model's context with a prior and fine-tuning. Its
flags are the fields of :class:`~priorattn.hf.extend.AddedPrior` and those of
:class:`~priorattn.hf.extend.ExtendConfig` that ``extend`` reads (:mod:`priorattn.cli.configs`),
written as ``train`` writes the same fields."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .configs import Flag, add_config_flags, given
from .parsing import fail, positive_number, prior_specs
from .train import TRAIN_FLAGS


def hf_extend(args: argparse.Namespace) -> int:
    """Fine-tune a local transformers model with a prior at a longer length; save_pretrained to --out."""
    try:
        from ..hf.extend import AddedPrior, ExtendConfig, extend

        config = ExtendConfig(**given(args, ExtendConfig))
        prior = AddedPrior(**given(args, AddedPrior))
        result = extend(args.model, args.out, config, progress=not args.quiet, **dataclasses.asdict(prior))
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
    from ..hf.extend import EXTEND_FIELDS, AddedPrior, ExtendConfig
    from ..models.gpt import PRIOR_INITS

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
    prior_flags = dict(
        prior=Flag(help=f"a prior spec: {prior_specs()} ({{default}})"),
        prior_init=Flag(choices=PRIOR_INITS),
    )
    add_config_flags({"": p}, AddedPrior, "", prior_flags)
    # train's flags of the same fields, in one group, with the learning rates checked here
    flags = {name: dataclasses.replace(TRAIN_FLAGS.get(name, Flag()), group=None) for name in EXTEND_FIELDS}
    flags |= dict(lr=Flag(type=positive_number), prior_lr=Flag(type=positive_number))
    flags["seq_len"] = dataclasses.replace(flags["seq_len"], required=True)
    skip = {field.name for field in dataclasses.fields(ExtendConfig)} - set(EXTEND_FIELDS)
    add_config_flags({"": p}, ExtendConfig, "", flags, skip=skip)
    p.add_argument("--out", type=Path, required=True, help="output model directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=hf_extend, parser=p)
