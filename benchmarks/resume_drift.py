"""How far a run resumed on another number of processes leaves the uninterrupted run's losses.

A GOAT (the ``tiny`` preset at d_model 32, 2 layers, 2 heads, length 32, batch 4) trains 30 steps
under FSDP on 2 processes (``torchrun``), saving every 10; a copy of the run keeps only the step-10
checkpoint and resumes on 1 process. For each dropout rate: ``|train loss (resumed) - train loss
(uninterrupted)|`` at the first step after resuming and at most over steps 11-30, and the validation
loss's at step 30. Each process draws dropout from its own random stream (seeded by its rank, saved
in the checkpoint), so 2 -> 1 changes the streams and the masks; without dropout the two runs differ
only by how the batch is split.

    PYTHONPATH=src python benchmarks/resume_drift.py --out /tmp/resume-drift
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TRAIN = [
    *("--preset", "tiny", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "32"),
    *("--batch-size", "4", "--eval-sequences", "6", "--warmup", "1", "--log-every", "1", "--quiet"),
    *("--prior", "goat", "--steps", "30", "--save-every", "10", "--keep-checkpoints", "3"),
    *("--eval-every", "10", "--parallel", "fsdp"),
]


def train(args: list[str], processes: int) -> None:
    launch = [sys.executable, "-m", "priorattn"]
    if processes > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
        launch += [str(processes), "-m", "priorattn"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    subprocess.run([*launch, "train", *args], env=env, check=True, stdout=subprocess.DEVNULL)


def losses(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dropouts", type=float, nargs="+", default=[0.1, 0.0])
    args = parser.parse_args()
    print("| dropout | first step after resuming | most over steps 11-30 | val loss at 30 |")
    print("|---:|---:|---:|---:|")
    for dropout in args.dropouts:
        whole, resumed = args.out / f"two-{dropout}", args.out / f"one-{dropout}"
        train([*TRAIN, "--dropout", str(dropout), "--out", str(whole)], processes=2)
        shutil.copytree(whole, resumed)
        for later in resumed.glob("checkpoint-*"):  # all but step 10's
            if later.is_dir() and later.name != "checkpoint-00000010":
                shutil.rmtree(later)
            elif later.is_file() and not later.name.startswith("checkpoint-00000010."):
                later.unlink()
        train(["--out", str(resumed), "--resume", "--quiet"], processes=1)
        pairs = [(a, b) for a, b in zip(losses(whole), losses(resumed)) if a["step"] > 10]
        drift = [abs(a["train_loss"] - b["train_loss"]) for a, b in pairs]
        val = abs(pairs[-1][0]["val_loss"] - pairs[-1][1]["val_loss"])
        print(f"| {dropout:g} | {drift[0]:.1e} | {max(drift):.1e} | {val:.1e} |", flush=True)


if __name__ == "__main__":
    main()
