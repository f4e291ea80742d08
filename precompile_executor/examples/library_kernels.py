"""Small ``@triton.autotune`` kernels of a training library, forward and backward.

The shape of Liger-Kernel's and flash-linear-attention's normalisation and activation kernels:
short compiles, short launches, 18 configs each (``num_warps`` × ``num_stages``, or a block size
× ``num_warps``), so a first call is bound by ``@triton.autotune``'s one ``do_bench`` per config
rather than by compiling. ``benchmarks/triton_library_bench.py`` runs each op's forward and
backward (:data:`OPS`) as a "library" of its own; ``tests/test_triton_library_bench.py`` checks
each op against torch in Triton's interpreter and runs the benchmark's ``--dry-run`` (real
compiles for sm_90 of each kernel's first two configs).

Ops (rows × columns, every kernel one row per program unless said otherwise):

* ``rmsnorm`` — RMSNorm; backward: dx per row, dw summed by :data:`PARTIALS` programs that
  loop over rows (Liger's layout), then ``sum(0)``;
* ``layernorm`` — LayerNorm (forward: ``autotune_kernels.layer_norm_fwd_kernel``); backward as
  RMSNorm's, with db;
* ``softmax`` — row softmax (forward: ``autotune_kernels.softmax_kernel``); backward
  ``y * (dy - sum(dy * y))``;
* ``scan`` — a cumulative sum along each row (``tl.cumsum``), ``BLOCK_M`` rows per program;
  backward: the reversed cumulative sum of the gradient;
* ``swiglu`` — ``silu(a) * b`` elementwise over ``BLOCK`` elements; backward: da, db;
* ``dyt`` — DyT, ``gamma * tanh(alpha * x) + beta``; backward: dx, and dgamma, dbeta, dalpha
  summed as RMSNorm's dw.
"""

# Triton kernels take untyped arguments and Triton's decorators are untyped.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,attr-defined"
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from .autotune_kernels import layer_norm_fwd_kernel, softmax_kernel

PARTIALS = 128
"""Programs of a backward kernel that sums a per-column gradient over rows (each loops over
``rows / PARTIALS`` rows and writes one partial row): about one per SM of an H100/H200."""


def row_configs() -> list[triton.Config]:
    """18 configs of a one-row-per-program kernel: ``num_warps`` × ``num_stages``."""
    return [
        triton.Config({}, num_warps=w, num_stages=s)
        for w in (1, 2, 4, 8, 16, 32)
        for s in (1, 2, 3)
    ]


def block_configs(name: str, blocks: tuple[int, ...], warps: tuple[int, ...]) -> list[Any]:
    """``len(blocks) × len(warps)`` configs of a kernel tiled by the constexpr ``name``."""
    return [triton.Config({name: b}, num_warps=w) for b in blocks for w in warps]


def _block_n(args: dict[str, Any]) -> int:
    return int(triton.next_power_of_2(args["N"]))


# -- RMSNorm ------------------------------------------------------------------------------------


@triton.autotune(configs=row_configs(), key=["N"])
@triton.heuristics({"BLOCK_N": _block_n})
@triton.jit
def rmsnorm_fwd_kernel(X, Y, W, Rstd, stride, N, eps, BLOCK_N: tl.constexpr):
    """``y = x / rms(x) * w`` for row ``program_id(0)``; saves ``1 / rms``."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(Rstd + row, rstd)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.autotune(configs=row_configs(), key=["N"])
@triton.heuristics({"BLOCK_N": _block_n})
@triton.jit
def rmsnorm_bwd_kernel(
    DY, X, W, Rstd, DX, DW_partial, stride, M, N, rows_per_program, BLOCK_N: tl.constexpr
):
    """dx for ``rows_per_program`` rows, and their dw summed into one partial row."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    start = pid * rows_per_program
    for row in range(start, tl.minimum(start + rows_per_program, M)):
        offs = row * stride + cols  # int32 (the loop counter): fine while rows × stride < 2**31
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + row)
        xhat = x * rstd
        wdy = w * dy
        dx = rstd * (wdy - xhat * (tl.sum(wdy * xhat, axis=0) / N))
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(DW_partial + pid * N + cols, dw, mask=mask)


