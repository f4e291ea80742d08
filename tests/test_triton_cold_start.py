"""A process's first ``@triton.autotune`` never waits for workers that are still starting.

The executor's workers here are still in their initializer (a sleep far longer than the test)
for the whole tune: the tune's own thread takes every config back from the queue and compiles
it, as stock Triton would, each exactly once, and the tune ends long before any worker could
have. Counted with ``autotune.statistics()`` and Triton's compilation listener; the settings are
the defaults (the tune's thread steals, workers import the kernel's module first).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from dry_run_gpu import DryRunGPU, FakeTensor  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from precompile_executor import PrecompileExecutor  # noqa: E402
from precompile_executor import triton as pe_triton  # noqa: E402
from precompile_executor.triton import _autotune_tune as _tune  # noqa: E402
from precompile_executor.triton import _preimport, classify  # noqa: E402
from precompile_executor.triton import autotune as pe_autotune  # noqa: E402

STARTING_S = 600.0
"""How long the workers' initializer sleeps: they are still starting for the whole test."""
TEST_TIMEOUT_S = 240


@triton.jit
def triple_jit(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0, mask=mask)


BLOCKS = (64, 128, 256, 512, 1024)
TIMES_MS = {64: 5.0, 128: 3.0, 256: 1.0, 512: 2.0, 1024: 4.0}


@pytest.fixture
def gpu(tmp_path: Path) -> Iterator[DryRunGPU]:
    stand_in = DryRunGPU()
    previous = driver.__dict__.get("_active")
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path / "caller-cache")
        driver.set_active(stand_in)
        try:
            yield stand_in
        finally:
            driver.set_active(previous)
            triple_jit.device_caches.pop(stand_in.device, None)
            pe_triton.state.reset()


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_first_tune_compiles_here_while_every_worker_is_still_starting(
    gpu: DryRunGPU,
) -> None:
    assert _tune.STEALS and _preimport.PREIMPORTS  # the defaults
    compiled_here: list[Any] = []

    def listener(
        *, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool
    ) -> None:
        if not cache_hit:
            names = src.fn.arg_names
            compiled_here.append({names[p[0]]: v for p, v in src.constants.items()}["BLOCK"])

    def bench(kernel_call: Any, quantiles: Any = None) -> list[float]:
        kernel_call()
        return [TIMES_MS[gpu.launches[-1]["BLOCK"]]] * 3

    configs = [triton.Config({"BLOCK": b}, num_warps=4) for b in BLOCKS]
    kernel = triton.autotune(configs=configs, key=["n"], do_bench=bench)(triple_jit)
    pool = PrecompileExecutor(
        2, initializer=time.sleep, initargs=(STARTING_S,), timeout=60, classify=classify
    )
    try:
        with knobs.compilation.scope():
            knobs.compilation.listener = listener
            start = time.monotonic()
            with pe_autotune.use(pool):
                kernel[(1,)](FakeTensor(tl.float32), FakeTensor(tl.float32), 4096)
            took_s = time.monotonic() - start
        stats = pool.statistics()
    finally:
        pool.terminate_workers()
    # Every config compiled here, once; no worker ran one (none ever started).
    assert sorted(compiled_here) == sorted(BLOCKS)
    counts = pe_autotune.statistics()[f"{__name__}.triple_jit"]
    assert (counts.tunes, counts.caller, counts.workers, counts.failed) == (1, len(BLOCKS), 0, 0)
    assert stats.completed == 0 and stats.running == 0
    assert kernel.best_config.kwargs == {"BLOCK": 256}
    assert took_s < TEST_TIMEOUT_S / 2  # generous: it waited for no worker
