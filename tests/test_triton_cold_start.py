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

from dry_run_gpu import DryRunGPU, FakeTensor, installed  # noqa: E402
from triton import knobs  # noqa: E402

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
    try:
        with installed(DryRunGPU(), tmp_path / "caller-cache", (triple_jit,)) as stand_in:
            yield stand_in
    finally:
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


_HASHES_ONCE = """
import functools, threading, time

import triton
import triton.language as tl
import triton.runtime.cache as cache

computed = []
hashing = threading.Event()
real = cache.triton_key.__wrapped__


@functools.lru_cache
def triton_key():
    computed.append(threading.current_thread().name)
    hashing.set()
    time.sleep(2.0)  # a slow installation hash: the first compile meets it under way
    return real()


cache.triton_key = triton_key

from precompile_executor import PrecompileExecutor
from precompile_executor.triton import TensorSpec, launch, prewarm, warm


@triton.jit
def quadruple(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 4.0, mask=offs < n)


# prewarm's caller half (prewarm.in_caller) starts hashing on a thread as the executor is built
pool = PrecompileExecutor(1, initializer=prewarm, initargs=("cuda:90",), timeout=120)
try:
    assert hashing.wait(60), "the executor's caller half never started hashing"
    report = warm({quadruple: [launch(TensorSpec("fp32", (64,)), 64, BLOCK=64)]},
                  target="cuda:90", executor=pool)
    assert [r.status for r in report.results] == ["ok"], report.results
finally:
    pool.terminate_workers()
print("HASHED", len(computed))
"""


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_first_compile_waits_for_the_background_hash_instead_of_hashing_again(
    tmp_path: Path,
) -> None:
    # Triton 3.9's JIT computes the cache key (for a process's first: the hash of Triton's
    # installation) before it hands the compile over; the executor's caller half is computing
    # the same hash on a thread. The compile waits for it: the installation is hashed once.
    import os
    import subprocess
    import sys

    script = tmp_path / "hashes_once.py"
    script.write_text(_HASHES_ONCE)
    root = Path(__file__).resolve().parent.parent
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        TRITON_CACHE_DIR=str(tmp_path / "cache"),
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=TEST_TIMEOUT_S - 20,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "HASHED 1" in done.stdout, done.stdout[-2000:]
