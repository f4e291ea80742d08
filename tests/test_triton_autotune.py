"""``precompile_executor.triton.autotune``: ``@triton.autotune`` compiling its configs in workers.

Every compile is real (Triton for sm_90, no GPU needed). Without a GPU, the autotunes run on
:class:`DryRunGPU`: Triton's active driver for an sm_90 device whose launches are recorded and
never run. Everything up to the launch is Triton's own — binding, specialisation, the JIT's
caches, loading checks (its shared-memory limit is sm_90's, so Triton raises a real
``OutOfResources``) — and each test's ``do_bench=`` (public API) launches once through it and
returns a timing chosen by the test, so the winner is known; a kernel's own ``do_bench=`` is
never screened, so every config is timed with it as stock would (docs/triton.md, "Screening";
screening itself: ``tests/test_triton_screening.py``). The caller's cache is a fresh
directory per test and every in-process compile is recorded, so "found in the caller's cache"
can only pass if the workers' files were installed under the keys this process's launches use.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from dry_run_gpu import DryRunGPU, FakeTensor, installed  # noqa: E402
from triton import knobs  # noqa: E402
from triton.compiler.errors import CompilationError  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.errors import OutOfResources  # noqa: E402

from precompile_executor import (  # noqa: E402
    PrecompileExecutor,
    WorkerCrashedError,
)
from precompile_executor import triton as pe_triton  # noqa: E402
from precompile_executor.examples import autotune_kernels  # noqa: E402
from precompile_executor.triton import (  # noqa: E402
    UnsupportedTritonError,
    _preimport,  # noqa: E402
    classify,
)
from precompile_executor.triton import _autotune_tune as _tune  # noqa: E402
from precompile_executor.triton import autotune as pe_autotune  # noqa: E402

TASK_TIMEOUT_S = 60.0
"""Per-compile timeout of the test executor, so a hung compiler cannot hang a test."""
LOGGER = "precompile_executor.triton.autotune"
HANG_TIMEOUT_S = 8.0
"""Per-compile timeout of the executor that meets the hanging compile (its cost in the test)."""


# -- kernels ------------------------------------------------------------------------------------


@triton.jit
def double_jit(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


DOUBLE_CONFIGS = [
    triton.Config({"BLOCK": 64}, num_warps=2),
    triton.Config({"BLOCK": 128}, num_warps=4),
    triton.Config({"BLOCK": 256}, num_warps=4),
    triton.Config({"BLOCK": 512}, num_warps=8),
    triton.Config({"BLOCK": 1024}, num_warps=8),
]
DOUBLE_TIMES_MS = {64: 5.0, 128: 3.0, 256: 1.0, 512: 2.0, 1024: 4.0}
"""The timing the fake benchmark gives each BLOCK: BLOCK=256 wins."""


@triton.jit
def dot_jit(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None] * K + rk[None, :]
    b = b_ptr + rk[:, None] * BN + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        acc = tl.dot(tl.load(a), tl.load(b), acc)
        a += BK
        b += BK * BN
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


SMALL_DOT = triton.Config({"BM": 32, "BN": 32, "BK": 32}, num_stages=2, num_warps=4)
HUGE_DOT = triton.Config({"BM": 32, "BN": 32, "BK": 128}, num_stages=16, num_warps=4)
"""16 pipelined stages of 32×128 + 128×32 fp16 tiles: 240 KiB of shared memory, over sm_90's."""


