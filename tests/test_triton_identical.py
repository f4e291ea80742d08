"""Configs of one ``@triton.autotune`` tune whose compiled kernels are identical are timed once.

A loop-free row kernel compiles to the same sm_90 binary for every ``num_stages``; a tune under
``precompile_executor.triton.autotune`` times one config per distinct kernel and gives the others
its timing (docs/triton.md, "Identical kernels"). Real compiles for sm_90 in real workers,
launches on the dry-run GPU of ``tests/dry_run_gpu.py``; the benchmarker is scripted, keyed by
what the launch runs (``num_warps``: ``num_stages`` never reaches a launch), so identical kernels
get identical scripted times, as they would on a GPU up to noise.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from dry_run_gpu import DryRunGPU, FakeTensor, installed  # noqa: E402

from precompile_executor import PrecompileExecutor  # noqa: E402
from precompile_executor.triton import _autotune_guard, _autotune_tune, classify  # noqa: E402
from precompile_executor.triton import autotune as pe_autotune  # noqa: E402

TASK_TIMEOUT_S = 60.0
"""Per-compile timeout of the test executor, so a hung compiler cannot hang a test."""
FULL_REP_MS = 100
"""Triton's default ``rep`` of ``triton.testing.do_bench``: the budget of a full timing."""
BLOCK = 1024
WARPS = (1, 2, 4, 8, 16, 32)
STAGES = (1, 2, 3)


@triton.jit
def row_jit(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * n + cols, x * 2.0, mask=mask)


def _configs(**extra: Any) -> list[Any]:
    """A row kernel's grid as in ``examples/library_kernels.row_configs``: 6 ``num_warps`` × 3
    ``num_stages``, 18 configs, 6 distinct kernels."""
    return [
        triton.Config({"BLOCK": BLOCK}, num_warps=w, num_stages=s, **extra)
        for w in WARPS
        for s in STAGES
    ]


class ScriptedBenchmarker:
    """Triton's default benchmarker, scripted: launches once and returns ``[median, p20, p80]``
    from the launched kernel's known time (keyed by ``num_warps``), with seeded noise — its own
    for a screen (``rep`` below Triton's default) and for a full timing — and a screen's offset
    (a short budget's fewer warm-up launches read slower than a full timing)."""

    def __init__(
        self,
        gpu: DryRunGPU,
        times_ms: dict[int, float],
        *,
        seed: int = 0,
        screen_noise: float = 0.0,
        full_noise: float = 0.0,
        screen_bias: float = 0.0,
    ) -> None:
        self.gpu = gpu
        self.times_ms = times_ms
        self.random = random.Random(seed)
        self.screen_noise = screen_noise
        self.full_noise = full_noise
        self.screen_bias = screen_bias
        self.calls: list[tuple[int, float]] = []

    def __call__(
        self,
        fn: Callable[[], None],
        warmup: float = 25,
        rep: float = FULL_REP_MS,
        grad_to_none: Any = None,
        quantiles: Any = None,
        return_mode: str = "mean",
    ) -> list[float]:
        fn()
        warps = self.gpu.launches[-1]["num_warps"]
        self.calls.append((warps, rep))
        short = rep < FULL_REP_MS
        noise = self.random.gauss(0, self.screen_noise if short else self.full_noise)
        median = self.times_ms[warps] * (1 + noise) * (1 + (self.screen_bias if short else 0))
        return [median, median * 0.97, median * 1.03]


pytestmark = pytest.mark.usefixtures("release_idle_workers", "triton_compiles_in_workers_only")


