"""What a cold start costs over stock when no worker is ready: every config compiled here.

    python -m benchmarks.steal_probe [--pairs 6]

Compile-only (Triton's JIT on a dry-run sm_90 driver from ``tests/dry_run_gpu.py``; a benchmark
that launches once and returns a constant), so it runs without a GPU. The executor's only worker
is held by a task that waits for a file, so a tune under ``use()`` finds no worker ready and its
own thread takes back and compiles every config (``Tune._steal``): what it pays over stock is
the submission of each config (the JIT's warm-up path, the request, its cache key) and the
steal. Each pair autotunes a fresh kernel stock and ours, alternating which goes first, each on
a fresh device and an empty cache; medians are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import stamp, stamp_line, usable_cores

CONFIG_BLOCKS = (64, 128, 256, 512, 1024, 2048)
WARPS = (2, 4, 8)


def _hold(path: str) -> None:
    """A task that keeps its worker busy until ``path`` exists (at most 10 minutes)."""
    deadline = time.monotonic() + 600
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    """Run the pairs and print both medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import triton
    import triton.language as tl
    from dry_run_gpu import DryRunGPU, FakeTensor  # type: ignore[import-not-found]
    from triton import knobs
    from triton.runtime.driver import driver

    from precompile_executor import PrecompileExecutor
    from precompile_executor.triton import autotune as pe_autotune
    from precompile_executor.triton import classify

    @triton.jit  # type: ignore[untyped-decorator]
    def kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, tl.exp(x) * 2.0 + tl.sin(x), mask=mask)

    def constant(call: Any, quantiles: Any = None) -> list[float]:
        call()
        return [1.0] * 3

    def tune(ours: bool, pool: Any, warps: int) -> float:
        driver.set_active(DryRunGPU())
        configs = [triton.Config({"BLOCK": b}, num_warps=warps) for b in CONFIG_BLOCKS]
        autotuned = triton.autotune(configs=configs, key=["n"], do_bench=constant)(kernel)
        launch = (FakeTensor(tl.float32), FakeTensor(tl.float32), 4096)
        with knobs.cache.scope(), tempfile.TemporaryDirectory() as cache:
            knobs.cache.dir = cache
            start = time.perf_counter()
            if ours:
                with pe_autotune.use(pool):
                    autotuned[(1,)](*launch)
            else:
                autotuned[(1,)](*launch)
            return time.perf_counter() - start

    release = Path(tempfile.mkdtemp()) / "release"
    times: dict[str, list[float]] = {"stock": [], "ours": []}
    with PrecompileExecutor(1, timeout=600, classify=classify) as pool:
        pool.warm_up()
        held = pool.submit(_hold, str(release))
        while pool.statistics().running < 1:
            time.sleep(0.05)
        tune(False, pool, 1)  # this process's first compile, paid by neither side
        for i in range(args.pairs):
            warps = WARPS[i % len(WARPS)]
            for ours in (False, True) if i % 2 == 0 else (True, False):
                times["ours" if ours else "stock"].append(tune(ours, pool, warps))
        release.touch()
        held.result(60)
    command = "python -m benchmarks.steal_probe " + " ".join(sys.argv[1:])
    print(stamp_line(stamp(usable_cores(), command)))
    print(f"{len(CONFIG_BLOCKS)} configs a tune, {args.pairs} alternating pairs")
    for mode, values in times.items():
        rounds = ", ".join(f"{v:.2f}" for v in values)
        print(f"{mode:5}: median {statistics.median(values):.3f} s ({rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
