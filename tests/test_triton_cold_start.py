"""A process's first ``@triton.autotune`` never waits for workers that are still starting.

The executor's workers here are still in their initializer (a sleep far longer than the test)
for the whole tune: every config is taken back from the queue and compiled in this process —
in the caller lanes, threads beside the tune's own, which benchmarks each config as it lands
(``_lanes.py``), or, without lanes, by the tune's thread one at a time, as stock Triton would —
each exactly once, and the tune ends long before any worker could have. Counted with
``autotune.statistics()`` and Triton's compilation listener (it runs on the thread that
compiled); the other settings are the defaults (the tune's thread steals, workers import the
kernel's module first).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from dry_run_gpu import DryRunGPU, FakeTensor, installed  # noqa: E402
from triton import knobs  # noqa: E402
from triton.compiler.errors import CompilationError  # noqa: E402
from triton.runtime.errors import PTXASError  # noqa: E402

from precompile_executor import PrecompileExecutor  # noqa: E402
from precompile_executor import triton as pe_triton  # noqa: E402
from precompile_executor.triton import _autotune_tune as _tune  # noqa: E402
from precompile_executor.triton import _lanes, _preimport, classify  # noqa: E402
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
@pytest.mark.parametrize("lanes", [None, 0], ids=["lanes", "no-lanes"])
def test_the_first_tune_compiles_here_while_every_worker_is_still_starting(
    gpu: DryRunGPU, lanes: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _tune.STEALS and _preimport.PREIMPORTS and _lanes.CALLER_LANES is None  # the defaults
    monkeypatch.setattr(_lanes, "CALLER_LANES", lanes)
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
    in_lanes = len(BLOCKS) if lanes is None else 0  # no lanes: the tune's thread compiles each
    assert (counts.tunes, counts.workers, counts.failed) == (1, 0, 0)
    assert (counts.lanes, counts.caller) == (in_lanes, len(BLOCKS) - in_lanes)
    assert stats.completed == 0 and stats.running == 0
    assert kernel.best_config.kwargs == {"BLOCK": 256}
    assert took_s < TEST_TIMEOUT_S / 2  # generous: it waited for no worker


LANES = 2
WIDE_BLOCKS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
"""Eight configs, each predicted to compile longer than the one before (``triton_prior_s``)."""
WIDE_TIMES_MS = {32: 1.0, 64: 1.05, 128: 3.0, 256: 4.0, 512: 5.0, 1024: 6.0, 2048: 7.0, 4096: 8.0}
"""The two predicted shortest lead within ``CONFIRM_MARGIN`` of each other: BLOCK=32 wins."""


class LaneLog:
    """Triton's compilation listener: each compile this process ran — its thread, ``BLOCK``,
    and when it started and ended (``time.time()``, from Triton's own timer)."""

    def __init__(self) -> None:
        self.compiles: list[tuple[str, Any, float, float]] = []

    def __call__(
        self, *, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool
    ) -> None:
        if cache_hit:
            return
        end = time.time()
        names = src.fn.arg_names
        block = {names[p[0]]: v for p, v in src.constants.items()}.get("BLOCK")
        self.compiles.append((threading.current_thread().name, block, end - times.total / 1e6, end))


def _cold_pool() -> PrecompileExecutor:
    """Two workers that stay in their initializer for the whole test."""
    return PrecompileExecutor(
        2, initializer=time.sleep, initargs=(STARTING_S,), timeout=60, classify=classify
    )


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_first_tune_compiles_in_lanes_beside_its_benchmarks_each_config_once(
    gpu: DryRunGPU, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_lanes, "CALLER_LANES", LANES)
    log = LaneLog()
    benched: list[tuple[Any, float]] = []

    def bench(kernel_call: Any, quantiles: Any = None) -> list[float]:
        kernel_call()
        block = gpu.launches[-1]["BLOCK"]
        benched.append((block, time.time()))
        return [WIDE_TIMES_MS[block]] * 3

    def configs() -> list[Any]:
        return [triton.Config({"BLOCK": b}, num_warps=4) for b in WIDE_BLOCKS]

    ours = configs()
    assert sorted(ours, key=_tune._predicted_s) == ours  # lanes take them in this order
    kernel = triton.autotune(configs=ours, key=["n"], do_bench=bench)(triple_jit)
    args = (FakeTensor(tl.float32), FakeTensor(tl.float32), 4096)
    pool = _cold_pool()
    try:
        with knobs.compilation.scope():
            knobs.compilation.listener = log
            with pe_autotune.use(pool):
                kernel[(1,)](*args)
        stats = pool.statistics()
    finally:
        pool.terminate_workers()
    ours_launched = gpu.launches[-1]

    # Every config compiled once, in a lane (no worker ever started; the tune's thread compiled
    # none), and the queue gave up each one it held.
    assert sorted(block for _, block, _, _ in log.compiles) == sorted(WIDE_BLOCKS)
    assert all(name.startswith(_lanes.LANE_THREAD_NAME) for name, _, _, _ in log.compiles)
    counts = pe_autotune.statistics()[f"{__name__}.triple_jit"]
    assert (counts.tunes, counts.lanes, counts.workers, counts.caller, counts.failed) == (
        1,
        len(WIDE_BLOCKS),
        0,
        0,
        0,
    )
    assert stats.completed == 0 and stats.cancelled == len(WIDE_BLOCKS)
    # Two lanes compiled at once, and the tune's thread benchmarked while a lane compiled.
    overlapping = [
        (a, b) for a in log.compiles for b in log.compiles if a[0] != b[0] and a[2] < b[2] < a[3]
    ]
    assert overlapping, log.compiles
    assert any(start < at < end for _, at in benched for _, _, start, end in log.compiles)
    # The leaders were timed while lane compiles ran, so they were timed again (load, as a
    # worker's compile is); every other config once.
    times_benched = {b: sum(1 for one, _ in benched if one == b) for b in WIDE_BLOCKS}
    assert times_benched == {b: 2 if b in (32, 64) else 1 for b in WIDE_BLOCKS}

    # Stock Triton on the same scripted timings chooses the same config, with the same timings.
    benched.clear()
    stock = triton.autotune(configs=configs(), key=["n"], do_bench=bench)(triple_jit)
    stock[(1,)](*args)
    assert gpu.launches[-1] == ours_launched
    assert stock.best_config.all_kwargs() == kernel.best_config.all_kwargs()
    assert {c.kwargs["BLOCK"]: t for c, t in stock.configs_timings.items()} == {
        c.kwargs["BLOCK"]: t for c, t in kernel.configs_timings.items()
    }


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_no_compile_moves_to_a_lane_while_a_worker_compiles_for_the_tune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_lanes, "CALLER_LANES", LANES)
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    pool = PrecompileExecutor(1, timeout=120)
    try:
        with knobs.cache.scope():
            knobs.cache.dir = str(tmp_path / "caller-cache")
            # The worker is busy with a task of the tune (a sleep stands in for its compile);
            # the tune's other compiles wait in the queue behind it.
            held = pool.submit(time.sleep, STARTING_S)
            deadline = time.monotonic() + TEST_TIMEOUT_S / 2
            while not held.running():
                assert time.monotonic() < deadline, "the worker never started"
                time.sleep(0.05)
            queued = [
                pe_triton.precompile(
                    triple_jit, signature, {"BLOCK": b}, target="cuda:90", executor=pool
                )
                for b in (64, 128)
            ]
            running = dataclasses.replace(queued[0], task_future=held)
            lanes = _lanes.lanes()
            assert lanes is not None
            feeder = _lanes.Feeder(lanes, [(0.1, running), (0.2, queued[0]), (0.3, queued[1])])
            assert feeder.fill() == 0 and feeder.in_flight == 0
            assert not any(job.rerouted or job.done() for job in queued)
    finally:
        pool.terminate_workers()
        pe_triton.state.reset()


