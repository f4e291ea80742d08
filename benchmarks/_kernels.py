"""The compile task: one config of the package's matmul kernel compiled for sm_90, no GPU needed.

``compile_config(cfg, cache_dir)`` is what every strategy of the batch scenarios runs, in a
worker, a forked child, a fresh interpreter or a thread. It calls ``triton.compile`` on an
``ASTSource`` for an explicit ``GPUTarget("cuda", 90, 32)``, which works the same in Triton 3.6
and 3.9: signature keys are argument names, constexpr arguments appear in the signature as
``"constexpr"`` and their values in ``constexprs`` (by name).

The cache directory is an argument, not inherited: warm workers were started before the
strategy's fresh cache existed, so the task points ``TRITON_CACHE_DIR`` at it itself (Triton
reads that variable on every compile).

It imports nothing of the library but the example kernel, so that ``benchmarks.s9_versus`` can
run it against an older version of the library.
"""

# Triton's decorators and kernels are untyped.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"
from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from precompile_executor.examples import kernels as examples

Config = tuple[int, int, int, int, int]
"""``(BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)``."""

TARGET = ("cuda", 90, 32)
"""sm_90 (H100/H200), warp size 32."""

_SHARED_MEMORY_BYTES = 232_448
"""sm_90's shared memory per block: configs that could never launch there are left out."""


matmul = examples.matmul_kernel.fn
"""The package's matmul kernel (``precompile_executor/examples/kernels.py``) without its autotune
configs: the benchmarks sweep their own configs of it."""


@triton.jit
def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = 2x: the unrelated kernel that warms a worker's compiler."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)


_MATMUL_SIGNATURE = {
    **dict.fromkeys(["a_ptr", "b_ptr", "c_ptr"], "*fp16"),
    **dict.fromkeys(
        ["M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm"], "i32"
    ),
    "stride_cn": "i32",
    **dict.fromkeys(["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"], "constexpr"),
}


def _compile(fn: Any, signature: dict[str, str], constexprs: dict[str, int], **options: int) -> Any:
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget(*TARGET), options=options)


def compile_config(cfg: Config, cache_dir: str, log_path: str | None = None) -> dict[str, Any]:
    """Compile one matmul config into ``cache_dir``; return what the benchmark needs to know.

    Args:
        cfg: ``(BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)``.
        cache_dir: the strategy's fresh Triton cache.
        log_path: if given, one line ``"<cfg> <pid>"`` is appended per run, so the benchmark can
            count re-runs of a task after a fault.

    Returns:
        ``{"cfg", "elapsed_s", "pid", "cubin_bytes"}``.
    """
    bm, bn, bk, stages, warps = cfg
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    if log_path is not None:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{'x'.join(map(str, cfg))} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
    start = time.perf_counter()
    kernel = _compile(
        matmul,
        _MATMUL_SIGNATURE,
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
        num_warps=warps,
        num_stages=stages,
    )
    return {
        "cfg": cfg,
        "elapsed_s": time.perf_counter() - start,
        "pid": os.getpid(),
        "cubin_bytes": len(kernel.asm["cubin"]),
    }


@contextmanager
def triton_cache_dir(path: str, *, remove: bool = False) -> Iterator[str]:
    """Point ``TRITON_CACHE_DIR`` at ``path`` for the block, then restore it (and delete ``path``
    when ``remove``)."""
    previous = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = path
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = previous
        if remove:
            shutil.rmtree(path, ignore_errors=True)


def warm_compile(delay_s: float = 0.0) -> int:
    """Compile an unrelated small kernel into a throw-away cache; return this process's pid.

    The first compile in a process pays a one-off cost (loading the compiler's libraries and
    dialects); this pays it, so what follows measures warm compiles. ``delay_s`` keeps the task
    busy a little longer, so that a batch of these lands on distinct workers.
    """
    cache = tempfile.mkdtemp(prefix="bench-warm-cache-")
    with triton_cache_dir(cache, remove=True):
        _compile(
            scale,
            {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 1024},
            num_warps=4,
            num_stages=1,
        )
    if delay_s:
        time.sleep(delay_s)
    return os.getpid()


def _valid(cfg: Config) -> bool:
    bm, bn, bk, stages, warps = cfg
    tile = bm * bn
    if (bm * bk + bk * bn) * 2 * stages > _SHARED_MEMORY_BYTES:
        return False
    # fp32 accumulator registers per thread: past 128 (64 with 4 warps) ptxas spills and a
    # compile takes 10-40 s, a config no autotuner keeps.
    acc_regs = tile // (32 * warps)
    if acc_regs > (64 if warps < 8 else 128) or acc_regs < 16:
        return False
    if max(bm, bn) > 4 * min(bm, bn):  # skinny tiles are rarely worth their compile time
        return False
    return not (warps == 8 and tile < 8192) and not (warps == 2 and (tile > 2048 or bk > 32))


def all_configs() -> list[Config]:
    """Every config of the search space, in a fixed shuffled order (as an autotuner lists them).

    Block sizes 32–256 (at most 128×256 tiles, aspect ≤ 4), BLOCK_K 32–64, 2–4 stages, 2/4/8
    warps, minus configs that would not fit sm_90's shared memory or registers. The order is a
    seeded shuffle, so any prefix mixes small and large configs.
    """
    space = [
        (bm, bn, bk, stages, warps)
        for bm in (32, 64, 128, 256)
        for bn in (32, 64, 128, 256)
        for bk in (32, 64)
        for stages in (2, 3, 4)
        for warps in (2, 4, 8)
        if bm * bn <= 128 * 256
    ]
    configs = [c for c in space if _valid(c)]
    random.Random(20261129).shuffle(configs)
    return configs


QUICK_CONFIGS: list[Config] = [
    (32, 32, 32, 2, 2),
    (64, 32, 32, 4, 4),
    (64, 32, 32, 2, 4),
    (32, 64, 32, 2, 4),
    (64, 32, 32, 3, 2),
    (64, 64, 32, 2, 4),
]
"""Small configs (0.5–0.8 s each on a 2-core CPU machine) for ``--quick``."""


def configs(n: int, quick: bool) -> list[Config]:
    """The first ``n`` configs of the batch (small ones in quick mode)."""
    pool = QUICK_CONFIGS if quick else all_configs()
    if n > len(pool):
        raise ValueError(f"at most {len(pool)} distinct configs are defined, asked for {n}")
    return pool[:n]
