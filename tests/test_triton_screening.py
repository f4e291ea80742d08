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

import contextlib
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from dry_run_gpu import DryRunGPU, FakeTensor, installed  # noqa: E402
from triton import knobs  # noqa: E402

from precompile_executor import PrecompileExecutor  # noqa: E402
from precompile_executor import triton as pe_triton  # noqa: E402
from precompile_executor.triton import _autotune_guard, _screening, classify  # noqa: E402
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
    returns ``[median, p20, p80]``: the median is the config's known time times a seeded noise
    factor whose standard deviation shrinks with the square root of ``rep`` (a timing of ``rep``
    ms takes proportionally more samples), times ``load`` while any compile of ``executor`` is
    queued or running (a busy CPU only adds time); the percentiles are ``rep_spread`` either
    side of it, as the spread of single repetitions does not shrink with more of them.

    Attributes:
        calls: per call, ``(config key, rep, compiles unfinished at the call)``.
    """

    def __init__(
        self,
        gpu: DryRunGPU,
        times_ms: dict[tuple[int, int], float],
        *,
        seed: int = 0,
        noise_at_full: float = 0.001,
        rep_spread: float = 0.03,
        load: float = 1.0,
        executor: PrecompileExecutor | None = None,
    ) -> None:
        self.gpu = gpu
        self.times_ms = times_ms
        self.random = random.Random(seed)
        self.noise_at_full = noise_at_full
        self.rep_spread = rep_spread
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
        noise = self.noise_at_full * math.sqrt(FULL_REP_MS / rep)
        median = self.times_ms[key] * (1 + self.random.gauss(0, noise))
        if unfinished:
            median *= self.load
        return [median, median * (1 - self.rep_spread), median * (1 + self.rep_spread)]

    def timed(self, key: tuple[int, int]) -> list[float]:
        """The budgets ``key`` was timed with, in order."""
        return [rep for k, rep, _ in self.calls if k == key]


# -- fixtures -----------------------------------------------------------------------------------

# Compiles in workers only: one in this thread would not overlap a timing, and these tests count
# overlaps.
pytestmark = pytest.mark.usefixtures("release_idle_workers", "triton_compiles_in_workers_only")


@pytest.fixture(scope="module")
def executor() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(2, timeout=TASK_TIMEOUT_S, classify=classify) as pool:
        yield pool


@pytest.fixture
def new_gpu(tmp_path: Path) -> Iterator[Callable[[], DryRunGPU]]:
    """Make a fresh dry-run GPU Triton's active driver (a new device: empty in-memory caches,
    the same caller cache on disk); each is undone at the end, the last made first."""
    with contextlib.ExitStack() as made:
        yield lambda: made.enter_context(
            installed(DryRunGPU(), tmp_path / "caller-cache", (scale_jit,))
        )


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
    # again. Unscreened: the confirmation step is what is tested.
    times = {k: 2.0 + i for i, k in enumerate(sorted(_times((128, 4), 0)))}
    times[(128, 4)], times[(64, 2)] = 1.0, 1.05
    first = ScriptedBenchmarker(new_gpu(), times, executor=executor)
    with pe_autotune.use(executor):
        _autotune(first.gpu, first)[GRID](*_args())
    again = ScriptedBenchmarker(new_gpu(), times, executor=executor)
    kernel = _autotune(again.gpu, again)
    before = executor.statistics().completed
    with pe_autotune.use(executor, screening=False):
        kernel[GRID](*_args())
    assert executor.statistics().completed == before  # nothing compiled: all in the cache
    assert sorted(k for k, _, _ in again.calls) == sorted(times)  # each config timed once
    assert kernel.best_config.kwargs["BLOCK"] == 128 and kernel.best_config.num_warps == 4


# -- screening: the rules -----------------------------------------------------------------------


def _screen(median: float, spread: float = 0.0, *, quiet: bool = True) -> _screening.Screen:
    return _screening.Screen(median, median * (1 - spread), median * (1 + spread), quiet)


def test_a_screen_is_read_from_tritons_quantiles_and_failures_have_none() -> None:
    assert _screening.Screen.of([2.0, 1.9, 2.2], quiet=True) == _screening.Screen(
        2.0, 1.9, 2.2, True
    )
    assert _screening.Screen.of(3.0, quiet=False) == _screening.Screen(3.0, 3.0, 3.0, False)
    for failed in ([math.inf] * 3, [], "x", [0.0, 0.0, 0.0], None, RuntimeError("x")):
        assert _screening.Screen.of(failed, quiet=True) is None


def test_the_noise_band_is_the_quiet_screens_median_spread_within_its_bounds() -> None:
    quiet = [_screen(1.0, 0.02), _screen(2.0, 0.03), _screen(3.0, 0.04)]
    assert _screening.noise_band(quiet) == pytest.approx(0.06)  # median (p80 - p20) / p50
    assert _screening.noise_band([_screen(1.0, 0.5), _screen(1.0, 0.01, quiet=False)]) == (
        _screening.MAX_BAND
    )
    assert _screening.noise_band([_screen(1.0, 0.001)]) == _screening.MIN_BAND
    assert _screening.noise_band([]) == _screening.MIN_BAND


def test_every_loud_screen_is_screened_again_best_first() -> None:
    screens = {
        "a": _screen(1.00),
        "b": _screen(1.10, quiet=False),
        "c": _screen(1.05, quiet=False),
        "d": _screen(3.00, quiet=False),  # far behind, but load has no bound on a short timing
    }
    assert _screening.rescreen(screens) == ["c", "b", "d"]
    assert _screening.rescreen({"a": _screen(1.0)}) == []
    assert _screening.rescreen({}) == []


def test_finalists_are_the_band_best_first_at_most_the_share() -> None:
    screens = {
        k: _screen(t) for k, t in zip("abcdef", (1.03, 1.0, 1.01, 1.2, 1.02, 1.5), strict=True)
    }
    assert _screening.finalists(screens, 0.025, most=10) == ["b", "c", "e"]
    assert _screening.finalists(screens, 0.025, most=2) == ["b", "c"]
    assert _screening.finalists(screens, 0.0, most=0) == ["b"]  # the best always
    assert _screening.most_finalists(10) == _screening.MIN_FINALISTS
    assert not _screening.pays(_screening.MIN_FINALISTS) and _screening.pays(10)
    assert _screening.most_finalists(64) == 64 // _screening.FINALIST_SHARE


def test_challengers_are_screens_at_or_below_the_best_full_timing() -> None:
    screens = {k: _screen(t) for k, t in zip("abcd", (1.0, 1.01, 1.04, 1.2), strict=True)}
    assert _screening.challengers(screens, {}) == []
    assert _screening.challengers(screens, {"a": 1.0, "b": 1.01}) == []
    assert _screening.challengers(screens, {"b": 1.01, "d": 1.2}) == ["a"]
    # Full timings reading 5 % above the screens: "c"'s screen alone would be Triton's min.
    assert _screening.challengers(screens, {"a": 1.05, "b": 1.06}) == ["c"]
    assert _screening.challengers(screens, {"a": 1.05, "b": 1.06, "c": 1.09}) == []


# -- screening: whole autotunes -----------------------------------------------------------------


def _cold_screened_tune(
    executor: PrecompileExecutor,
    new_gpu: Callable[[], DryRunGPU],
    cache_dir: Path,
    seed: int,
    *,
    best_at: int,
    load: float,
) -> tuple[tuple[int, int], dict[tuple[int, int], float], DryRunGPU, ScriptedBenchmarker, Any]:
    """One screened autotune from a cold caller cache (``cache_dir``): every config compiles in
    the workers, two at a time, while the first ones are screened with ``load`` times their time;
    the best config and its two rivals 1-3 % behind it drawn by the seed, seeded noise. Returns
    the true best, the known times, the GPU, the benchmarker and the tuned kernel."""
    keys = sorted(_times((128, 4), 0))
    best = keys[(3 * seed + best_at) % len(keys)]
    times = _times(best, seed)
    with knobs.cache.scope():
        knobs.cache.dir = str(cache_dir)
        gpu = new_gpu()
        benchmarker = ScriptedBenchmarker(gpu, times, seed=seed, load=load, executor=executor)
        kernel = _autotune(gpu, benchmarker)
        with pe_autotune.use(executor, screening=True):
            kernel[GRID](*_args())
    return best, times, gpu, benchmarker, kernel


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", range(4))
def test_screening_keeps_the_true_best_with_fewer_full_timings_all_on_a_quiet_gpu(
    executor: PrecompileExecutor,
    new_gpu: Callable[[], DryRunGPU],
    tmp_path: Path,
    seed: int,
) -> None:
    # Each trial: the first ones screened under a 1.08× load.
    best, times, gpu, benchmarker, kernel = _cold_screened_tune(
        executor, new_gpu, tmp_path / f"cold-{seed}", seed, best_at=1, load=1.08
    )
    chosen = (kernel.best_config.kwargs["BLOCK"], kernel.best_config.num_warps)
    assert chosen == best
    assert _key(gpu.launches[-1]) == best
    full = [(k, unfinished) for k, rep, unfinished in benchmarker.calls if rep == FULL_REP_MS]
    # Every config screened; fewer full timings than configs, and less budget than stock's.
    assert {k for k, _, _ in benchmarker.calls} == set(times)
    assert 1 <= len(full) < len(CONFIGS)
    assert sum(25 + rep for _, rep, _ in benchmarker.calls) < len(CONFIGS) * (25 + FULL_REP_MS)
    assert any(unfinished for _, _, unfinished in benchmarker.calls)  # screened under load
    assert all(unfinished == 0 for _, unfinished in full)  # every full timing on a quiet GPU
    # What Triton recorded for the chosen config is its full timing.
    assert benchmarker.timed(best)[-1] == FULL_REP_MS
    assert kernel.configs_timings[kernel.best_config][0] == pytest.approx(times[best], rel=0.01)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", range(2))
def test_a_screen_taken_under_any_load_is_taken_again_before_it_ranks(
    executor: PrecompileExecutor,
    new_gpu: Callable[[], DryRunGPU],
    tmp_path: Path,
    seed: int,
) -> None:
    # Load has no known bound on a short timing: compiles in this process's own threads hold the
    # GIL for tens of ms at a time, and a stall in Triton's 5-launch estimate leaves a screen
    # a handful of repetitions. Here a busy CPU doubles every screen: the true best, screened
    # loud, lies far beyond CONFIRM_MARGIN of a config screened quietly, and still wins.
    name = _autotune_guard.kernel_name(scale_jit)
    known = pe_autotune.statistics().get(name)
    before = (0, 0, 0) if known is None else (known.screened, known.rescreened, known.timed_in_full)
    best, _, _, benchmarker, kernel = _cold_screened_tune(
        executor, new_gpu, tmp_path / f"cold-{seed}", seed, best_at=2, load=2.0
    )
    assert (kernel.best_config.kwargs["BLOCK"], kernel.best_config.num_warps) == best
    loud = {k for k, rep, unfinished in benchmarker.calls if unfinished and rep < FULL_REP_MS}
    assert loud  # screened under load
    for key in loud:  # each loud screen was taken again, quietly, before any full timing
        quiet = [i for i, (k, _, u) in enumerate(benchmarker.calls) if k == key and u == 0]
        first_full = min(i for i, (_, rep, _) in enumerate(benchmarker.calls) if rep == FULL_REP_MS)
        assert quiet and quiet[0] < first_full, key
    after = pe_autotune.statistics()[name]
    assert after.screened - before[0] == len(CONFIGS)
    assert after.rescreened - before[1] >= len(loud)  # the tune counts a lagging callback loud too
    assert 1 <= after.timed_in_full - before[2] < len(CONFIGS)


@pytest.mark.timeout(240)
def test_a_kernel_with_its_own_do_bench_is_timed_as_given_and_says_so_once(
    executor: PrecompileExecutor,
    new_gpu: Callable[[], DryRunGPU],
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpu = new_gpu()
    times = _times((256, 4), 1)
    mine = ScriptedBenchmarker(gpu, times)

    def own_do_bench(kernel_call: Callable[[], None], quantiles: Any) -> list[float]:
        return mine(kernel_call, quantiles=quantiles)

    kernel = triton.autotune(configs=CONFIGS, key=["n"], do_bench=own_do_bench)(scale_jit)
    with caplog.at_level("INFO", logger="precompile_executor.triton.autotune"):
        with pe_autotune.use(executor, screening=True):
            kernel[GRID](*_args(4096))
            kernel[GRID](*_args(8192))  # a second key: a second tune, no second message
    assert {rep for _, rep, _ in mine.calls} == {FULL_REP_MS}  # never a screen's budget
    assert kernel.best_config.kwargs["BLOCK"] == 256 and kernel.best_config.num_warps == 4
    said = [r for r in caplog.records if "not screened" in r.getMessage()]
    assert len(said) == 1 and "do_bench=" in said[0].getMessage()


@pytest.mark.timeout(240)
def test_after_a_state_reset_a_kernel_not_screened_says_so_again(
    executor: PrecompileExecutor,
    new_gpu: Callable[[], DryRunGPU],
    caplog: pytest.LogCaptureFixture,
) -> None:
    mine = ScriptedBenchmarker(new_gpu(), _times((256, 4), 1))

    def own_do_bench(kernel_call: Callable[[], None], quantiles: Any) -> list[float]:
        return mine(kernel_call, quantiles=quantiles)

    kernel = triton.autotune(configs=CONFIGS, key=["n"], do_bench=own_do_bench)(scale_jit)
    with caplog.at_level("INFO", logger="precompile_executor.triton.autotune"):
        for n in (4096, 8192):  # a new key each time: a tune each time
            with pe_autotune.use(executor, screening=True):
                kernel[GRID](*_args(n))
            pe_triton.state.reset()  # as if the integration had never been used
    said = [r for r in caplog.records if "not screened" in r.getMessage()]
    assert len(said) == 2


@pytest.mark.timeout(120)
def test_a_plain_use_block_screens_and_screening_false_times_every_config_in_full(
    executor: PrecompileExecutor, new_gpu: Callable[[], DryRunGPU]
) -> None:
    times = _times((256, 4), 3)
    screened = ScriptedBenchmarker(new_gpu(), times)
    with pe_autotune.use(executor):
        _autotune(screened.gpu, screened)[GRID](*_args())
    unscreened = ScriptedBenchmarker(new_gpu(), times)
    with pe_autotune.use(executor, screening=False):
        _autotune(unscreened.gpu, unscreened)[GRID](*_args())
    # The default: every config screened with the short budget, only some timed in full.
    assert {rep for _, rep, _ in screened.calls} == {_screening.SCREEN_REP_MS, FULL_REP_MS}
    assert {k for k, rep, _ in screened.calls if rep == _screening.SCREEN_REP_MS} == set(times)
    assert 1 <= len({k for k, rep, _ in screened.calls if rep == FULL_REP_MS}) < len(CONFIGS)
    # The opt-out: every config timed with Triton's full budget, none with a short one.
    assert {rep for _, rep, _ in unscreened.calls} == {FULL_REP_MS}
    assert {k for k, _, _ in unscreened.calls} == set(times)


@pytest.mark.timeout(120)
def test_screening_is_on_unless_turned_off_and_must_be_a_bool(
    executor: PrecompileExecutor, new_gpu: Callable[[], DryRunGPU]
) -> None:
    with pytest.raises(TypeError, match="screening must be True or False"):
        with pe_autotune.use(executor, screening="yes"):  # type: ignore[arg-type]
            pass
    with pytest.raises(TypeError, match="screening must be True or False"):
        pe_autotune.install(executor, screening=1)  # type: ignore[arg-type]
    assert not pe_autotune.installed()
    # install() screens every thread's tunes by default; a use(screening=False) block inside
    # wins for what runs in it.
    times = _times((512, 4), 2)
    pe_autotune.install(executor)
    try:
        screened = ScriptedBenchmarker(new_gpu(), times)
        _autotune(screened.gpu, screened)[GRID](*_args())
        plain = ScriptedBenchmarker(new_gpu(), times)
        with pe_autotune.use(executor, screening=False):
            _autotune(plain.gpu, plain)[GRID](*_args())
    finally:
        pe_autotune.uninstall()
    assert {rep for _, rep, _ in screened.calls} == {_screening.SCREEN_REP_MS, FULL_REP_MS}
    assert {rep for _, rep, _ in plain.calls} == {FULL_REP_MS}