@triton.jit
def asm_jit(x_ptr, n, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    y = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(x_ptr + offs, y, mask=offs < n)


# -- a GPU whose launches do nothing: tests/dry_run_gpu.py ---------------------------------------


class Bench:
    """A ``do_bench=`` that launches once (Triton's launch path) and returns a chosen timing.

    Records, for each call, which config ran and how many of the executor's compiles were
    still queued or running at that moment.
    """

    def __init__(
        self,
        gpu: DryRunGPU,
        times_ms: Callable[[dict[str, Any]], float],
        executor: PrecompileExecutor | None = None,
    ) -> None:
        self.gpu = gpu
        self.times_ms = times_ms
        self.executor = executor
        self.calls: list[dict[str, Any]] = []
        self.unfinished: list[int] = []

    def __call__(self, kernel_call: Callable[[], None], quantiles: Any = None) -> list[float]:
        if self.executor is not None:
            stats = self.executor.statistics()
            self.unfinished.append(stats.queued + stats.running)
        kernel_call()
        launched = self.gpu.launches[-1]
        self.calls.append(launched)
        return [self.times_ms(launched)] * 3


class CompileLog:
    """Every ``triton.compile`` in this process (the caller): kernel name and cache hit."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bool]] = []
        self.compiled_blocks: list[Any] = []
        """The ``BLOCK`` of each compile this process ran itself (not a cache hit)."""

    def __call__(
        self, *, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool
    ) -> None:
        self.events.append((src.name, cache_hit))
        if not cache_hit:
            names = src.fn.arg_names
            constants = {names[path[0]]: value for path, value in src.constants.items()}
            self.compiled_blocks.append(constants.get("BLOCK"))


# -- fixtures -----------------------------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("release_idle_workers")


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    """Each test starts with no block, no installation and no default executor, and leaves none
    (a test that failed inside a block included)."""
    yield
    pe_triton.state.reset()


@pytest.fixture(autouse=True)
def _worker_path_only(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check what happens in the executor's workers (isolation, order, timings):
    the tune's own thread compiles nothing unless a test asks for it with ``steals``."""
    if "steals" not in request.fixturenames:
        monkeypatch.setattr(_tune, "STEALS", False)
    if "preimports" not in request.fixturenames:
        monkeypatch.setattr(_preimport, "PREIMPORTS", False)  # only compiles in the counts


@pytest.fixture
def preimports() -> None:
    """The default: workers import a kernel's module ahead of its configs."""
    assert _preimport.PREIMPORTS


@pytest.fixture
def steals() -> None:
    """The default: the tune's thread compiles queued configs no worker is ready for."""
    assert _tune.STEALS


@pytest.fixture(scope="module")
def executor() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(2, timeout=TASK_TIMEOUT_S, classify=classify) as pool:
        yield pool


@pytest.fixture
def gpu(tmp_path: Path) -> Iterator[DryRunGPU]:
    """A dry-run sm_90 GPU as Triton's active driver, and an empty caller cache."""
    jits = (double_jit, dot_jit, asm_jit, autotune_kernels.faulty_kernel.fn)
    with installed(DryRunGPU(), tmp_path / "caller-cache", jits) as stand_in:
        yield stand_in


@pytest.fixture
def compile_log() -> Iterator[CompileLog]:
    log = CompileLog()
    with knobs.compilation.scope():
        knobs.compilation.listener = log
        yield log


def _double_args(n: int = 4096) -> tuple[Any, ...]:
    return (FakeTensor(tl.float32), FakeTensor(tl.float32), n)


def _completed(executor: PrecompileExecutor) -> int:
    stats = executor.statistics()
    return stats.completed + stats.failed


GRID = (1,)
HAS_AUTOTUNING_LISTENER = "listener" in vars(type(knobs.autotuning))
"""``knobs.autotuning.listener`` exists in Triton 3.9, not in 3.6."""


# -- the seam -----------------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("version", ["3.5.1", "3.7.0", "3.10.0", "4.0.0"])
def test_other_triton_versions_are_refused_and_nothing_is_patched(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = dict(vars(Autotuner))
    with pytest.raises(UnsupportedTritonError, match=rf"found {version}.*Nothing was patched"):
        pe_autotune.check_triton(version=version)
    monkeypatch.setattr("precompile_executor.triton._autotune_seam.triton_version", lambda: version)
    with pytest.raises(UnsupportedTritonError, match="3.6.x and 3.9.x"):
        with pe_autotune.use():
            pytest.fail("the block must not run")
    with pytest.raises(UnsupportedTritonError):
        pe_autotune.install()
    assert dict(vars(Autotuner)) == before
    assert not pe_autotune.installed()


@pytest.mark.timeout(30)
def test_a_changed_autotuner_is_refused_naming_what_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def _bench(self: Any, config: Any) -> None:  # a future Triton's shape
        raise AssertionError("never called")

    monkeypatch.setattr(Autotuner, "_bench", _bench)
    before = dict(vars(Autotuner))
    with pytest.raises(UnsupportedTritonError, match=r"Autotuner\._bench is not a method"):
        with pe_autotune.use():
            pytest.fail("the block must not run")
    assert dict(vars(Autotuner)) == before


@pytest.mark.timeout(30)
def test_the_installed_triton_is_supported() -> None:
    pe_autotune.check_triton()
    assert pe_autotune.triton_version().startswith(pe_autotune.SUPPORTED_TRITON_SERIES)


@pytest.mark.timeout(30)
def test_use_nests_install_is_process_wide_and_both_restore_tritons_methods() -> None:
    stock = {name: vars(Autotuner)[name] for name in ("run", "prune_configs", "_bench")}

    def current() -> dict[str, Any]:
        return {name: vars(Autotuner)[name] for name in stock}

    seen_by_other_thread: list[bool] = []

    def other_thread() -> None:
        seen_by_other_thread.append(pe_autotune.installed())

    def on_other_thread() -> None:
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(10)
        assert not thread.is_alive()

    pool = ThreadPoolExecutor(1)
    assert not pe_autotune.installed()
    with pe_autotune.use(pool):
        assert pe_autotune.installed() and current() != stock
        with pe_autotune.use(ThreadPoolExecutor(1)):
            assert pe_autotune.installed()
        assert current() != stock
        on_other_thread()
    assert current() == stock and not pe_autotune.installed()
    on_other_thread()
    assert seen_by_other_thread == [True, False]  # a block is open for every thread
    pool.shutdown()

    with pytest.raises(KeyError), pe_autotune.use(pool):
        raise KeyError("inside")
    assert current() == stock

    pe_autotune.install(pool)
    try:
        on_other_thread()
        assert seen_by_other_thread == [True, False, True]
        pe_autotune.install(pool)  # again: replaces the executor, still one patch
        with pe_autotune.use(pool):
            pass
        assert current() != stock
    finally:
        pe_autotune.uninstall()
    assert current() == stock and not pe_autotune.installed()
    pe_autotune.uninstall()  # not installed: nothing to do


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", ["pool", 42, PrecompileExecutor])
def test_use_and_install_refuse_what_is_not_an_executor_and_patch_nothing(bad: Any) -> None:
    stock = {name: vars(Autotuner)[name] for name in ("run", "prune_configs", "_bench")}
    with pytest.raises(TypeError, match=r"concurrent\.futures\.Executor"), pe_autotune.use(bad):
        pass
    with pytest.raises(TypeError, match=r"concurrent\.futures\.Executor"):
        pe_autotune.install(bad)
    assert not pe_autotune.installed()
    assert {name: vars(Autotuner)[name] for name in stock} == stock


@pytest.mark.timeout(60)
def test_a_shut_down_executor_is_reported_once_until_reset_and_its_tunes_compile_here(
    gpu: DryRunGPU, compile_log: CompileLog, caplog: pytest.LogCaptureFixture
) -> None:
    closed = PrecompileExecutor(1)
    closed.shutdown()
    bench = Bench(gpu, lambda launched: DOUBLE_TIMES_MS[launched["BLOCK"]])
    kernel = triton.autotune(configs=DOUBLE_CONFIGS[:3], key=["n"], do_bench=bench)(double_jit)
    other = triton.autotune(configs=DOUBLE_CONFIGS[3:], key=["n"], do_bench=bench)(double_jit)
    with caplog.at_level(logging.WARNING, logger=LOGGER), pe_autotune.use(closed):
        kernel[GRID](*_double_args())
        other[GRID](*_double_args())  # a second tune on the same executor: no second report
    assert kernel.best_config is DOUBLE_CONFIGS[2] and other.best_config is DOUBLE_CONFIGS[3]
    assert sorted(compile_log.compiled_blocks) == [64, 128, 256, 512, 1024]  # all here
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1, warnings
    assert "shut down" in warnings[0] and "PrecompileExecutor" in warnings[0]
    assert "compiles its configs in this process" in warnings[0]
    # reset() forgets whom it told, as it forgets the rest: the same executor is reported again.
    pe_triton.state.reset()
    caplog.clear()
    fresh = [triton.Config({"BLOCK": 64}, num_warps=1), triton.Config({"BLOCK": 128}, num_warps=1)]
    again = triton.autotune(configs=fresh, key=["n"], do_bench=bench)(double_jit)  # not compiled
    with caplog.at_level(logging.WARNING, logger=LOGGER), pe_autotune.use(closed):
        again[GRID](*_double_args())
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1 and "shut down" in warnings[0], warnings


@pytest.mark.timeout(120)
def test_state_reset_closes_every_holder_stops_the_default_and_forgets_it() -> None:
    stock = dict(vars(Autotuner))
    block = pe_autotune.use()
    block.__enter__()  # left open on purpose: reset() closes it
    pe_autotune.install()
    state = pe_triton.state
    default, warming = state.default, state.warming
    assert isinstance(default, PrecompileExecutor) and warming is not None
    with state.lock:
        state.announced.setdefault(default, set()).add("some_kernels")
    assert dict(vars(Autotuner)) != stock

    state.reset()

    assert not pe_autotune.installed() and dict(vars(Autotuner)) == stock
    assert state.default is None and state.warming is None and len(state.announced) == 0
    assert not warming.is_alive()
    with pytest.raises(RuntimeError):
        default.submit(int)  # shut down
    block.__exit__(None, None, None)  # the owner's late exit does nothing
    assert not pe_autotune.installed() and dict(vars(Autotuner)) == stock


@pytest.mark.timeout(30)
def test_a_default_executor_that_cannot_start_leaves_nothing_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from precompile_executor.triton import _autotune_seam

    stock = dict(vars(Autotuner))

    def cannot_start() -> None:
        raise OSError("no processes left")

    monkeypatch.setattr(_autotune_seam, "start_default_warm_up", cannot_start)
    with pytest.raises(OSError, match="no processes left"), pe_autotune.use():
        pytest.fail("the block must not run")
    with pytest.raises(OSError, match="no processes left"):
        pe_autotune.install()
    assert not pe_autotune.installed() and dict(vars(Autotuner)) == stock


class CountingThreads(ThreadPoolExecutor):
    """A thread pool that counts the tasks submitted to it (compiles run in this process)."""

    def __init__(self) -> None:
        super().__init__(2)
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


@pytest.mark.timeout(120)
def test_the_innermost_use_gets_the_compiles(gpu: DryRunGPU) -> None:
    outer, inner = CountingThreads(), CountingThreads()
    bench = Bench(gpu, lambda launched: DOUBLE_TIMES_MS[launched["BLOCK"]])
    kernel = triton.autotune(configs=DOUBLE_CONFIGS[:2], key=["n"], do_bench=bench)(double_jit)
    try:
        with pe_autotune.use(outer), pe_autotune.use(inner):
            kernel[GRID](*_double_args())
    finally:
        outer.shutdown()
        inner.shutdown()
    assert (outer.submitted, inner.submitted) == (0, 2)


class BatchingThreads(CountingThreads):
    """Counting threads with a ``max_workers`` and a ``batch()`` that records its use."""

    def __init__(self, max_workers: int) -> None:
        super().__init__()
        self.max_workers = max_workers
        self.events: list[str] = []
        self.submitted_configs: list[tuple[int, int]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.events.append("submit")
        request = args[0]  # compile_request(request): which config, by BLOCK and num_warps
        names = list(request.signature)
        block = next(v for p, v in request.constexprs.items() if names[p[0]] == "BLOCK")
        self.submitted_configs.append(
            (getattr(block, "value", block), request.options["num_warps"])
        )
        return super().submit(fn, *args, **kwargs)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        self.events.append("batch")
        yield
        self.events.append("release")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("max_workers", "expected"),
    [
        (1, ["submit", "batch", "submit", "submit", "release"]),  # more configs than workers
        (2, ["submit", "submit", "batch", "submit", "release"]),
        (3, ["submit", "submit", "submit"]),  # they all fit: nothing is held back
    ],
)
def test_the_shortest_compiles_start_at_once_one_per_worker_and_the_rest_wait_as_a_batch(
    gpu: DryRunGPU, max_workers: int, expected: list[str]
) -> None:
    pool = BatchingThreads(max_workers)
    bench = Bench(gpu, lambda launched: DOUBLE_TIMES_MS[launched["BLOCK"]])
    # Listed longest predicted first (per thread: 1024/8 warps 4 elements, 256/4 2, 128/4 1).
    configs = [DOUBLE_CONFIGS[4], DOUBLE_CONFIGS[2], DOUBLE_CONFIGS[1]]
    kernel = triton.autotune(configs=configs, key=["n"], do_bench=bench)(double_jit)
    try:
        with pe_autotune.use(pool):
            kernel[GRID](*_double_args())
    finally:
        pool.shutdown()
    assert pool.events == expected
    # The first wave shortest first; the held batch as listed (the executor orders it).
    assert pool.submitted_configs == [(128, 4), (256, 4), (1024, 8)]
    assert kernel.best_config.kwargs["BLOCK"] == 256


# -- a new tuning key ---------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_new_key_compiles_each_pruned_config_in_workers_and_benchmarks_it_from_the_cache(
    executor: PrecompileExecutor, gpu: DryRunGPU, compile_log: CompileLog
) -> None:
    bench = Bench(gpu, lambda launched: DOUBLE_TIMES_MS[launched["BLOCK"]], executor)
    pruned_away = DOUBLE_CONFIGS[0]
    told: list[dict[str, Any]] = []

    def prune(configs: list[Any], named_args: dict[str, Any], **kwargs: Any) -> list[Any]:
        return [c for c in configs if c is not pruned_away]

    kernel = triton.autotune(
        configs=DOUBLE_CONFIGS,
        key=["n"],
        prune_configs_by={"early_config_prune": prune},
        do_bench=bench,
    )(double_jit)
    before = _completed(executor)
    with knobs.autotuning.scope():
        knobs.autotuning.listener = lambda **event: told.append(event)
        with pe_autotune.use(executor):
            kernel[GRID](*_double_args())

    pruned = DOUBLE_CONFIGS[1:]
    assert _completed(executor) - before == len(pruned)  # one compile per pruned config
    assert compile_log.events == []  # nothing compiled in this process: every launch hit the cache
    # Each pruned config was benchmarked (leaders timed while compiles ran, once more after).
    assert {c["BLOCK"] for c in bench.calls} == {c.kwargs["BLOCK"] for c in pruned}
    # Benchmarking began while other configs were still compiling.
    assert bench.unfinished[0] > 0
    assert kernel.best_config is pruned[1]  # BLOCK=256
    assert gpu.launches[-1]["BLOCK"] == 256  # and the call itself ran with it
    assert set(kernel.configs_timings) == set(pruned)
    assert kernel.configs_timings[pruned[1]] == [1.0] * 3
    assert kernel.bench_time > 0
    if HAS_AUTOTUNING_LISTENER:
        assert len(told) == 1 and told[0]["cache_hit"] is False
        assert told[0]["best_config"] is pruned[1]

    # The same key again: Triton's own cache answers; nothing is compiled or benchmarked.
    calls = len(bench.calls)
    with pe_autotune.use(executor):
        kernel[GRID](*_double_args())
    assert _completed(executor) - before == len(pruned)
    assert len(bench.calls) == calls and compile_log.events == []
    assert gpu.launches[-1]["BLOCK"] == 256


def _tune_under_load(
    executor: PrecompileExecutor, gpu: DryRunGPU, quiet_ms: dict[int, float], load: float
) -> tuple[Any, list[tuple[int, bool]]]:
    """Autotune ``double_jit`` over ``DOUBLE_CONFIGS`` with a benchmark that reports ``load`` ×
    the quiet time while any compile of the tune is unfinished (a busy CPU only adds time);
    return the kernel and each benchmark's (BLOCK, every compile had finished)."""
    before = _completed(executor)
    calls: list[tuple[int, bool]] = []

    def times_ms(launched: dict[str, Any]) -> float:
        finished = _completed(executor) - before == len(DOUBLE_CONFIGS)
        calls.append((launched["BLOCK"], finished))
        return quiet_ms[launched["BLOCK"]] * (1.0 if finished else load)

    kernel = triton.autotune(configs=DOUBLE_CONFIGS, key=["n"], do_bench=Bench(gpu, times_ms))(
        double_jit
    )
    with pe_autotune.use(executor):
        kernel[GRID](*_double_args(8192))
    assert _completed(executor) - before == len(DOUBLE_CONFIGS)
    return kernel, calls


@pytest.mark.timeout(180)
def test_leaders_within_noise_timed_while_compiles_ran_are_timed_again_and_decide(
    executor: PrecompileExecutor, gpu: DryRunGPU
) -> None:
    # Quietly BLOCK=128 wins (1.0) over BLOCK=64 (1.05), within CONFIRM_MARGIN of each other;
    # both are in the first wave (the shortest predicted compiles), so they are screened while
    # the rest compile, at 1.08× (within the margin): the screening alone could pick either.
    quiet_ms = {64: 1.05, 128: 1.0, 256: 3.0, 512: 4.0, 1024: 5.0}
    kernel, calls = _tune_under_load(executor, gpu, quiet_ms, load=1.08)
    noisy = [block for block, finished in calls if not finished]
    assert {64, 128} & set(noisy)  # a leader was screened while compiles still ran
    # Each leader screened so was timed again after the last compile had finished, and that
    # quiet timing is the one Triton's loop recorded; the others were timed once.
    timings = {c.kwargs["BLOCK"]: t[0] for c, t in kernel.configs_timings.items()}
    for block in (64, 128):
        if block in noisy:
            assert (block, True) in calls[calls.index((block, False)) + 1 :]
        assert timings[block] == quiet_ms[block]
    for block in (256, 512, 1024):
        assert [b for b, _ in calls].count(block) == 1
    assert kernel.best_config.kwargs["BLOCK"] == 128
    assert gpu.launches[-1]["BLOCK"] == 128
    # Nothing is timed more than twice (screening, then at most one confirmation). Not "only
    # what this test saw as noisy": the test reads "every compile finished" from the executor's
    # statistics, which can trail the futures the tune watches, so a timing this test counts as
    # quiet may still have been screened before the tune saw its last compile land (seen on an
    # H200).
    assert all(calls.count(call) + calls.count((call[0], not call[1])) <= 2 for call in calls)


@pytest.mark.timeout(180)
def test_a_winner_clear_of_the_noise_is_not_timed_again(
    executor: PrecompileExecutor, gpu: DryRunGPU
) -> None:
    quiet_ms = {64: 3.0, 128: 1.0, 256: 4.0, 512: 5.0, 1024: 6.0}
    kernel, calls = _tune_under_load(executor, gpu, quiet_ms, load=1.08)
    assert sorted(b for b, _ in calls) == [64, 128, 256, 512, 1024]  # each benchmarked once
    assert kernel.best_config.kwargs["BLOCK"] == 128


@pytest.mark.timeout(180)
def test_hooks_resets_and_restores_run_as_in_stock_triton(
    executor: PrecompileExecutor, gpu: DryRunGPU
) -> None:
    def autotune_once(dry_gpu: DryRunGPU, in_workers: bool) -> tuple[list[Any], Any]:
        events: list[Any] = []
        configs = [
            triton.Config({"BLOCK": 128}, num_warps=4),
            triton.Config(
                {"BLOCK": 256}, num_warps=4, pre_hook=lambda nargs: events.append("config hook")
            ),
            triton.Config({"BLOCK": 512}, num_warps=8),
        ]
        x, out = FakeTensor(tl.float32, events), FakeTensor(tl.float32, events)
        bench = Bench(dry_gpu, lambda launched: DOUBLE_TIMES_MS[launched["BLOCK"]])
        kernel = triton.autotune(
            configs=configs,
            key=["n"],
            reset_to_zero=["out_ptr"],
            restore_value=["x_ptr"],
            do_bench=bench,
        )(double_jit)
        if in_workers:
            with pe_autotune.use(executor):
                kernel[GRID](x, out, 4096)
        else:
            kernel[GRID](x, out, 4096)
        timings = {str(c): t for c, t in kernel.configs_timings.items()}
        benched = [launched["BLOCK"] for launched in bench.calls]
        return sorted(events), benched, (str(kernel.best_config), timings, dry_gpu.launches[-1])

    ours = autotune_once(gpu, in_workers=True)
    stock_gpu = DryRunGPU()  # a fresh device: stock compiles (from the disk cache) in-process
    driver.set_active(stock_gpu)
    try:
        stock = autotune_once(stock_gpu, in_workers=False)
    finally:
        driver.set_active(gpu)
        double_jit.device_caches.pop(stock_gpu.device, None)
    assert ours[2] == stock[2]  # the same timings, choice and final launch
    assert sorted(set(ours[1])) == sorted(stock[1]) == [128, 256, 512]
    # Every benchmark runs the hooks, resets and restores as Triton's _bench does, stock's once
    # per config, ours also for each leader timed again after the last compile landed.
    for events, benched in (stock[:2], ours[:2]):
        assert events.count("zero_") == len(benched) + 1  # once more to reset after tuning
        assert events.count("clone") == events.count("copy_") == len(benched)
        # Its benchmarks, and the call that used it.
        assert events.count("config hook") == benched.count(256) + 1
    assert stock[0].count("zero_") == 4


@pytest.mark.timeout(180)
def test_cache_results_a_disk_hit_compiles_nothing(
    executor: PrecompileExecutor, gpu: DryRunGPU, compile_log: CompileLog
) -> None:
    configs = DOUBLE_CONFIGS[1:4]
    first = Bench(gpu, lambda launched: DOUBLE_TIMES_MS[launched["BLOCK"]])
    kernel = triton.autotune(configs=configs, key=["n"], do_bench=first, cache_results=True)(
        double_jit
    )
    with pe_autotune.use(executor):
        kernel[GRID](*_double_args())
    assert {c["BLOCK"] for c in first.calls} == {c.kwargs["BLOCK"] for c in configs}

    # A fresh autotuner (a new process, say) with the same configs finds the timings on disk.
    again = Bench(gpu, lambda launched: DOUBLE_TIMES_MS[launched["BLOCK"]])
    fresh = triton.autotune(configs=configs, key=["n"], do_bench=again, cache_results=True)(
        double_jit
    )
    before = _completed(executor)
    with pe_autotune.use(executor):
        fresh[GRID](*_double_args())
    assert _completed(executor) == before and again.calls == []
    assert str(fresh.best_config) == str(kernel.best_config)
    assert compile_log.events == []


# -- every thread, one tune per kernel, compiles here -------------------------------------------


def _double_kernel(gpu: DryRunGPU, configs: list[Any] | None = None) -> tuple[Any, Bench]:
    bench = Bench(gpu, lambda launched: DOUBLE_TIMES_MS[launched["BLOCK"]])
    configs = DOUBLE_CONFIGS[1:4] if configs is None else configs
    return triton.autotune(configs=configs, key=["n"], do_bench=bench)(double_jit), bench


@pytest.mark.timeout(240)
def test_autotunes_on_any_thread_compile_in_the_workers_while_a_block_is_open(
    executor: PrecompileExecutor, gpu: DryRunGPU, compile_log: CompileLog
) -> None:
    # Four kernels with configs of their own (num_warps differs), so each compiles its own.
    kernels = [
        _double_kernel(gpu, [triton.Config({"BLOCK": b}, num_warps=w) for b in (128, 256, 512)])
        for w in (1, 2, 4, 8)
    ]
    errors: list[BaseException] = []

    def tune(index: int) -> None:
        try:
            kernels[index][0][GRID](*_double_args())
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    go = threading.Event()
    early = threading.Thread(target=lambda: go.wait(60) and tune(2))
    early.start()  # a thread that exists before the block
    before = _completed(executor)
    with pe_autotune.use(executor):
        plain = threading.Thread(target=tune, args=(0,))
        plain.start()
        plain.join(120)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(tune, 1).result(120)
        go.set()
        early.join(120)
        assert not plain.is_alive() and not early.is_alive()
    assert errors == []
    assert _completed(executor) - before == 3 * 3  # every config of the three, in workers
    assert compile_log.compiled_blocks == []  # none compiled in this process
    for kernel, _ in kernels[:3]:
        assert kernel.best_config.kwargs["BLOCK"] == 256

    # The block is closed: another thread's autotune is stock Triton's again.
    after = threading.Thread(target=tune, args=(3,))
    after.start()
    after.join(120)
    assert errors == [] and _completed(executor) - before == 9
    assert kernels[3][0].best_config.kwargs["BLOCK"] == 256


@pytest.mark.timeout(120)
def test_an_inner_block_wins_on_its_thread_and_other_threads_follow_the_newest(
    gpu: DryRunGPU,
) -> None:
    outer, inner = CountingThreads(), CountingThreads()
    entered, leave = threading.Event(), threading.Event()
    kernels = [
        _double_kernel(gpu, [triton.Config({"BLOCK": b}, num_warps=w) for b in (128, 256)])[0]
        for w in (1, 2, 4)
    ]

    def with_inner_block() -> None:
        with pe_autotune.use(inner):
            kernels[0][GRID](*_double_args())  # its own block: inner
            entered.set()
            leave.wait(60)

    try:
        with pe_autotune.use(outer):
            thread = threading.Thread(target=with_inner_block)
            thread.start()
            assert entered.wait(120)
            kernels[1][GRID](*_double_args())  # this thread's own block: outer
            with ThreadPoolExecutor(1) as pool:  # no block of its own: the newest, inner
                pool.submit(lambda: kernels[2][GRID](*_double_args())).result(120)
            leave.set()
            thread.join(60)
    finally:
        leave.set()
        outer.shutdown()
        inner.shutdown()
    assert (outer.submitted, inner.submitted) == (2, 4)


@pytest.mark.timeout(240)
def test_two_threads_cold_autotuning_one_kernel_tune_it_once(
    executor: PrecompileExecutor, gpu: DryRunGPU, compile_log: CompileLog
) -> None:
    kernel, bench = _double_kernel(gpu)
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def launch() -> None:
        try:
            start.wait(30)
            kernel[GRID](*_double_args())
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    before = _completed(executor)
    with pe_autotune.use(executor):
        threads = [threading.Thread(target=launch) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
    assert errors == []  # stock Triton: a TypeError from the shared Autotuner.nargs (#11494)
    assert _completed(executor) - before == 3  # each config compiled once
    assert compile_log.compiled_blocks == []
    assert sorted({c["BLOCK"] for c in bench.calls}) == [128, 256, 512]  # one tune's benchmarks
    assert len(kernel.cache) == 1 and kernel.best_config.kwargs["BLOCK"] == 256
    assert [launched["BLOCK"] for launched in gpu.launches[-2:]] == [256, 256]  # both calls


@pytest.mark.timeout(240)
def test_a_tune_running_when_the_last_block_closes_finishes_with_tritons_methods(
    executor: PrecompileExecutor, gpu: DryRunGPU
) -> None:
    inside, closed = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def times_ms(launched: dict[str, Any]) -> float:
        inside.set()
        assert closed.wait(60)  # the block closes while this tune benchmarks
        return DOUBLE_TIMES_MS[launched["BLOCK"]]

    kernel = triton.autotune(configs=DOUBLE_CONFIGS, key=["n"], do_bench=Bench(gpu, times_ms))(
        double_jit
    )

    def tune() -> None:
        try:
            kernel[GRID](*_double_args())
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    thread = threading.Thread(target=tune)
    with pe_autotune.use(executor):
        thread.start()
        assert inside.wait(120)
    assert vars(Autotuner)["_bench"] is pe_triton.state.originals["_bench"]  # restored meanwhile
    closed.set()
    thread.join(120)
    assert not thread.is_alive() and errors == []
    assert kernel.best_config.kwargs["BLOCK"] == 256
    assert gpu.launches[-1]["BLOCK"] == 256


BLOCKER_WAIT_S = 120.0


def _wait_for_file(path: str) -> None:
    """A task that holds its worker until ``path`` exists (at most ``BLOCKER_WAIT_S``)."""
    import os
    import time

    deadline = time.monotonic() + BLOCKER_WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


@pytest.mark.timeout(240)
def test_while_no_worker_is_ready_the_callers_thread_compiles_each_config_once(
    steals: None, gpu: DryRunGPU, compile_log: CompileLog, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    kernel, bench = _double_kernel(gpu, DOUBLE_CONFIGS)
    with PrecompileExecutor(1, timeout=TASK_TIMEOUT_S * 3, classify=classify) as pool:
        blocker = pool.submit(_wait_for_file, str(release))
        _wait_until(lambda: pool.statistics().running == 1)  # its only worker is taken
        with pe_autotune.use(pool):
            kernel[GRID](*_double_args())
        release.touch()
        blocker.result(BLOCKER_WAIT_S)
        stats = pool.statistics()
    # Every config was taken back from the queue and compiled here, once each; no worker ran one.
    assert sorted(compile_log.compiled_blocks) == [64, 128, 256, 512, 1024]
    assert stats.completed == 1 and stats.cancelled == len(DOUBLE_CONFIGS)
    assert kernel.best_config.kwargs["BLOCK"] == 256  # the same winner as stock Triton's
    assert gpu.launches[-1]["BLOCK"] == 256


@pytest.mark.timeout(240)
def test_the_callers_thread_and_the_workers_share_the_queue_without_compiling_twice(
    steals: None, gpu: DryRunGPU, compile_log: CompileLog, tmp_path: Path
) -> None:
    import site

    kernel, bench = _double_kernel(gpu, DOUBLE_CONFIGS)
    # A cold worker (an initializer of this test's own: no pooled worker fits): this thread
    # compiles queued configs until the worker is ready, then the worker takes the rest.
    with PrecompileExecutor(
        1,
        initializer=site.addsitedir,
        initargs=(str(tmp_path),),
        timeout=TASK_TIMEOUT_S,
        classify=classify,
    ) as pool:
        with pe_autotune.use(pool):
            kernel[GRID](*_double_args())
        stats = pool.statistics()
    here = compile_log.compiled_blocks
    assert len(here) == len(set(here))
    assert stats.completed + len(here) == len(DOUBLE_CONFIGS)  # each compiled exactly once
    assert stats.cancelled == len(here)
    assert kernel.best_config.kwargs["BLOCK"] == 256
    assert {c["BLOCK"] for c in bench.calls} == {64, 128, 256, 512, 1024}


_WARMLIB_INIT = """
import os

import triton
import triton.language as tl

with open(os.environ["PE_WARMLIB_MARKER"], "a") as marker:
    marker.write(f"{os.getpid()}\\n")  # who imported this package


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0, mask=mask)


import pe_warm_hook  # the test's: how to autotune and call a kernel on the dry-run GPU

scale = pe_warm_hook.autotuned(scale_kernel)
pe_warm_hook.call(scale)  # the library warms its kernel while it imports
"""

_WARMLIB_LATER = """
import triton
import triton.language as tl

import pe_warm_hook


@triton.jit
def shift_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


shift = pe_warm_hook.autotuned(shift_kernel)
"""


@pytest.mark.timeout(240)
def test_a_kernel_called_while_its_package_imports_is_never_imported_by_a_worker(
    gpu: DryRunGPU, compile_log: CompileLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib
    import os
    import site
    import sys
    import types

    name = f"pe_warmlib_{uuid.uuid4().hex[:8]}"
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text(_WARMLIB_INIT)
    (package / "later.py").write_text(_WARMLIB_LATER)
    imports = tmp_path / "imports"
    monkeypatch.setenv("PE_WARMLIB_MARKER", str(imports))
    hook = types.ModuleType("pe_warm_hook")
    hook.autotuned = (
        lambda fn: triton.autotune(  # type: ignore[attr-defined]
            configs=DOUBLE_CONFIGS[1:4],
            key=["n"],
            do_bench=Bench(gpu, lambda launched: DOUBLE_TIMES_MS[launched["BLOCK"]]),
        )(fn)
    )
    hook.call = lambda kernel: kernel[GRID](*_double_args())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pe_warm_hook", hook)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with (
            # Fresh workers that can import the package (this test's path is their initializer's).
            PrecompileExecutor(
                2,
                initializer=site.addsitedir,
                initargs=(str(tmp_path),),
                timeout=TASK_TIMEOUT_S,
                classify=classify,
            ) as pool,
            pe_autotune.use(pool),
        ):
            library = importlib.import_module(name)  # tunes scale while importing
            later = importlib.import_module(f"{name}.later")
            later.shift[GRID](*_double_args())  # a kernel of the same package, after its import
            stats = pool.statistics()
        assert pe_autotune.imports_that_launch() >= {name}
    finally:
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]
    assert imports.read_text().split() == [str(os.getpid())]  # no worker imported the package
    assert stats.completed == 2 * 3  # both kernels' configs compiled in the workers
    assert compile_log.compiled_blocks == []
    assert library.scale.best_config.kwargs["BLOCK"] == 256
    assert later.shift.best_config.kwargs["BLOCK"] == 256


_PLAINLIB_INIT = """
import os

import triton
import triton.language as tl

with open(os.environ["PE_PLAINLIB_MARKER"], "a") as marker:
    marker.write(f"{os.getpid()}\\n")  # who imported this package


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0, mask=mask)
"""


@pytest.mark.timeout(240)
def test_each_worker_imports_a_kernels_module_in_a_task_of_its_own_before_the_configs(
    preimports: None,
    gpu: DryRunGPU,
    compile_log: CompileLog,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib
    import os
    import site
    import sys

    name = f"pe_plainlib_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(_PLAINLIB_INIT)
    imports = tmp_path / "imports"
    monkeypatch.setenv("PE_PLAINLIB_MARKER", str(imports))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        library = importlib.import_module(name)
        bench = Bench(gpu, lambda launched: DOUBLE_TIMES_MS[launched["BLOCK"]])
        kernel = triton.autotune(configs=DOUBLE_CONFIGS[1:4], key=["n"], do_bench=bench)(
            library.scale_kernel
        )
        with PrecompileExecutor(
            2,
            initializer=site.addsitedir,
            initargs=(str(tmp_path),),
            timeout=TASK_TIMEOUT_S,
            classify=classify,
        ) as pool:
            workers = set(pool.warm_up(TASK_TIMEOUT_S))
            with pe_autotune.use(pool):
                kernel[GRID](*_double_args())
            stats = pool.statistics()
    finally:
        sys.modules.pop(name, None)
    importers = imports.read_text().split()
    assert importers[0] == str(os.getpid())
    assert {int(pid) for pid in importers[1:]} <= workers  # workers, each once
    assert len(importers[1:]) == len(set(importers[1:])) >= 1
    assert stats.completed == 3 + len(workers)  # the configs, and one import task per worker
    assert compile_log.compiled_blocks == []
    assert kernel.best_config.kwargs["BLOCK"] == 256


@pytest.mark.timeout(300)
def test_use_without_an_executor_starts_the_warm_default_at_once_and_tunes_through_it(
    steals: None, gpu: DryRunGPU, compile_log: CompileLog
) -> None:
    import os

    from precompile_executor.triton._prewarm import WORKER_NICENESS

    kernel, bench = _double_kernel(gpu, DOUBLE_CONFIGS)
    with pe_autotune.use():
        default = pe_triton.state.default
        assert default is not None
        warming = [t for t in threading.enumerate() if t.name.endswith("triton-warm-up")]
        before = default.statistics()
        kernel[GRID](*_double_args())
        after = default.statistics()
    assert isinstance(default, PrecompileExecutor) and warming  # started as the block opened
    # Each config compiled once: in a worker, or here while no worker was ready for it.
    here = compile_log.compiled_blocks
    assert len(here) == len(set(here))
    assert after.completed - before.completed + len(here) == len(DOUBLE_CONFIGS)
    assert after.cancelled - before.cancelled == len(here)
    assert kernel.best_config.kwargs["BLOCK"] == 256
    # Its workers: warm (prewarm_worker in their template), niced, and with no GPU to touch.
    own = os.nice(0)
    assert default.submit(os.nice, 0).result(120) == own + WORKER_NICENESS
    assert default.submit(os.getenv, "CUDA_VISIBLE_DEVICES").result(120) == ""


_INSTALLLIB_INIT = """
from precompile_executor.triton import autotune as pe_autotune

pe_autotune.install()  # a library that opens the integration when imported


def state():
    import psutil

    from precompile_executor import triton
    from precompile_executor.triton import _worker

    return (
        _worker.in_compile_worker,
        pe_autotune.installed(),
        triton.state.default is None,
        len(psutil.Process().children(recursive=True)),
    )
"""


@pytest.mark.timeout(240)
def test_a_library_that_installs_at_import_starts_no_pool_in_a_worker_that_imports_it(
    tmp_path: Path,
) -> None:
    import os
    import site

    from precompile_executor.triton._worker import import_modules

    name = f"pe_installlib_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(_INSTALLLIB_INIT)
    with PrecompileExecutor(
        1, initializer=site.addsitedir, initargs=(str(tmp_path),), timeout=TASK_TIMEOUT_S
    ) as pool:
        assert pool.submit(import_modules, (name,), os.getpid()).result(120) == []
        probe = f"__import__({name!r}).state()"  # evaluated in the worker, plain data back
        in_worker, installed, no_default, children = pool.submit(eval, probe).result(120)
    assert in_worker and installed  # the library's install() ran there, patching only
    assert no_default and children == 0  # and started no executor, no process


_EDITED_V1 = """
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0, mask=mask)
"""


@pytest.mark.timeout(240)
def test_a_kernel_no_worker_can_load_is_compiled_here_as_stock(
    gpu: DryRunGPU, compile_log: CompileLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib
    import os
    import site
    import sys
    import time

    name = f"pe_edited_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(_EDITED_V1)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = importlib.import_module(name)
        # Edited on disk after this process imported it: a worker importing it, or rebuilding
        # it from the file's source, gets another kernel than this process's (KernelTransferError
        # in the worker); this process still holds, and can compile, its own.
        path.write_text(_EDITED_V1.replace("* 3.0", "* 4.0"))
        os.utime(path, (time.time() + 5, time.time() + 5))
        bench = Bench(gpu, lambda launched: DOUBLE_TIMES_MS[launched["BLOCK"]])
        kernel = triton.autotune(configs=DOUBLE_CONFIGS[1:4], key=["n"], do_bench=bench)(
            module.scale_kernel
        )
        with (
            PrecompileExecutor(
                2,
                initializer=site.addsitedir,
                initargs=(str(tmp_path),),
                timeout=TASK_TIMEOUT_S,
                classify=classify,
            ) as pool,
            pe_autotune.use(pool),
        ):
            kernel[GRID](*_double_args())
    finally:
        sys.modules.pop(name, None)
    assert sorted(compile_log.compiled_blocks) == [128, 256, 512]  # each compiled here, once
    assert kernel.best_config.kwargs["BLOCK"] == 256


# -- failures -----------------------------------------------------------------------------------


def _dot_args() -> tuple[Any, ...]:
    return (FakeTensor(tl.float16), FakeTensor(tl.float16), FakeTensor(tl.float32), 1024)


@pytest.mark.timeout(180)
def test_a_config_over_sm90s_shared_memory_gets_inf_from_tritons_own_check(
    executor: PrecompileExecutor, gpu: DryRunGPU, compile_log: CompileLog
) -> None:
    failures: list[BaseException] = []

    def post_hook(kwargs: dict[str, Any], exception: BaseException | None) -> None:
        if exception is not None:
            failures.append(exception)

    bench = Bench(gpu, lambda launched: 1.0)
    kernel = triton.autotune(
        configs=[HUGE_DOT, SMALL_DOT], key=["K"], do_bench=bench, post_hook=post_hook
    )(dot_jit)
    with pe_autotune.use(executor):
        kernel[GRID](*_dot_args())
    assert kernel.configs_timings[HUGE_DOT] == [float("inf")] * 3
    assert kernel.best_config is SMALL_DOT
    assert len(failures) == 1 and isinstance(failures[0], OutOfResources)
    assert compile_log.events == []


@pytest.mark.timeout(180)
def test_when_every_config_fails_the_call_raises_what_triton_raises(
    executor: PrecompileExecutor, gpu: DryRunGPU
) -> None:
    huge_too = triton.Config({"BM": 32, "BN": 32, "BK": 128}, num_stages=16, num_warps=8)
    kernel = triton.autotune(
        configs=[HUGE_DOT, huge_too], key=["K"], do_bench=Bench(gpu, lambda launched: 1.0)
    )(dot_jit)
    with pe_autotune.use(executor), pytest.raises(OutOfResources):
        kernel[GRID](*_dot_args())
    assert list(kernel.configs_timings.values()) == [[float("inf")] * 3] * 2


@pytest.mark.timeout(180)
def test_ptxas_errors_get_inf_and_other_compile_errors_propagate_as_in_triton(
    executor: PrecompileExecutor, gpu: DryRunGPU, compile_log: CompileLog
) -> None:
    good = triton.Config({"ASM": "mov.b32 $0, $1;", "BLOCK": 128})
    bogus = triton.Config({"ASM": "bogus.op $0, $1;", "BLOCK": 128})  # ptxas rejects it
    not_a_power_of_2 = triton.Config({"ASM": "mov.b32 $0, $1;", "BLOCK": 96})
    bench = Bench(gpu, lambda launched: 1.0)
    args = (FakeTensor(tl.int32), 128)
    kernel = triton.autotune(configs=[bogus, good], key=["n"], do_bench=bench)(asm_jit)
    with pe_autotune.use(executor):
        kernel[GRID](*args)
    assert kernel.configs_timings[bogus] == [float("inf")] * 3
    assert kernel.best_config is good

    broken = triton.autotune(configs=[good, not_a_power_of_2], key=["n"], do_bench=bench)(asm_jit)
    with pe_autotune.use(executor), pytest.raises(CompilationError, match="power of 2"):
        broken[GRID](*args)
    assert compile_log.events == []  # neither failure was compiled again here


@pytest.mark.timeout(180)
def test_a_crashing_and_a_hanging_compile_get_inf_and_the_caller_lives(
    gpu: DryRunGPU, compile_log: CompileLog, caplog: pytest.LogCaptureFixture
) -> None:
    configs = autotune_kernels.faulty_configs()
    bench = Bench(gpu, lambda launched: launched["BLOCK"] / 1000)  # the smallest good one wins
    kernel = triton.autotune(configs=configs, key=["n"], do_bench=bench)(
        autotune_kernels.faulty_kernel.fn
    )
    with (
        PrecompileExecutor(2, timeout=HANG_TIMEOUT_S, classify=classify) as pool,
        caplog.at_level(logging.WARNING, logger=LOGGER),
        pe_autotune.use(pool),
    ):
        kernel[GRID](*_double_args())
        stats = pool.statistics()
    by_fault = {c.kwargs["FAULT"]: kernel.configs_timings[c] for c in configs}
    assert by_fault[1] == [float("inf")] * 3 and by_fault[2] == [float("inf")] * 3
    assert kernel.best_config is configs[0]
    assert gpu.launches[-1]["BLOCK"] == 128 and gpu.launches[-1]["FAULT"] == 0
    assert (stats.crashed, stats.timed_out) == (1, 1)
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 2, warnings
    crashed = next(w for w in warnings if "crashed its worker" in w)
    assert "FAULT: 1" in crashed and "Segmentation fault" in crashed  # faulthandler's report
    hung = next(w for w in warnings if "timed out" in w)
    assert "FAULT: 2" in hung
    assert compile_log.events == []


@pytest.mark.timeout(120)
def test_when_every_compile_crashes_the_call_raises_the_crash_and_the_caller_lives(
    executor: PrecompileExecutor, gpu: DryRunGPU, compile_log: CompileLog
) -> None:
    crashing = [
        triton.Config({"BLOCK": 128, "FAULT": 1}, num_warps=4),
        triton.Config({"BLOCK": 256, "FAULT": 1}, num_warps=4),
    ]
    bench = Bench(gpu, lambda launched: 1.0)
    kernel = triton.autotune(configs=crashing, key=["n"], do_bench=bench)(
        autotune_kernels.faulty_kernel.fn
    )
    with pe_autotune.use(executor), pytest.raises(WorkerCrashedError, match="SIGSEGV"):
        kernel[GRID](*_double_args())
    assert bench.calls == [] and gpu.launches == []  # nothing crashed was launched
    assert compile_log.events == []  # nor compiled here, which would have killed this process


@pytest.mark.timeout(120)
def test_ctrl_c_during_the_benchmarks_stops_every_compile_of_the_tune(
    executor: PrecompileExecutor, gpu: DryRunGPU
) -> None:
    def interrupted(kernel_call: Callable[[], None], quantiles: Any = None) -> list[float]:
        raise KeyboardInterrupt

    kernel = triton.autotune(configs=DOUBLE_CONFIGS, key=["n"], do_bench=interrupted)(double_jit)
    with pe_autotune.use(executor), pytest.raises(KeyboardInterrupt):
        kernel[GRID](*_double_args(8192))
    stats = executor.statistics()
    assert (stats.queued, stats.running) == (0, 0)  # cancelled or killed, not left running
    assert not kernel.cache  # Triton learnt nothing from the interrupted tune
    assert all(
        type(v).__name__ == "CompiledKernel"
        for v in double_jit.device_caches[gpu.device][0].values()
    )  # no stand-in or unfinished compile left in the JIT's memory


_WARM_CALLER_SCRIPT = """
import logging, sys, threading
import precompile_executor._executor as ex_mod
from precompile_executor import PrecompileExecutor
from precompile_executor.triton import prewarm
try:
    from triton.runtime.cache import triton_key
except ImportError:
    from triton.compiler.compiler import triton_key

def warmers():
    return [t for t in threading.enumerate() if t.name == "precompile-executor-warm-caller"]

assert triton_key.cache_info().currsize == 0, "a fresh process has not hashed Triton yet"
with PrecompileExecutor(1, initializer=prewarm, initargs=("cuda:90",)):
    started = warmers()
    for t in started:
        t.join(60)
    assert triton_key.cache_info().currsize == 1, "the caller's half hashed Triton"
    with PrecompileExecutor(1, initializer=prewarm, initargs=("cuda:90",)):
        again = warmers()

def broken(*args):
    pass

def fails(*args):
    raise RuntimeError("in_caller failed")

broken.in_caller = fails
with PrecompileExecutor(1, initializer=broken) as pool:
    for t in warmers():
        t.join(60)
    assert pool.submit(pow, 2, 5).result(timeout=120) == 32
print(len(started), len(again))
"""


@pytest.mark.timeout(240)
def test_prewarm_warms_the_caller_in_the_background_once() -> None:
    """``prewarm.in_caller`` hashes Triton's installation in the caller, on a background thread
    the constructor starts, once per process and initializer; a failing ``in_caller`` is only a
    missed warm-up."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _WARM_CALLER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["1", "0"]  # a thread the first time, none the second


def test_the_public_surface_is_documented() -> None:
    for name in pe_autotune.__all__:
        obj = getattr(pe_autotune, name)
        if callable(obj):
            assert inspect.getdoc(obj), name


# -- on a GPU -----------------------------------------------------------------------------------


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and torch")
@pytest.mark.timeout(300)
def test_gpu_a_segfault_and_a_hang_in_one_config_each_leave_a_correct_autotune(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    n = 1 << 20
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    kernel = triton.autotune(configs=autotune_kernels.faulty_configs(), key=["n"])(
        autotune_kernels.faulty_kernel.fn
    )
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)  # noqa: E731
    with (
        knobs.cache.scope(),
        PrecompileExecutor(4, timeout=HANG_TIMEOUT_S, classify=classify) as pool,
        caplog.at_level(logging.WARNING, logger=LOGGER),
        pe_autotune.use(pool),
    ):
        knobs.cache.dir = str(tmp_path / "cache")
        kernel[grid](x, out, n)
        torch.cuda.synchronize()
        stats = pool.statistics()
    torch.testing.assert_close(out, x * 2)
    assert kernel.best_config.kwargs["FAULT"] == 0
    timings = {c.kwargs["FAULT"]: t for c, t in kernel.configs_timings.items()}
    assert timings[1] == [float("inf")] * 3 and timings[2] == [float("inf")] * 3
    assert (stats.crashed, stats.timed_out) == (1, 1)
    assert len([r for r in caplog.records if r.name == LOGGER]) == 2
