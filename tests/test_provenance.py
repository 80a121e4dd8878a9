"""What a study's results.json records about where it ran: the commit, the CPU, torch."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from priorattn.provenance import cpu_model, environment, git_commit

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_the_environment_names_torch_the_cpu_and_the_extra_fields():
    found = environment(threads=3)
    assert found["torch"] == torch.__version__ and found["threads"] == 3
    assert found["cpu"] == cpu_model() and found["cpu"]
    assert set(found) >= {"python", "cuda", "commit"}


@needs_git
def test_the_commit_is_heads_and_says_whether_the_tree_changed(tmp_path):
    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git("rev-parse", "HEAD").stdout.strip()
    assert git_commit(tmp_path) == dict(hash=head, dirty=False)
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == dict(hash=head, dirty=True)


def test_outside_a_git_checkout_there_is_no_commit(tmp_path):
    assert git_commit(tmp_path) is None
