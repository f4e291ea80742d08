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
