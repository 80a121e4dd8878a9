"""A small real-text corpus and a small model for training tests; ``priorattn train`` run in other
processes, alone or under ``torchrun``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from priorattn.models import GPTConfig
from priorattn.priors import with_defaults

WORDS = (
    "the quick brown fox jumps over the lazy dog while seven wizards quietly hex a jovial bard "
    "and my love is as a fever longing still for that which longer nurseth the disease"
).split()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """Eight text files of about 6 kB each: word salad from a fixed vocabulary, seeded."""
    import random

    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for i in range(8):
        lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(90)]
        (root / f"doc{i}.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def alone():
    """A process group of this one process, as FSDP shards over (and left at the end)."""
    from priorattn.train.distributed import end_process, start_process

    process = start_process(group_alone=True)
    yield process
    end_process(process)


@pytest.fixture(scope="session", autouse=True)
def token_cache(tmp_path_factory):
    """Token stores go to a temporary cache, not ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PRIORATTN_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


def small_model(**overrides) -> GPTConfig:
    """A 2-layer model; a GOAT in its prior has 3 frequencies unless its spec says otherwise."""
    fields = dict(vocab_size=256, seq_len=32, d_model=32, n_layers=2, n_heads=2) | overrides
    fields["prior"] = with_defaults(fields.get("prior", "uniform"), goat=dict(num_freqs=3))
    return GPTConfig(**fields)


def train_until_killed(model, config, run_dir, monkeypatch, *, killed_in_step: int = 5) -> None:
    """Train into ``run_dir`` and die (KeyboardInterrupt) inside optimizer step ``killed_in_step``,
    as a crash would, leaving the run's checkpoints of the steps before."""
    from priorattn.train import loop, train

    real_step, calls = loop.train_step, []

    def dies(*args, **kwargs):
        calls.append(1)
        if len(calls) == killed_in_step:
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", dies)
    with pytest.raises(KeyboardInterrupt):
        train(model, config, run_dir, progress=False)
    monkeypatch.setattr(loop, "train_step", real_step)


def losses(run_dir) -> list[dict]:
    """metrics.jsonl without the wall-clock throughput."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records]


def command_env() -> dict:
    return os.environ | {"OMP_NUM_THREADS": "1"}


def run_command(args, env=None, processes: int = 1) -> subprocess.Popen:
    """``priorattn train *args`` in a new session (so that a SIGKILL to its group ends every process
    of it), under ``torchrun`` with ``processes`` processes when there are several."""
    launch = [sys.executable, "-m", "priorattn"]
    if processes > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
        launch += [str(processes), "-m", "priorattn"]
    return subprocess.Popen(
        [*launch, "train", *args],
        env=env or command_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finished(command: subprocess.Popen, timeout: float = 300) -> str:
    """Wait for ``command`` (a test fails rather than hangs), assert that it succeeded; its stderr."""
    try:
        _, err = command.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(command.pid, 9)
        raise
    assert command.returncode == 0, err
    return err