@pytest.fixture(scope="module")
def executor() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(2, timeout=TASK_TIMEOUT_S, classify=classify) as pool:
        yield pool


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One caller cache for the module: the grid compiles once, later tunes find it there."""
    return tmp_path_factory.mktemp("caller-cache")


@pytest.fixture
def new_gpu(cache_dir: Path) -> Iterator[Callable[[], DryRunGPU]]:
    """Make a fresh dry-run GPU Triton's active driver (empty in-memory caches, the module's
    caller cache on disk); each is undone at the end, the last made first."""
    with contextlib.ExitStack() as made:
        yield lambda: made.enter_context(installed(DryRunGPU(), cache_dir, (row_jit,)))


def _args(n: int = 1000) -> tuple[Any, ...]:
    return (FakeTensor(tl.float32), FakeTensor(tl.float32), n)


def _autotune(gpu: DryRunGPU, benchmarker: Any, configs: list[Any], **options: Any) -> Any:
    gpu.get_benchmarker = lambda: benchmarker  # type: ignore[attr-defined]
    return triton.autotune(configs=configs, key=["n"], **options)(row_jit)


def _identical(kernel: Any) -> int:
    return pe_autotune.statistics()[_autotune_guard.kernel_name(kernel)].identical


@pytest.mark.timeout(240)
def test_num_stages_leave_a_loop_free_row_kernels_sm90_binary_unchanged_num_warps_do_not(
    new_gpu: Callable[[], DryRunGPU],
) -> None:
    new_gpu()
    binaries = {}
    for warps in (4, 8):
        for stages in STAGES:
            compiled = row_jit.warmup(
                *_args(), BLOCK=BLOCK, grid=(1,), num_warps=warps, num_stages=stages
            )
            binaries[warps, stages] = hashlib.sha256(compiled.asm["cubin"]).hexdigest()
    assert binaries[4, 1] == binaries[4, 2] == binaries[4, 3]
    assert binaries[8, 1] == binaries[8, 2] == binaries[8, 3]
    assert binaries[4, 1] != binaries[8, 1]


TIMES_MS = {1: 3.0, 2: 2.0, 4: 1.5, 8: 1.0, 16: 1.3, 32: 1.7}
"""One leader clear of the rest by more than ``CONFIRM_MARGIN``: nothing is timed again."""


@pytest.mark.timeout(300)
def test_a_tune_times_each_distinct_kernel_once_and_chooses_as_stock_triton(
    executor: PrecompileExecutor, new_gpu: Callable[[], DryRunGPU]
) -> None:
    configs = _configs()
    ours = ScriptedBenchmarker(new_gpu(), TIMES_MS)
    kernel = _autotune(ours.gpu, ours, configs)
    with pe_autotune.use(executor, screening=False):  # full timings only, as stock's
        kernel[(4,)](*_args())
    assert sorted(w for w, _ in ours.calls) == sorted(WARPS)  # one timing per distinct kernel
    timings = kernel.configs_timings
    for config in configs:
        representative = next(c for c in configs if c.num_warps == config.num_warps)
        assert timings[config] == timings[representative]
    assert _identical(kernel) == len(configs) - len(WARPS)

    stock = ScriptedBenchmarker(new_gpu(), TIMES_MS)
    stock_kernel = _autotune(stock.gpu, stock, _configs())
    stock_kernel[(4,)](*_args())  # no use(): stock Triton, every config timed
    assert len(stock.calls) == len(configs)
    # Of equal timings Triton's min picks the first config in its order: num_stages=1.
    assert configs.index(kernel.best_config) == stock_kernel.configs.index(stock_kernel.best_config)
    assert kernel.best_config.num_warps == 8 and kernel.best_config.num_stages == 1


DYT_TIMES_MS = {1: 1.5, 2: 1.3, 4: 1.15, 8: 1.01, 16: 1.00, 32: 1.10}
"""Like dyt's forward kernel on an H100: ``num_warps=16`` 1 % ahead of ``num_warps=8``."""
TRIALS = 50


def _losses(new_gpu: Callable[[], DryRunGPU], executor: PrecompileExecutor) -> list[int]:
    lost = []
    for seed in range(TRIALS):
        bench = ScriptedBenchmarker(
            new_gpu(),
            DYT_TIMES_MS,
            seed=seed,
            screen_noise=0.015,
            full_noise=0.001,
            screen_bias=0.02,
        )
        kernel = _autotune(bench.gpu, bench, _configs())
        with pe_autotune.use(executor, screening=True):
            kernel[(4,)](*_args())
        if kernel.best_config.num_warps != 16:
            lost.append(seed)
    return lost


@pytest.mark.timeout(600)
def test_with_screening_the_finalists_are_distinct_kernels_and_the_true_best_is_kept(
    executor: PrecompileExecutor,
    new_gpu: Callable[[], DryRunGPU],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Three copies of each kernel, the best 1 % ahead of the next, screens noisier than full
    # timings and offset above them (so a screen never challenges a full timing): timing copies
    # separately, the three finalists can all be copies of the runner-up.
    warm = ScriptedBenchmarker(new_gpu(), DYT_TIMES_MS)
    with pe_autotune.use(executor):
        _autotune(warm.gpu, warm, _configs())[(4,)](*_args())  # compiles land in the cache
    monkeypatch.setattr(_autotune_tune, "MERGES_IDENTICAL", False)
    unmerged = _losses(new_gpu, executor)
    assert unmerged, "timing copies separately never lost the best: the test shows nothing"
    monkeypatch.setattr(_autotune_tune, "MERGES_IDENTICAL", True)
    merged = _losses(new_gpu, executor)
    assert merged == [], f"lost in trials {merged} (unmerged: {unmerged}) of {TRIALS}"


def _no_op_hook(*_: Any, **__: Any) -> None:
    return None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hooked", ["pre_hook", "post_hook", "config_pre_hook", "do_bench"])
def test_hooks_or_an_own_do_bench_merge_nothing(
    executor: PrecompileExecutor, new_gpu: Callable[[], DryRunGPU], hooked: str
) -> None:
    bench = ScriptedBenchmarker(new_gpu(), TIMES_MS)
    configs = _configs(pre_hook=_no_op_hook) if hooked == "config_pre_hook" else _configs()
    options: dict[str, Any] = {}
    if hooked in ("pre_hook", "post_hook"):
        options[hooked] = _no_op_hook
    elif hooked == "do_bench":
        options["do_bench"] = bench
    kernel = _autotune(bench.gpu, bench, configs, **options)
    with pe_autotune.use(executor, screening=False):  # one timing per config: countable
        kernel[(4,)](*_args())
    assert len(bench.calls) == len(configs)
    assert _identical(kernel) == 0
