"""``benchmarks/device_check.py``: without a GPU, one line and a dry run of every part; its stand-ins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from factories import benchmark_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "device_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the check measures, for minutes")
def test_without_a_gpu_it_says_so_in_one_line_after_a_dry_run_of_every_part(tmp_path):
    # as a user runs it: without the Triton interpreter the suite sets (tests/conftest.py)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1 and done.stdout.startswith("no CUDA GPU here")
    report = json.loads((tmp_path / "device_check.json").read_text())
    parts = report["parts"]
    assert report["dry_run"] and list(parts) == ["attention", "training", "pytest"]
    assert not any("error" in part for part in parts.values()), parts
    assert parts["pytest"]["collected"] > 0 and "collected" in parts["pytest"]["summary"]
    cells = parts["attention"]["cells"]
    assert all("error" not in cell for cell in cells), [cell for cell in cells if "error" in cell]
    measured = {(c["prior"], c["route"]) for c in cells if "ms" in c}
    assert (
        ("SDPA (flash)", "plain") in measured
        and ("GGD", "auto") in measured
        and ("GOAT", "sdpa") in measured
        and (benchmark_script("device_check").FOX, "sdpa") in measured
    )
    assert {c["auto_takes"] for c in cells if c["route"] == "auto"} == {"sdpa", "memeff"}
    assert all(c["skipped"].startswith("FlexAttention has no backward") for c in cells if "ms" not in c)
    assert [(c["compiled"], c["policy"], "tokens_per_s" in c) for c in parts["training"]["cells"]] == [
        (False, "auto", True),
        (True, "auto", True),
    ]
    tables = (tmp_path / "device_check.md").read_text()
    assert "## Attention: forward + backward" in tables and "## Training throughput" in tables


def test_stand_ins_serve_the_librarys_imports_only():
    """A package the library imports but a GPU image lacks imports as a stand-in for priorattn's
    modules, fails where it is used, and stays missing for everyone else."""
    script = benchmark_script("device_check")
    finder = script.StandIns(["not_installed_here"])
    sys.meta_path.insert(0, finder)
    try:
        scope = {"__name__": "priorattn.some_module"}
        exec("from not_installed_here.sub import Thing, Error", scope)
        with pytest.raises(ModuleNotFoundError, match="not_installed_here.sub.Thing is not installed"):
            scope["Thing"]()
        assert issubclass(scope["Error"], Exception)  # usable in an except clause
        with pytest.raises(ModuleNotFoundError):
            exec("import not_installed_here.other", {"__name__": "torch.something"})
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n.startswith("not_installed_here")]:
            del sys.modules[name]


def test_the_fused_training_policy_takes_triton_at_every_length_while_it_runs():
    """``--train-policies fused``: ``auto`` takes the fused kernels where it would take FlexAttention
    at any length (``TRITON_MIN_KEYS`` 0) inside the cell, and goes back to its own threshold after."""
    from priorattn.functional import api

    script = benchmark_script("device_check")
    before = api.TRITON_MIN_KEYS
    with script.route_policy("fused"):
        assert api.TRITON_MIN_KEYS == 0
    with script.route_policy("auto"):
        assert api.TRITON_MIN_KEYS == before
    assert api.TRITON_MIN_KEYS == before
