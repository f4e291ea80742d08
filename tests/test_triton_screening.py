"""How ``@triton.autotune`` configs are timed under ``precompile_executor.triton.autotune``.

Two parts: the screening rules of ``precompile_executor/triton/_screening.py``, pure functions
tested on numbers; and whole autotunes — real compiles for sm_90 in real workers, launches on the
dry-run GPU of ``tests/dry_run_gpu.py`` — whose benchmarker is scripted: Triton's *default*
benchmarker (what ``driver.active.get_benchmarker()`` returns, the one screening may shorten) is
replaced by one that launches once through Triton's path and returns a known time per config,
with seeded noise that shrinks as the budget grows, and records each call's budget and whether
any of the executor's compiles was still queued or running. docs/triton.md, "Timing integrity"
and "Screening".
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from dry_run_gpu import DryRunGPU, FakeTensor  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from precompile_executor import PrecompileExecutor, stop_idle_workers  # noqa: E402
from precompile_executor import triton as pe_triton  # noqa: E402
from precompile_executor.triton import _autotune_tune as _tune  # noqa: E402
from precompile_executor.triton import _preimport, classify  # noqa: E402
from precompile_executor.triton import autotune as pe_autotune  # noqa: E402

TASK_TIMEOUT_S = 60.0
"""Per-compile timeout of the test executor, so a hung compiler cannot hang a test."""
GRID = (1,)
FULL_REP_MS = 100
"""Triton's default ``rep`` of ``triton.testing.do_bench``: the budget of a full timing."""


@triton.jit
def scale_jit(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0, mask=mask)


CONFIGS = [
    triton.Config({"BLOCK": block}, num_warps=warps)
    for block in (64, 128, 256, 512, 1024)
    for warps in (2, 4)
]
"""Ten configs: enough for screening to save full timings, small enough for 2 workers."""


def _key(launched: dict[str, Any]) -> tuple[int, int]:
    return launched["BLOCK"], launched["num_warps"]


