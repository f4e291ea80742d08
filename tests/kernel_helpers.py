"""What the Triton tests compile the example kernels with (``precompile_executor.examples``)."""

from __future__ import annotations

ADD_GELU_OPTIONS = {"num_warps": 4, "num_stages": 3}
"""Compile options for ``add_gelu_kernel`` where a test pins them."""


def add_gelu_signature(dtype: str) -> dict[str, str]:
    """``examples.add_gelu_kernel``'s signature for ``precompile``/``ASTSource``: its three
    pointers to ``dtype`` (``"fp16"``), two ``i32`` sizes and the ``BLOCK_SIZE`` constexpr."""
    return {
        "x_ptr": f"*{dtype}",
        "bias_ptr": f"*{dtype}",
        "out_ptr": f"*{dtype}",
        "n_elements": "i32",
        "n_cols": "i32",
        "BLOCK_SIZE": "constexpr",
    }


DOUBLE_KERNEL_FILE = """
import triton
import triton.language as tl
from precompile_executor.triton import TensorSpec, launch


@triton.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((128, 4), (256, 4), (512, 8))],
    key=["n"],
)
@triton.jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


x = TensorSpec("fp32", (4096,))
PRECOMPILE_SPECS = {"double_kernel": [launch(x, x, 4096)]}
"""
"""A module for ``precompile-executor warm``: one autotuned kernel with three configs, listed
in ``PRECOMPILE_SPECS``."""