@triton.jit
def asm_jit(x_ptr, n, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    y = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(x_ptr + offs, y, mask=offs < n)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_compile_that_fails_in_a_lane_reaches_triton_as_a_workers_failure_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As test_ptxas_errors_get_inf_and_other_compile_errors_propagate_as_in_triton (the
    # workers' case, tests/test_triton_autotune.py), with every config compiled in a lane.
    monkeypatch.setattr(_lanes, "CALLER_LANES", LANES)
    move = "mov.b32 $0, $1;"
    good = [triton.Config({"ASM": move, "BLOCK": b}) for b in (64, 128, 256)]
    bogus = triton.Config({"ASM": "bogus.op $0, $1;", "BLOCK": 128})  # ptxas rejects it
    not_a_power_of_2 = triton.Config({"ASM": move, "BLOCK": 96})
    failures: list[BaseException] = []

    def post_hook(kwargs: dict[str, Any], exception: BaseException | None) -> None:
        if exception is not None:
            failures.append(exception)

    def bench(kernel_call: Any, quantiles: Any = None) -> list[float]:
        kernel_call()
        return [float(gpu.launches[-1]["BLOCK"])] * 3

    args = (FakeTensor(tl.int32), 128)
    pool = _cold_pool()
    log = LaneLog()
    try:
        with (
            installed(DryRunGPU(), tmp_path / "caller-cache", (asm_jit,)) as gpu,
            knobs.compilation.scope(),
        ):
            knobs.compilation.listener = log
            kernel = triton.autotune(
                configs=[bogus, *good], key=["n"], do_bench=bench, post_hook=post_hook
            )(asm_jit)
            with pe_autotune.use(pool):
                kernel[(1,)](*args)
            assert kernel.configs_timings[bogus] == [float("inf")] * 3
            assert kernel.best_config is good[0]
            assert len(failures) == 1 and isinstance(failures[0], PTXASError)
            counts = pe_autotune.statistics()[f"{__name__}.asm_jit"]
            assert (counts.lanes, counts.failed, counts.caller) == (len(good), 1, 0)

            broken = triton.autotune(
                configs=[good[0], not_a_power_of_2], key=["n"], do_bench=bench
            )(asm_jit)
            with pe_autotune.use(pool), pytest.raises(CompilationError, match="power of 2"):
                broken[(1,)](*args)
        stats = pool.statistics()
    finally:
        pool.terminate_workers()
        pe_triton.state.reset()
    # Each compiled once, all in lanes; neither failure was compiled again by a launch.
    assert sorted(block for _, block, _, _ in log.compiles) == [64, 128, 256]
    assert all(name.startswith(_lanes.LANE_THREAD_NAME) for name, _, _, _ in log.compiles)
    assert stats.completed == 0


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
