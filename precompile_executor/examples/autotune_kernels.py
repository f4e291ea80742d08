"""``@triton.autotune`` kernels written the way kernel libraries write them, for the autotune mode.

``benchmarks/triton_autotune_bench.py`` and ``tests/test_triton_autotune.py`` import them from
here, so both measure and test the same kernels:

* :data:`matmul_64` — the package's matmul (``examples.kernels``) under 64 sm_90 configs;
* :func:`softmax_kernel` — a row softmax, one row per program, ``BLOCK_SIZE`` by heuristic, tuned
  over warps and stages (Triton's tutorial, Unsloth);
* :func:`layer_norm_fwd_kernel` — layer norm forward over ``num_warps`` × ``num_stages`` (the
  shape of flash-linear-attention's normalisation kernels);
* :func:`attention_fwd_kernel` — a fused attention forward with online softmax over ``BLOCK_M`` ×
  ``BLOCK_N`` × stages × warps (Triton's fused-attention tutorial, FlashAttention);
* :func:`cross_entropy_fwd_kernel` — a cross-entropy loss forward with an online log-sum-exp
  over vocabulary chunks (the shape of Liger's);
* :func:`faulty_kernel` — a tiny kernel whose ``FAULT`` constexpr makes its compile segfault
  (``1``) or hang in C holding the GIL (``2``): the compile-time function it calls runs only in
  the process that compiles, so with the autotune mode it hits a worker, never the caller.
"""

# Triton kernels take untyped arguments and Triton's decorators are untyped.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import ctypes
import faulthandler

import triton
import triton.language as tl

from .kernels import matmul_kernel


def matmul_configs() -> list[triton.Config]:
    """Return 64 matmul configs for sm_90: 8 tile shapes × BLOCK_K × stages × warps."""
    tiles = [
        (64, 64),
        (64, 128),
        (128, 64),
        (128, 128),
        (128, 256),
        (256, 128),
        (64, 256),
        (256, 64),
    ]
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
            num_stages=stages,
            num_warps=warps,
        )
        for bm, bn in tiles
        for bk in (32, 64)
        for stages in (3, 4)
        for warps in (4, 8)
    ]


matmul_64 = triton.autotune(configs=matmul_configs(), key=["M", "N", "K"])(matmul_kernel.fn)
"""``examples.kernels.matmul_kernel``'s ``@triton.jit`` function under :func:`matmul_configs`."""


@triton.autotune(
    configs=[
        triton.Config({}, num_warps=w, num_stages=s)
        for w in (1, 2, 4, 8, 16, 32)
        for s in (1, 2, 3)
    ],
    key=["n_cols"],
)
@triton.heuristics({"BLOCK_SIZE": lambda args: triton.next_power_of_2(args["n_cols"])})
@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    """Softmax of row ``program_id(0)``, computed in fp32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.autotune(
    configs=[
        triton.Config({}, num_warps=w, num_stages=s)
        for w in (1, 2, 4, 8, 16, 32)
        for s in (2, 3, 4)
    ],
    key=["N"],
)
@triton.heuristics({"BLOCK_N": lambda args: triton.next_power_of_2(args["N"])})
@triton.jit
def layer_norm_fwd_kernel(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK_N: tl.constexpr):
    """LayerNorm of row ``program_id(0)`` (the whole row in one block), saving mean and 1/std."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    w = tl.load(W + cols, mask=mask).to(tl.float32)
    b = tl.load(B + cols, mask=mask).to(tl.float32)
    y = xc * rstd * w + b
    tl.store(Y + row * stride + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=s, num_warps=w)
        for bm in (64, 128)
        for bn in (32, 64)
        for s in (3, 4)
        for w in (4, 8)
    ],
    key=["N_CTX", "HEAD_DIM"],
)
@triton.jit
def attention_fwd_kernel(
    Q,
    K,
    V,
    Out,
    sm_scale,
    stride_qz,
    stride_qm,
    stride_kz,
    stride_kn,
    stride_vz,
    stride_vn,
    stride_oz,
    stride_om,
    N_CTX,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Non-causal attention forward for one block of queries of one (batch × head).

    Tensors are ``(batch * heads, N_CTX, HEAD_DIM)``, contiguous in the last dimension; keys and
    values are visited ``BLOCK_N`` at a time with the running max/sum of the online softmax.
    """
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + bh * stride_qz + offs_m[:, None] * stride_qm + offs_d[None, :])
    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504  # exp(x) = exp2(x * log2(e))
    k_base = K + bh * stride_kz + offs_d[:, None]
    v_base = V + bh * stride_vz + offs_d[None, :]
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_base + cols[None, :] * stride_kn)
        qk = tl.dot(q, k) * qk_scale
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * stride_vn)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    out = Out + bh * stride_oz + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(out, acc.to(Out.dtype.element_ty))


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_SIZE": bs}, num_warps=w)
        for bs in (1024, 2048, 4096, 8192)
        for w in (4, 8, 16, 32)
    ],
    key=["n_cols"],
)
@triton.jit
def cross_entropy_fwd_kernel(
    logits_ptr, labels_ptr, loss_ptr, stride, n_cols, BLOCK_SIZE: tl.constexpr
):
    """Cross-entropy loss of row ``program_id(0)``: log-sum-exp over the vocabulary minus the
    label's logit, with the log-sum-exp accumulated online over ``BLOCK_SIZE`` chunks."""
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    label = tl.load(labels_ptr + row)
    m = -float("inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(base + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    target = tl.load(base + label).to(tl.float32)
    tl.store(loss_ptr + row, tl.log(s) + m - target)


class CompileTimeFault:
    """Constructed while Triton generates code: ``1`` segfaults, ``2`` hangs in C (a class, not
    a function, because Triton's dependency scan refuses plain functions in kernel code)."""

    def __init__(self, fault: int) -> None:
        if fault == 1:
            faulthandler._sigsegv()  # type: ignore[attr-defined]
        elif fault == 2:
            ctypes.PyDLL(None).sleep(1000)  # PyDLL keeps the GIL: no Python-level timer can fire


@triton.constexpr_function
def compile_time_fault(fault):
    """Return ``fault`` at compile time, after faulting as :class:`CompileTimeFault` says."""
    CompileTimeFault(fault)
    return fault


def faulty_configs() -> list[triton.Config]:
    """Four configs of :func:`faulty_kernel`: two good, one segfaulting, one hanging compile."""
    return [
        triton.Config({"BLOCK": 128, "FAULT": 0}, num_warps=4),
        triton.Config({"BLOCK": 256, "FAULT": 1}, num_warps=4),
        triton.Config({"BLOCK": 512, "FAULT": 2}, num_warps=4),
        triton.Config({"BLOCK": 1024, "FAULT": 0}, num_warps=4),
    ]


@triton.autotune(configs=faulty_configs(), key=["n"])
@triton.jit
def faulty_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, FAULT: tl.constexpr):
    """``out = 2 * x``; compiling it with ``FAULT`` 1 or 2 crashes or hangs the compiler."""
    tl.static_assert(compile_time_fault(FAULT) == FAULT)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)
