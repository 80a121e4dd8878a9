"""Compile the triton route's kernels for a Hopper GPU (sm_90) without one: Triton lowers them to
PTX and its bundled ptxas assembles a cubin, so a kernel that Triton's interpreter runs but the GPU
compiler refuses fails here. Run as a script (Triton reads ``TRITON_INTERPRET`` when it is imported,
and the test suite sets it): ``python tests/functional/hopper_compile.py`` prints one line per kernel
and exits 1 on the first that does not compile."""

from __future__ import annotations

import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from priorattn.functional import triton_backward, triton_forward

#: Pointer arguments by name (bfloat16 q, k, v and their gradients; float32 prior terms and sums).
POINTERS = {
    **dict.fromkeys(("Q", "K", "V", "QL", "KL", "O", "DO", "DQ", "DK", "DV_OUT", "DQL", "DKL"), "*bf16"),
    **dict.fromkeys(
        ("LSE", "DELTA_ROWS", "DU", "DSLOPE", "DTABLE", "DF", "U", "U_LO", "SLOPE", "TABLE")
        + ("LAG_SCALE", "ROW_SCALE", "GRID", "DGRID", "DLAG_SCALE", "DROW_SCALE"),
        "*fp32",
    ),
    "F": "*fp32",
    "Q_DOC": "*i32",
    "K_DOC": "*i32",
    "PAD": "*i8",
}
TERMS = ("HAS_LANES", "HAS_KEY_BIAS", "HAS_LO", "HAS_SLOPE", "HAS_TABLE", "HAS_ROW_FACTOR", "HAS_GRID")
MASKS = ("CAUSAL", "HAS_WINDOW", "HAS_DOCS", "HAS_PADDING", "ALWAYS_MASK")
#: Every prior term with the causal mask alone (whole tiles unmasked), FIRE's grid (a term of
#: its own: FIRE is neither a fold nor a lag table), and every mask.
VARIANTS = {
    "every term but a grid, causal": dict.fromkeys(TERMS, True)
    | dict.fromkeys(MASKS, False)
    | dict(CAUSAL=True, HAS_GRID=False),
    "FIRE's grid, a row factor, documents": dict.fromkeys(TERMS, False)
    | dict.fromkeys(MASKS, False)
    | dict(HAS_GRID=True, HAS_ROW_FACTOR=True, CAUSAL=True, HAS_DOCS=True, ALWAYS_MASK=True),
    "every mask, a lag table": dict.fromkeys(TERMS, False)
    | dict.fromkeys(MASKS, True)
    | dict(HAS_TABLE=True),
}
GRID_CELLS = 1024  # the triton route's


def compile_for_hopper(kernel, flags: dict) -> int:
    """Compile ``kernel`` with constexpr ``flags``; the bytes of shared memory it takes."""
    signature, constants = {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in flags:
            signature[name], constants[(index,)] = "constexpr", flags[name]
        else:
            signature[name] = POINTERS.get(name, "i32")
    compiled = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32))
    return compiled.metadata.shared


def builds() -> list[tuple[str, object, dict]]:
    """``(label, kernel, constexpr flags)`` of every kernel in every variant, and the rows' delta."""
    out = []
    for variant, terms in VARIANTS.items():
        flags = dict(terms, BLOCK_D=64, BLOCK_DV=64, BLOCK_P=16, ACC=tl.float32, PRECISION="tf32")
        flags["GRID_CELLS"] = GRID_CELLS if terms["HAS_GRID"] else 1
        kernels = {
            "forward_kernel": dict(BLOCK_M=128, BLOCK_N=64),
            "key_block_kernel": dict(
                BLOCK_M=64,
                BLOCK_N=64,
                KEY_BIAS_GRAD=terms["HAS_KEY_BIAS"],
                SLOPE_GRAD=terms["HAS_SLOPE"],
                TABLE_GRAD=terms["HAS_TABLE"],
                GRID_GRAD=terms["HAS_GRID"],
                LAG_SCALE_GRAD=terms["HAS_GRID"],
            ),
            "query_block_kernel": dict(
                BLOCK_M=128,
                BLOCK_N=64,
                ROW_FACTOR_GRAD=terms["HAS_ROW_FACTOR"],
                KEY_BIAS_GRAD=terms["HAS_KEY_BIAS"],
                ROW_SCALE_GRAD=terms["HAS_GRID"],
            ),
        }
        for name, blocks in kernels.items():
            kernel = getattr(triton_forward if name == "forward_kernel" else triton_backward, name)
            out.append((f"{variant}: {name}", kernel, flags | blocks))
    delta = dict(BLOCK_M=128, BLOCK_DV=64, ACC=tl.float32)
    return [*out, ("delta_rows_kernel", triton_backward.delta_rows_kernel, delta)]


def main() -> int:
    for label, kernel, flags in builds():
        try:
            shared = compile_for_hopper(kernel, flags)
        except Exception as e:  # the compiler's own message says where
            print(f"{label} does not compile for sm_90: {type(e).__name__}: {e}")
            return 1
        print(f"{label} compiles for sm_90, {shared} bytes of shared memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