# -- LayerNorm (forward: autotune_kernels.layer_norm_fwd_kernel) --------------------------------


@triton.autotune(configs=row_configs(), key=["N"])
@triton.heuristics({"BLOCK_N": _block_n})
@triton.jit
def layernorm_bwd_kernel(
    DY,
    X,
    W,
    Mean,
    Rstd,
    DX,
    DW_partial,
    DB_partial,
    stride,
    M,
    N,
    rows_per_program,
    BLOCK_N: tl.constexpr,
):
    """dx for ``rows_per_program`` rows, and their dw and db summed into partial rows."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    start = pid * rows_per_program
    for row in range(start, tl.minimum(start + rows_per_program, M)):
        offs = row * stride + cols  # int32 (the loop counter): fine while rows × stride < 2**31
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + row)
        rstd = tl.load(Rstd + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / N
        c2 = tl.sum(wdy, axis=0) / N
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    tl.store(DW_partial + pid * N + cols, dw, mask=mask)
    tl.store(DB_partial + pid * N + cols, db, mask=mask)


# -- softmax (forward: autotune_kernels.softmax_kernel) -----------------------------------------


@triton.autotune(configs=row_configs(), key=["N"])
@triton.heuristics({"BLOCK_N": _block_n})
@triton.jit
def softmax_bwd_kernel(DY, Y, DX, stride, N, BLOCK_N: tl.constexpr):
    """``dx = y * (dy - sum(dy * y))`` for row ``program_id(0)``."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    y = tl.load(Y + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dx = y * (dy - tl.sum(dy * y, axis=0))
    tl.store(DX + row * stride + cols, dx.to(DX.dtype.element_ty), mask=mask)


# -- scan ---------------------------------------------------------------------------------------

SCAN_CONFIGS = block_configs("BLOCK_M", (1, 2, 4), (1, 2, 4, 8, 16, 32))


