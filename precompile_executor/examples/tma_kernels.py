"""A TMA-descriptor GEMM-with-epilogue layer, autotuned the way Hopper kernel libraries write it.

``y = silu(x @ w.T + b)`` forward and its backward, in three ``@triton.autotune`` kernels whose
arguments are host ``triton.tools.tensor_descriptor.TensorDescriptor`` objects built with a dummy
block shape; each config's ``pre_hook`` sets the block shapes from the config's block sizes
before its launch — the pattern of Triton's persistent-matmul tutorial
(``python/tutorials/09-persistent-matmul.py``, ``matmul_tma_set_block_size_hook``) and of
Liger-Kernel's fused MLPs. The launch's signature is therefore the hook's
(``tensordesc<bf16[128, 64]>``), not the dummy's. ``benchmarks/triton_library_bench.py``
(``--libraries tma-gemm``) and ``tests/test_triton_tma.py`` use them.

* :data:`linear_silu_fwd_kernel` — ``z = x @ w.T + b`` (kept for the backward) and
  ``y = silu(z)``, grouped tile order;
* :data:`linear_silu_bwd_dx_kernel` — ``dx = dz @ w`` with ``dz = dy * silu'(z)`` computed as
  each tile is loaded;
* :data:`linear_silu_bwd_dw_kernel` — ``dw = dz.T @ x``, the same prologue.

Each is tuned over :func:`gemm_configs` (16 sm_90 configs). :class:`LinearSiLU` is the
``torch.autograd.Function`` (``db = dz.sum(0)`` in torch). Needs Triton 3.4 or later (host
descriptors, ``desc.load``/``desc.store``); the GPU box runs 3.6 and this machine 3.9, whose
``TensorDescriptor`` is the same.
"""

# Triton kernels take untyped arguments and Triton's decorators are untyped.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl


def _fwd_blocks(nargs: dict[str, Any]) -> None:
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["x_desc"].block_shape = [bm, bk]
    nargs["w_desc"].block_shape = [bn, bk]
    nargs["z_desc"].block_shape = [bm, bn]
    nargs["y_desc"].block_shape = [bm, bn]


def _dx_blocks(nargs: dict[str, Any]) -> None:
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["dy_desc"].block_shape = [bm, bk]
    nargs["z_desc"].block_shape = [bm, bk]
    nargs["w_desc"].block_shape = [bk, bn]
    nargs["dx_desc"].block_shape = [bm, bn]


def _dw_blocks(nargs: dict[str, Any]) -> None:
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["dy_desc"].block_shape = [bk, bm]
    nargs["z_desc"].block_shape = [bk, bm]
    nargs["x_desc"].block_shape = [bk, bn]
    nargs["dw_desc"].block_shape = [bm, bn]


TILES = ((64, 128), (128, 64), (128, 128), (128, 256))
"""The (BLOCK_M, BLOCK_N) output tiles tried; ``BLOCK_K`` (the reduction step) is 64."""


def gemm_configs(pre_hook: Callable[[dict[str, Any]], None]) -> list[triton.Config]:
    """Return 16 sm_90 configs (4 tiles × 2 stage counts × 2 warp counts) that set their block
    shapes with ``pre_hook``."""
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64},
            num_stages=stages,
            num_warps=warps,
            pre_hook=pre_hook,
        )
        for bm, bn in TILES
        for stages in (3, 4)
        for warps in (4, 8)
    ]


