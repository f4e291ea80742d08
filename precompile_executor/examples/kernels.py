"""Four autotuned Triton kernels and the argument specs to warm them: the ``demo`` job.

``precompile-executor demo`` compiles every config of every kernel below for ``cuda:90``, on any
machine (no GPU is needed to compile for an explicit target). The module follows the convention
that ``precompile-executor warm`` reads: a module-level ``PRECOMPILE_SPECS`` maps the name of each
autotuned kernel to the launches to warm it for (see ``docs/triton.md``).

The kernels are written for clarity; they are real (they run on a GPU), but they are here to be
compiled.
"""

# Triton kernels take untyped arguments and Triton's decorators are untyped.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import triton
import triton.language as tl

from precompile_executor.triton import TensorSpec, launch


def _matmul_configs() -> list[triton.Config]:
    """Return 20 matmul configs in the range an sm_80/sm_90 autotuner usually searches."""
    shapes = [
        # (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
        (128, 256, 64, 3, 8),
        (256, 128, 64, 3, 8),
        (256, 64, 64, 4, 4),
        (64, 256, 64, 4, 4),
        (128, 128, 64, 4, 4),
        (128, 64, 64, 4, 4),
        (64, 128, 64, 4, 4),
        (128, 32, 64, 4, 4),
        (64, 32, 64, 5, 2),
        (32, 64, 64, 5, 2),
        (128, 256, 32, 3, 8),
        (256, 128, 32, 3, 8),
        (128, 128, 32, 4, 4),
        (64, 64, 32, 5, 4),
        (128, 128, 128, 3, 8),
        (64, 128, 128, 3, 4),
        (128, 64, 128, 3, 4),
        (256, 128, 128, 2, 8),
        (64, 64, 64, 3, 4),
        (32, 32, 64, 4, 2),
    ]
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
            num_stages=stages,
            num_warps=warps,
        )
        for bm, bn, bk, stages, warps in shapes
    ]


@triton.autotune(configs=_matmul_configs(), key=["M", "N", "K"])
@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr = 8,
):
    """C = A @ B with fp32 accumulation, tiles visited in grouped order for L2 reuse.

    ``GROUP_M`` has a default so that a caller who sweeps only the block sizes, warps and stages
    (``tests/test_gpu.py``'s run-once batch) launches it as is; every config here sets it.
    """
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    ks = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_tile = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_tile, mask=ks[None, :] < k_left, other=0.0)
        b = tl.load(b_tile, mask=ks[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk

    out_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_tile = c_ptr + out_rows[:, None] * stride_cm + out_cols[None, :] * stride_cn
    mask = (out_rows[:, None] < M) & (out_cols[None, :] < N)
    tl.store(c_tile, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.autotune(
    configs=[triton.Config({}, num_warps=w, num_stages=s) for w in (2, 4, 8, 16) for s in (1, 2)],
    key=["n_cols"],
)
@triton.heuristics({"BLOCK_SIZE": lambda args: triton.next_power_of_2(args["n_cols"])})
@triton.jit
def softmax_kernel(
    out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols, BLOCK_SIZE: tl.constexpr
):
    """Numerically stable softmax of each row; a program handles rows pid, pid + grid, ..."""
    start = tl.program_id(0)
    step = tl.num_programs(0)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    for row in range(start, n_rows, step):
        x = tl.load(in_ptr + row * in_row_stride + offsets, mask=mask, other=-float("inf"))
        x = x.to(tl.float32)
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        y = num / tl.sum(num, axis=0)
        out = out_ptr + row * out_row_stride + offsets
        tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_SIZE": bs}, num_warps=w)
        for bs, w in ((512, 2), (1024, 4), (1024, 8), (2048, 8), (4096, 8), (4096, 16))
    ],
    key=["N"],
)
@triton.jit
def layer_norm_kernel(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    """LayerNorm forward of one row per program, saving mean and 1/std for the backward pass."""
    row = tl.program_id(0)
    X += row * stride
    Y += row * stride
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        acc += tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
        x = tl.where(cols < N, x - mean, 0.0)
        acc += x * x
    rstd = 1 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask)
        b = tl.load(B + cols, mask=mask)
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_SIZE": bs}, num_warps=w)
        for bs, w in ((256, 2), (512, 4), (1024, 4), (2048, 8), (4096, 8), (8192, 16))
    ],
    key=["n_elements"],
)
@triton.jit
def add_gelu_kernel(x_ptr, bias_ptr, out_ptr, n_elements, n_cols, BLOCK_SIZE: tl.constexpr):
    """out = gelu(x + bias) with the tanh approximation; ``bias`` broadcasts along rows."""
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    bias = tl.load(bias_ptr + offsets % n_cols, mask=mask).to(tl.float32)
    x = x + bias
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    # tanh(z) = 2 * sigmoid(2z) - 1, written with exp so it needs no libdevice.
    tanh = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
    y = 0.5 * x * (1.0 + tanh)
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


def _matmul_launch(m: int, n: int, k: int, dtype: str) -> object:
    a = TensorSpec(dtype, (m, k))
    b = TensorSpec(dtype, (k, n))
    c = TensorSpec(dtype, (m, n))
    return launch(a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())


def _softmax_launch(rows: int, cols: int, dtype: str) -> object:
    x = TensorSpec(dtype, (rows, cols))
    y = TensorSpec(dtype, (rows, cols))
    return launch(y, x, x.stride(0), y.stride(0), rows, cols)


def _layer_norm_launch(rows: int, cols: int, dtype: str) -> object:
    x = TensorSpec(dtype, (rows, cols))
    y = TensorSpec(dtype, (rows, cols))
    w = TensorSpec(dtype, (cols,))
    b = TensorSpec(dtype, (cols,))
    mean = TensorSpec("fp32", (rows,))
    rstd = TensorSpec("fp32", (rows,))
    return launch(x, y, w, b, mean, rstd, x.stride(0), cols, 1e-5)


def _add_gelu_launch(rows: int, cols: int, dtype: str) -> object:
    x = TensorSpec(dtype, (rows, cols))
    bias = TensorSpec(dtype, (cols,))
    out = TensorSpec(dtype, (rows, cols))
    return launch(x, bias, out, rows * cols, cols)


PRECOMPILE_SPECS = {
    "matmul_kernel": [
        _matmul_launch(4096, 4096, 4096, "fp16"),
        _matmul_launch(4096, 4096, 4096, "bf16"),
    ],
    "softmax_kernel": [_softmax_launch(4096, 1024, "fp16")],
    "layer_norm_kernel": [_layer_norm_launch(4096, 4096, "fp16")],
    "add_gelu_kernel": [_add_gelu_launch(4096, 4096, "fp16")],
}
"""Launches to warm for each kernel: ``precompile-executor warm`` compiles every config of every
kernel named here, once per launch, with the specialisation those arguments would get."""
