"""The compile task: one config of the package's matmul kernel compiled for sm_90, no GPU needed.

Both kernels are the package's own (``precompile_executor/examples/kernels.py``): the matmul the
batch scenarios sweep, and its layer norm as the unrelated kernel that warms a compiler. The
module imports nothing of the library but those kernels, so ``benchmarks.s9_versus`` can run it
against an older version of the library. The cache directory is an argument: warm workers
started before a strategy's fresh cache existed (Triton reads ``TRITON_CACHE_DIR`` per compile).
"""

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
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from precompile_executor.examples import kernels as examples

Config = tuple[int, int, int, int, int]
"""``(BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)``."""

SHARED_MEMORY_BYTES = 232_448
"""sm_90's shared memory per block: configs that could never launch there are left out."""

matmul = examples.matmul_kernel.fn
"""The package's matmul kernel without its autotune configs: the benchmarks sweep their own."""

layer_norm = examples.layer_norm_kernel.fn
"""The package's layer norm, without its configs: the unrelated kernel that warms a compiler."""

_MATMUL_SIGNATURE = {
    **dict.fromkeys(["a_ptr", "b_ptr", "c_ptr"], "*fp16"),
    **dict.fromkeys(["M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn"], "i32"),
    **dict.fromkeys(["stride_cm", "stride_cn"], "i32"),
    **dict.fromkeys(["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"], "constexpr"),
}
_LAYER_NORM_SIGNATURE = {
    **dict.fromkeys(["X", "Y", "W", "B", "Mean", "Rstd"], "*fp32"),
    **{"stride": "i32", "N": "i32", "eps": "fp32", "BLOCK_SIZE": "constexpr"},
}


def _compile(fn: Any, signature: dict[str, str], constexprs: dict[str, int], **options: int) -> Any:
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_config(cfg: Config, cache_dir: str, log_path: str | None = None) -> dict[str, Any]:
    """Compile one config into ``cache_dir``; return ``{"cfg", "elapsed_s", "pid",
    "cubin_bytes"}``. With ``log_path``, append ``"<cfg> <pid>"`` first (re-runs show up)."""
    bm, bn, bk, stages, warps = cfg
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    if log_path is not None:
        with open(log_path, "a") as f:
            f.write(f"{'x'.join(map(str, cfg))} {os.getpid()}\n")
    start = time.perf_counter()
    blocks = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    kernel = _compile(matmul, _MATMUL_SIGNATURE, blocks, num_warps=warps, num_stages=stages)
    elapsed = time.perf_counter() - start
    return {
        "cfg": cfg,
        "elapsed_s": elapsed,
        "pid": os.getpid(),
        "cubin_bytes": len(kernel.asm["cubin"]),
    }


@contextmanager
def triton_cache_dir(path: str, *, remove: bool = False) -> Iterator[str]:
    """Point ``TRITON_CACHE_DIR`` at ``path`` for the block (``remove``: delete it after)."""
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
    """Pay a process's one-off first-compile cost on the layer norm (a throw-away cache); sleep
    ``delay_s`` (so a batch of these lands on distinct workers); return this process's pid."""
    with triton_cache_dir(tempfile.mkdtemp(prefix="bench-warm-cache-"), remove=True):
        _compile(layer_norm, _LAYER_NORM_SIGNATURE, {"BLOCK_SIZE": 1024}, num_warps=4)
    time.sleep(delay_s)
    return os.getpid()


def _valid(cfg: Config) -> bool:
    bm, bn, bk, stages, warps = cfg
    tile = bm * bn
    if (bm * bk + bk * bn) * 2 * stages > SHARED_MEMORY_BYTES:
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
    """The search space (blocks 32–256, BLOCK_K 32–64, 2–4 stages, 2/4/8 warps, minus what would
    not fit sm_90) in a seeded shuffled order, so any prefix mixes small and large configs."""
    blocks = (32, 64, 128, 256)
    space = [
        (bm, bn, bk, stages, warps)
        for bm in blocks
        for bn in blocks
        for bk in (32, 64)
        for stages in (2, 3, 4)
        for warps in (2, 4, 8)
        if bm * bn <= 128 * 256 and _valid((bm, bn, bk, stages, warps))
    ]
    random.Random(20261129).shuffle(space)
    return space


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