@triton.jit
def _tile(pid, rows, cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The (row, column) offsets of program ``pid``'s tile, in groups of 8 row tiles (better
    L2 reuse of the column operand's tiles)."""
    num_m = tl.cdiv(rows, BLOCK_M)
    num_n = tl.cdiv(cols, BLOCK_N)
    per_group = 8 * num_n
    first_m = (pid // per_group) * 8
    size_m = min(num_m - first_m, 8)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@triton.jit
def _dsilu(dy, z):
    s = tl.sigmoid(z)
    return dy * s * (1.0 + z * (1.0 - s))


@triton.jit
def _linear_silu_fwd(
    x_desc,
    w_desc,
    b_ptr,
    z_desc,
    y_desc,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    om, on = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        acc = tl.dot(x_desc.load([om, k]), w_desc.load([on, k]).T, acc)
    cols = on + tl.arange(0, BLOCK_N)
    z = acc + tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    z_desc.store([om, on], z.to(tl.bfloat16))
    y_desc.store([om, on], (z * tl.sigmoid(z)).to(tl.bfloat16))


@triton.jit
def _linear_silu_bwd_dx(
    dy_desc,
    z_desc,
    w_desc,
    dx_desc,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # dx[M, K] = dz[M, N] @ w[N, K]: tiles over (M, K), the reduction over N in BLOCK_K steps
    om, ok = _tile(tl.program_id(0), M, K, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for n in range(0, N, BLOCK_K):
        dy = dy_desc.load([om, n]).to(tl.float32)
        z = z_desc.load([om, n]).to(tl.float32)
        acc = tl.dot(_dsilu(dy, z).to(tl.bfloat16), w_desc.load([n, ok]), acc)
    dx_desc.store([om, ok], acc.to(tl.bfloat16))


@triton.jit
def _linear_silu_bwd_dw(
    dy_desc,
    z_desc,
    x_desc,
    dw_desc,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # dw[N, K] = dz.T[N, M] @ x[M, K]: tiles over (N, K), the reduction over M in BLOCK_K steps
    on, ok = _tile(tl.program_id(0), N, K, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for m in range(0, M, BLOCK_K):
        dy = dy_desc.load([m, on]).to(tl.float32)
        z = z_desc.load([m, on]).to(tl.float32)
        dz = _dsilu(dy, z).to(tl.bfloat16)
        acc = tl.dot(tl.trans(dz), x_desc.load([m, ok]), acc)
    dw_desc.store([on, ok], acc.to(tl.bfloat16))


linear_silu_fwd_kernel = triton.autotune(gemm_configs(_fwd_blocks), key=["M", "N", "K"])(
    _linear_silu_fwd
)
linear_silu_bwd_dx_kernel = triton.autotune(gemm_configs(_dx_blocks), key=["M", "N", "K"])(
    _linear_silu_bwd_dx
)
linear_silu_bwd_dw_kernel = triton.autotune(gemm_configs(_dw_blocks), key=["M", "N", "K"])(
    _linear_silu_bwd_dw
)


def descriptor(tensor: Any) -> Any:
    """A host descriptor over ``tensor`` with the dummy block shape the hooks replace."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(tensor, [1] * tensor.ndim)


def _grid(rows: int, cols: int) -> Callable[[dict[str, Any]], tuple[int]]:
    return lambda meta: (triton.cdiv(rows, meta["BLOCK_M"]) * triton.cdiv(cols, meta["BLOCK_N"]),)


def linear_silu_forward(x: Any, w: Any, b: Any) -> tuple[Any, Any]:
    """Return ``(y, z)``: ``z = x @ w.T + b`` and ``y = silu(z)`` (bf16, 2-d ``x`` and ``w``)."""
    import torch

    (m, k), n = x.shape, w.shape[0]
    z = torch.empty((m, n), device=x.device, dtype=torch.bfloat16)
    y = torch.empty_like(z)
    linear_silu_fwd_kernel[_grid(m, n)](
        descriptor(x), descriptor(w), b, descriptor(z), descriptor(y), m, n, k
    )
    return y, z


def linear_silu_backward(dy: Any, z: Any, x: Any, w: Any) -> tuple[Any, Any, Any]:
    """Return ``(dx, dw, db)`` of :func:`linear_silu_forward` for the output gradient ``dy``."""
    import torch

    (m, k), n = x.shape, w.shape[0]
    dy = dy.contiguous()
    dx = torch.empty_like(x)
    dw = torch.empty_like(w)
    linear_silu_bwd_dx_kernel[_grid(m, k)](
        descriptor(dy), descriptor(z), descriptor(w), descriptor(dx), m, n, k
    )
    linear_silu_bwd_dw_kernel[_grid(n, k)](
        descriptor(dy), descriptor(z), descriptor(x), descriptor(dw), m, n, k
    )
    s = torch.sigmoid(z.float())
    db = (dy.float() * s * (1 + z.float() * (1 - s))).sum(0).to(w.dtype)
    return dx, dw, db


def _autograd_function() -> Any:
    import torch

    class LinearSiLU(torch.autograd.Function):
        """``silu(x @ w.T + b)`` with the three kernels above."""

        @staticmethod
        def forward(ctx: Any, x: Any, w: Any, b: Any) -> Any:
            y, z = linear_silu_forward(x, w, b)
            ctx.save_for_backward(x, w, z)
            return y

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            x, w, z = ctx.saved_tensors
            return linear_silu_backward(dy, z, x, w)

    return LinearSiLU


def linear_silu(x: Any, w: Any, b: Any) -> Any:
    """``silu(x @ w.T + b)``, differentiable: forward and backward run the tuned kernels."""
    return _autograd_function().apply(x, w, b)
