"""Where a result came from: what a study's ``results.json`` records so that two runs' numbers can be
told apart or traced (the same code, torch build, CPU and thread count give the same bits;
docs/reproducibility.md)."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent


def environment(**extra) -> dict:
    """``torch``, ``python``, ``cpu`` (the processor's model name), ``commit`` (the git commit of the
    priorattn source and whether it has uncommitted changes, ``None`` outside a git checkout), and
    ``extra`` (a study's threads and workers)."""
    return (
        dict(
            torch=torch.__version__,
            python=platform.python_version(),
            cpu=cpu_model(),
            cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            commit=git_commit(SOURCE),
        )
        | extra
    )


def cpu_model() -> str:
    """The CPU's model name as the OS reports it (``/proc/cpuinfo`` on Linux), else the platform's
    processor or machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine()


def git_commit(directory: Path) -> dict | None:
    """``{"hash", "dirty"}`` of the git checkout holding ``directory``; ``None`` where it is none (an
    installed wheel) or git is missing."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".").stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return None
    return dict(hash=head.stdout.strip(), dirty=dirty)