@triton.autotune(configs=SCAN_CONFIGS, key=["M", "N"])
@triton.heuristics({"BLOCK_N": _block_n})
@triton.jit
def scan_fwd_kernel(X, Y, stride, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``y = cumsum(x)`` along each of ``BLOCK_M`` rows, in fp32."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows.to(tl.int64)[:, None] * stride + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, tl.cumsum(x, axis=1).to(Y.dtype.element_ty), mask=mask)


@triton.autotune(configs=SCAN_CONFIGS, key=["M", "N"])
@triton.heuristics({"BLOCK_N": _block_n})
@triton.jit
def scan_bwd_kernel(DY, DX, stride, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``dx = reversed cumsum(dy)`` along each of ``BLOCK_M`` rows, in fp32."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows.to(tl.int64)[:, None] * stride + cols[None, :]
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DX + offs, tl.cumsum(dy, axis=1, reverse=True).to(DX.dtype.element_ty), mask=mask)


# -- SwiGLU -------------------------------------------------------------------------------------

SWIGLU_CONFIGS = block_configs("BLOCK", (512, 1024, 2048, 4096, 8192, 16384), (4, 8, 16))


@triton.autotune(configs=SWIGLU_CONFIGS, key=["n"])
@triton.jit
def swiglu_fwd_kernel(A, B, C, n, BLOCK: tl.constexpr):
    """``c = silu(a) * b`` over ``BLOCK`` elements."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(C + offs, (a * tl.sigmoid(a) * b).to(C.dtype.element_ty), mask=mask)


@triton.autotune(configs=SWIGLU_CONFIGS, key=["n"])
@triton.jit
def swiglu_bwd_kernel(DC, A, B, DA, DB, n, BLOCK: tl.constexpr):
    """``da = dc * b * silu'(a)``, ``db = dc * silu(a)`` over ``BLOCK`` elements."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dc = tl.load(DC + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    silu = a * sig
    tl.store(DA + offs, (dc * b * (sig + silu * (1 - sig))).to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + offs, (dc * silu).to(DB.dtype.element_ty), mask=mask)


# -- DyT ----------------------------------------------------------------------------------------


@triton.jit
def _tanh(x):
    # tanh through exp, the same on every Triton version (tl.math.tanh moved between them)
    e = tl.exp(-2 * tl.abs(x))
    t = (1 - e) / (1 + e)
    return tl.where(x < 0, -t, t)


@triton.autotune(configs=row_configs(), key=["N"])
@triton.heuristics({"BLOCK_N": _block_n})
@triton.jit
def dyt_fwd_kernel(X, Y, Alpha, Gamma, Beta, stride, N, BLOCK_N: tl.constexpr):
    """``y = gamma * tanh(alpha * x) + beta`` for row ``program_id(0)``."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    alpha = tl.load(Alpha).to(tl.float32)
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    gamma = tl.load(Gamma + cols, mask=mask, other=0.0).to(tl.float32)
    beta = tl.load(Beta + cols, mask=mask, other=0.0).to(tl.float32)
    y = gamma * _tanh(alpha * x) + beta
    tl.store(Y + row * stride + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.autotune(configs=row_configs(), key=["N"])
@triton.heuristics({"BLOCK_N": _block_n})
@triton.jit
def dyt_bwd_kernel(
    DY,
    X,
    Alpha,
    Gamma,
    DX,
    DGamma_partial,
    DBeta_partial,
    DAlpha_partial,
    stride,
    M,
    N,
    rows_per_program,
    BLOCK_N: tl.constexpr,
):
    """dx for ``rows_per_program`` rows; their dgamma and dbeta summed into partial rows and
    their dalpha into one partial value."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    alpha = tl.load(Alpha).to(tl.float32)
    gamma = tl.load(Gamma + cols, mask=mask, other=0.0).to(tl.float32)
    dgamma = tl.zeros([BLOCK_N], dtype=tl.float32)
    dbeta = tl.zeros([BLOCK_N], dtype=tl.float32)
    dalpha = tl.zeros([BLOCK_N], dtype=tl.float32)
    start = pid * rows_per_program
    for row in range(start, tl.minimum(start + rows_per_program, M)):
        offs = row * stride + cols  # int32 (the loop counter): fine while rows × stride < 2**31
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        t = _tanh(alpha * x)
        dt = dy * gamma * (1 - t * t)
        tl.store(DX + offs, (dt * alpha).to(DX.dtype.element_ty), mask=mask)
        dgamma += dy * t
        dbeta += dy
        dalpha += dt * x
    tl.store(DGamma_partial + pid * N + cols, dgamma, mask=mask)
    tl.store(DBeta_partial + pid * N + cols, dbeta, mask=mask)
    tl.store(DAlpha_partial + pid, tl.sum(dalpha, axis=0))


# -- the ops: forward and backward, on any tensor library ---------------------------------------


def _rows(x: Any) -> tuple[int, int]:
    return int(x.shape[0]), int(x.shape[1])


def _per_program(m: int) -> int:
    return -(-m // PARTIALS)


def rmsnorm(x: Any, w: Any, empty: Callable[..., Any]) -> tuple[Any, Callable[[Any], Any]]:
    """RMSNorm of ``x`` (rows × N) by ``w``: the output and its backward (``dy`` → dx, dw).

    ``empty(shape, like=tensor, dtype=None)`` allocates (``torch.empty`` on the GPU; the
    dry run's stand-in on a CPU).
    """
    m, n = _rows(x)
    y, rstd = empty((m, n), like=x), empty((m,), like=x, dtype="float32")
    rmsnorm_fwd_kernel[(m,)](x, y, w, rstd, n, n, 1e-6)

    def backward(dy: Any) -> tuple[Any, Any]:
        dx, partial = empty((m, n), like=x), empty((PARTIALS, n), like=x, dtype="float32")
        rmsnorm_bwd_kernel[(PARTIALS,)](dy, x, w, rstd, dx, partial, n, m, n, _per_program(m))
        return dx, partial.sum(0)

    return y, backward


def layernorm(
    x: Any, w: Any, b: Any, empty: Callable[..., Any]
) -> tuple[Any, Callable[[Any], Any]]:
    """LayerNorm of ``x`` by ``w``, ``b``: the output and its backward (dx, dw, db)."""
    m, n = _rows(x)
    y = empty((m, n), like=x)
    mean, rstd = empty((m,), like=x, dtype="float32"), empty((m,), like=x, dtype="float32")
    layer_norm_fwd_kernel[(m,)](x, y, w, b, mean, rstd, n, n, 1e-5)

    def backward(dy: Any) -> tuple[Any, Any, Any]:
        dx = empty((m, n), like=x)
        dw, db = (empty((PARTIALS, n), like=x, dtype="float32") for _ in "wb")
        layernorm_bwd_kernel[(PARTIALS,)](
            dy, x, w, mean, rstd, dx, dw, db, n, m, n, _per_program(m)
        )
        return dx, dw.sum(0), db.sum(0)

    return y, backward


def softmax(x: Any, empty: Callable[..., Any]) -> tuple[Any, Callable[[Any], Any]]:
    """Row softmax of ``x``: the output and its backward (dx)."""
    m, n = _rows(x)
    y = empty((m, n), like=x)
    softmax_kernel[(m,)](y, x, n, n, n)

    def backward(dy: Any) -> Any:
        dx = empty((m, n), like=x)
        softmax_bwd_kernel[(m,)](dy, y, dx, n, n)
        return dx

    return y, backward


def scan(x: Any, empty: Callable[..., Any]) -> tuple[Any, Callable[[Any], Any]]:
    """Cumulative sum of ``x`` along its rows: the output and its backward (dx)."""
    m, n = _rows(x)
    y = empty((m, n), like=x)

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_M"]),)

    scan_fwd_kernel[grid](x, y, n, m, n)

    def backward(dy: Any) -> Any:
        dx = empty((m, n), like=x)
        scan_bwd_kernel[grid](dy, dx, n, m, n)
        return dx

    return y, backward


def swiglu(a: Any, b: Any, empty: Callable[..., Any]) -> tuple[Any, Callable[[Any], Any]]:
    """``silu(a) * b``: the output and its backward (da, db)."""
    m, n_cols = _rows(a)
    n = m * n_cols
    c = empty((m, n_cols), like=a)

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(n, meta["BLOCK"]),)

    swiglu_fwd_kernel[grid](a, b, c, n)

    def backward(dc: Any) -> tuple[Any, Any]:
        da, db = empty((m, n_cols), like=a), empty((m, n_cols), like=a)
        swiglu_bwd_kernel[grid](dc, a, b, da, db, n)
        return da, db

    return c, backward


def dyt(
    x: Any, alpha: Any, gamma: Any, beta: Any, empty: Callable[..., Any]
) -> tuple[Any, Callable[[Any], Any]]:
    """DyT of ``x``: the output and its backward (dx, dalpha, dgamma, dbeta)."""
    m, n = _rows(x)
    y = empty((m, n), like=x)
    dyt_fwd_kernel[(m,)](x, y, alpha, gamma, beta, n, n)

    def backward(dy: Any) -> tuple[Any, Any, Any, Any]:
        dx = empty((m, n), like=x)
        dgamma, dbeta = (empty((PARTIALS, n), like=x, dtype="float32") for _ in "gb")
        dalpha = empty((PARTIALS,), like=x, dtype="float32")
        dyt_bwd_kernel[(PARTIALS,)](
            dy, x, alpha, gamma, dx, dgamma, dbeta, dalpha, n, m, n, _per_program(m)
        )
        return dx, dalpha.sum(0), dgamma.sum(0), dbeta.sum(0)

    return y, backward


OPS = ("rmsnorm", "layernorm", "softmax", "scan", "swiglu", "dyt")
"""The ops, in the order the benchmark runs them."""

KERNELS = {
    "rmsnorm": (rmsnorm_fwd_kernel, rmsnorm_bwd_kernel),
    "layernorm": (layer_norm_fwd_kernel, layernorm_bwd_kernel),
    "softmax": (softmax_kernel, softmax_bwd_kernel),
    "scan": (scan_fwd_kernel, scan_bwd_kernel),
    "swiglu": (swiglu_fwd_kernel, swiglu_bwd_kernel),
    "dyt": (dyt_fwd_kernel, dyt_bwd_kernel),
}
"""Each op's autotuned kernels: forward, backward."""