class ScriptedBenchmarker:
    """Triton's default benchmarker, scripted: ``do_bench(fn, warmup=25, rep=100, quantiles=...)``.

    Launches once (Triton's launch path, so the config's kernel must be in the JIT's cache), and
    returns the config's known time times a seeded noise factor whose spread shrinks with the
    square root of ``rep`` (a timing of ``rep`` ms takes proportionally more samples), plus
    ``load`` while any compile of ``executor`` is queued or running (a busy CPU only adds time).

    Attributes:
        calls: per call, ``(config key, rep, compiles unfinished at the call)``.
    """

    def __init__(
        self,
        gpu: DryRunGPU,
        times_ms: dict[tuple[int, int], float],
        *,
        seed: int = 0,
        noise_at_full: float = 0.004,
        load: float = 1.0,
        executor: PrecompileExecutor | None = None,
    ) -> None:
        self.gpu = gpu
        self.times_ms = times_ms
        self.random = random.Random(seed)
        self.noise_at_full = noise_at_full
        self.load = load
        self.executor = executor
        self.calls: list[tuple[tuple[int, int], float, int]] = []

    def unfinished(self) -> int:
        if self.executor is None:
            return 0
        stats = self.executor.statistics()
        return stats.queued + stats.running

    def __call__(
        self,
        fn: Callable[[], None],
        warmup: float = 25,
        rep: float = FULL_REP_MS,
        grad_to_none: Any = None,
        quantiles: Any = None,
        return_mode: str = "mean",
    ) -> list[float]:
        unfinished = self.unfinished()
        fn()
        key = _key(self.gpu.launches[-1])
        self.calls.append((key, rep, unfinished))
        spread = self.noise_at_full * math.sqrt(FULL_REP_MS / rep)
        median = self.times_ms[key] * (1 + self.random.gauss(0, spread))
        if unfinished:
            median *= self.load
        return [median, median * (1 - spread), median * (1 + spread)]

    def timed(self, key: tuple[int, int]) -> list[float]:
        """The budgets ``key`` was timed with, in order."""
        return [rep for k, rep, _ in self.calls if k == key]


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _release_workers() -> Iterator[None]:
    yield
    stop_idle_workers()


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No block, installation or default executor before or after; compiles in workers only (a
    compile in this thread would not overlap a timing, and these tests count overlaps)."""
    monkeypatch.setattr(_tune, "STEALS", False)
    monkeypatch.setattr(_preimport, "PREIMPORTS", False)
    yield
    pe_triton.state.reset()


@pytest.fixture(scope="module")
def executor() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(2, timeout=TASK_TIMEOUT_S, classify=classify) as pool:
        yield pool


@pytest.fixture
def cache_dir(tmp_path: Path) -> Iterator[Path]:
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path / "caller-cache")
        yield tmp_path / "caller-cache"


@pytest.fixture
def new_gpu(cache_dir: Path) -> Iterator[Callable[[], DryRunGPU]]:
    """Make a fresh dry-run GPU Triton's active driver (a new device: empty in-memory caches,
    the same caller cache on disk); the previous driver is restored at the end."""
    previous = driver.__dict__.get("_active")
    made: list[DryRunGPU] = []

    def make() -> DryRunGPU:
        gpu = DryRunGPU()
        made.append(gpu)
        driver.set_active(gpu)
        return gpu

    try:
        yield make
    finally:
        driver.set_active(previous)
        for gpu in made:
            scale_jit.device_caches.pop(gpu.device, None)


def _autotune(
    gpu: DryRunGPU, benchmarker: ScriptedBenchmarker, configs: list[Any] | None = None
) -> Any:
    """A fresh ``@triton.autotune`` of ``scale_jit`` whose default benchmarker is scripted."""
    gpu.get_benchmarker = lambda: benchmarker  # type: ignore[attr-defined]
    return triton.autotune(configs=configs or CONFIGS, key=["n"])(scale_jit)


def _args(n: int = 8192) -> tuple[Any, ...]:
    return (FakeTensor(tl.float32), FakeTensor(tl.float32), n)


def _times(best: tuple[int, int], seed: int) -> dict[tuple[int, int], float]:
    """Known times: ``best`` at 1.0, two rivals 1–3 % behind it, the rest 10–60 % behind."""
    rng = random.Random(seed)
    keys = [_key({"BLOCK": c.kwargs["BLOCK"], "num_warps": c.num_warps}) for c in CONFIGS]
    rivals = rng.sample([k for k in keys if k != best], 2)
    times = {k: 1.1 + 0.5 * rng.random() for k in keys}
    times[best] = 1.0
    for rival in rivals:
        times[rival] = 1.01 + 0.02 * rng.random()
    return times


# -- no re-timing without cause -----------------------------------------------------------------


@pytest.mark.timeout(240)
def test_with_every_compile_landed_before_benchmarking_each_config_is_timed_once(
    executor: PrecompileExecutor, new_gpu: Callable[[], DryRunGPU]
) -> None:
    # A first autotune puts every config's kernel in the caller's cache; a second autotuner of
    # the same kernel, on a new device (empty in-memory caches), finds each compile there as it
    # submits it: every compile has landed before the first benchmark. Two leaders lie within
    # CONFIRM_MARGIN of each other, so only a wrong "timed while compiles ran" would time them
    # again.
    times = {k: 2.0 + i for i, k in enumerate(sorted(_times((128, 4), 0)))}
    times[(128, 4)], times[(64, 2)] = 1.0, 1.05
    first = ScriptedBenchmarker(new_gpu(), times, executor=executor)
    with pe_autotune.use(executor):
        _autotune(first.gpu, first)[GRID](*_args())
    again = ScriptedBenchmarker(new_gpu(), times, executor=executor)
    kernel = _autotune(again.gpu, again)
    before = executor.statistics().completed
    with pe_autotune.use(executor):
        kernel[GRID](*_args())
    assert executor.statistics().completed == before  # nothing compiled: all in the cache
    assert sorted(k for k, _, _ in again.calls) == sorted(times)  # each config timed once
    assert kernel.best_config.kwargs["BLOCK"] == 128 and kernel.best_config.num_warps == 4
