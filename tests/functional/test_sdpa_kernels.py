"""The mask-free bottom-right causal kernels behind chunked SDPA calls, against a dense softmax:
the CPU flash kernel and the public-operator one that other devices use."""

from __future__ import annotations

import pytest
import torch

from priorattn.functional.sdpa import LowerRightCausal, lower_right_kernel, public_lower_right_causal


def dense_lower_right(q, k, v):
    Lq, Lk = q.shape[2], k.shape[2]
    visible = torch.arange(Lk)[None, :] <= torch.arange(Lk - Lq, Lk)[:, None]
    return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~visible, -torch.inf), -1) @ v


@pytest.mark.parametrize("kernel", [LowerRightCausal.apply, public_lower_right_causal], ids=["cpu", "public"])
@pytest.mark.parametrize("Lq, Lk, Dk, Dv", [(5, 12, 8, 6), (7, 20, 6, 8), (3, 3, 8, 8), (1, 9, 4, 4)])
def test_lower_right_causal_matches_dense_softmax_and_gradcheck(kernel, Lq, Lk, Dk, Dv):
    gen = torch.Generator().manual_seed(Lq + Lk)
    q = torch.randn(2, 3, Lq, Dk, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, Lk, Dk, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, Lk, Dv, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(kernel(q, k, v), dense_lower_right(q, k, v), atol=1e-12)
    assert torch.autograd.gradcheck(kernel, (q, k, v))


def test_the_cpu_flash_kernel_runs_only_on_the_cpu():
    assert lower_right_kernel(torch.device("cpu")) == LowerRightCausal.apply
    assert lower_right_kernel(torch.device("cuda")) is public_lower_right_causal
    assert lower_right_kernel(torch.device("meta")) is public_lower_right_causal


def test_importing_the_library_leaves_torch_dynamo_unloaded():
    """The public bottom-right kernel's torch module pulls in torch._dynamo and sympy (about a second
    and 70 MB); only non-CPU devices use it, so it is imported there, not with the library."""
    import subprocess
    import sys

    code = "import sys, priorattn, priorattn.cli; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
