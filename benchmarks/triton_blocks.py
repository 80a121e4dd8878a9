"""Tile sizes of the ``triton`` route on one CUDA GPU: forward + backward of a folding prior with a
learned slope (GOAT) and a lag table (GGD) per candidate :class:`~priorattn.functional.triton_route.Blocks`,
against flash SDPA measured beside them (bfloat16, causal, B 1, H 8, head width 64).

    PYTHONPATH=src python benchmarks/triton_blocks.py --lengths 4096 16384
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import benchmark

import priorattn
from priorattn.functional import triton_route
from priorattn.functional.triton_op import Blocks
from priorattn.priors import GGD, GOAT

CANDIDATES = (
    Blocks(128, 64, 64, 64, 4, 2),
    Blocks(128, 64, 64, 64, 8, 3),
    Blocks(64, 64, 64, 64, 4, 3),
    Blocks(128, 32, 32, 32, 4, 3),
)


def fwd_bwd(attend, L: int, Dk: int, H: int = 8, D: int = 64):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(1, H, L, Dk, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    v = torch.randn(1, H, L, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    grad = torch.randn_like(v)
    for t in (q, k, v):
        t.requires_grad_()

    def run():
        attend(q, k, v).backward(grad)

    return run


def median_ms(run) -> float:
    run()
    torch.cuda.synchronize()
    return benchmark.Timer("run()", globals=dict(run=run)).blocked_autorange(min_run_time=0.3).median * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    args = parser.parse_args()
    priors = {"GOAT": GOAT(8, 4).cuda(), "GGD": GGD(8, init="alibi").cuda()}

    def flash(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    for L in args.lengths:
        base = median_ms(fwd_bwd(flash, L, 64))
        print(f"L={L} flash {base:.3f} ms")
        for blocks in CANDIDATES:
            triton_route.BLOCKS["cuda"] = blocks
            row = []
            for name, prior in priors.items():
                Dk = 64 - (prior.fold_width or 0) if prior.can_fold(True) else 64
                try:
                    ms = median_ms(
                        fwd_bwd(
                            lambda q, k, v, p=prior: priorattn.attention(q, k, v, prior=p, backend="triton"),
                            L,
                            Dk,
                        )
                    )
                    row.append(f"{name} {ms / base:.2f}x")
                except Exception as e:  # a tile that does not fit shared memory
                    row.append(f"{name} failed: {type(e).__name__}: {str(e)[:120]}")
            print(f"  {blocks}: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()
