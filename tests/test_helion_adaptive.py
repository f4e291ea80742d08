"""Helion's adaptive compile timeout applied from the first batch (``helion/_adaptive.py``,
``_future.Stream``; docs/helion.md, "A hung compile: Helion's adaptive timeout from the first
batch").

The rule alone is tested as pure functions; the cut is tested on Helion's fork-mode precompile
through the seam (``PrecompileFuture.create`` / ``wait_for_all``), with real sm_90 compiles on the
compile-only driver and one config whose compile hangs in C (libc ``sleep`` holding the GIL, in
the forked child: no Python-level signal handler or timer can end it more gently than a kill).
The lower bound is Helion's effort profile's, lowered here through
``helion.autotuner.effort_profile._PROFILES`` so that a test takes seconds, not 30 s.
"""

# Helion's and Triton's decorators are untyped.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

helion = pytest.importorskip("helion")
torch = pytest.importorskip("torch")

import crashers  # noqa: E402
from helion.autotuner import effort_profile  # noqa: E402
from helion.autotuner.precompile_future import PrecompileFuture  # noqa: E402
from test_helion import _create, _fork_batch, _inject, _jit  # noqa: E402
from test_helion_child import held_until  # noqa: E402

import precompile_executor.helion as peh  # noqa: E402
from precompile_executor import PrecompileExecutor  # noqa: E402
from precompile_executor.helion import _adaptive, _future  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

RULE = _adaptive.AdaptiveRule(quantile=0.9, lower_bound_s=30.0, source="test")
LOGGER = "precompile_executor.helion"


# -- the rule, pure ---------------------------------------------------------------------------


def test_the_minimum_count_is_half_the_batch_and_at_least_eight() -> None:
    assert [_adaptive.min_finished(n) for n in (1, 8, 9, 16, 17, 24, 32, 100)] == [
        8, 8, 8, 8, 9, 12, 16, 50,
    ]  # fmt: skip


@pytest.mark.parametrize("batch", [1, 9, 16, 24, 32, 100])
def test_the_quantile_is_never_taken_from_fewer_than_the_minimum_count(batch: int) -> None:
    need = _adaptive.min_finished(batch)
    times = [1.0 + i / 10 for i in range(need)]
    assert _adaptive.threshold(times[:-1], batch, RULE, 60) is None
    assert _adaptive.threshold([*times[:-1], 0.0], batch, RULE, 60) is None  # 0: nothing ran
    cut = _adaptive.threshold(times, batch, RULE, 60)
    assert cut is not None and cut.finished == need


def test_helions_rule_quantile_then_lower_bound_then_the_compile_timeout() -> None:
    times = [float(t) for t in range(1, 21)]  # 1..20 s: Helion's index int(20 * 0.9) = 18 → 19 s
    rule = dataclasses.replace(RULE, lower_bound_s=5.0)
    cut = _adaptive.threshold(times, 24, rule, 60)
    assert cut is not None and (cut.quantile_s, cut.seconds) == (19.0, 19.0)
    assert _adaptive.threshold(times, 24, RULE, 60).seconds == 30.0  # type: ignore[union-attr]
    assert _adaptive.threshold(times, 24, rule, 12).seconds == 12.0  # type: ignore[union-attr]
    assert _adaptive.overdue({1: 18.9, 2: 19.1, 3: 40.0}, cut) == [2, 3]
    text = cut.describe()
    assert "p90 of 20 compile times 19.0s" in text and "lower bound 5s" in text
    assert "compile timeout 60s" in text and "(test)" in text


def test_uniformly_slow_compiles_are_never_cut_below_the_lower_bound() -> None:
    """A slow machine or target: every compile long, all alike. Whatever the times, the cut is
    at least the lower bound (and never past the compile timeout)."""
    rng = random.Random(0)
    for _ in range(500):
        scale = rng.choice([0.1, 1.0, 10.0, 50.0])
        times = [scale * rng.uniform(0.8, 1.2) for _ in range(rng.randint(8, 40))]
        lower = rng.choice([0.5, 2.0, 30.0])
        rule = dataclasses.replace(RULE, lower_bound_s=lower)
        cut = _adaptive.threshold(times, len(times), rule, 60)
        assert cut is not None
        assert min(lower, 60) <= cut.seconds <= 60
        assert not [t for t in times if t > cut.seconds and t <= lower]


def test_the_rule_comes_from_the_search_else_the_effort_profile_else_off() -> None:
    settings = helion.Settings()
    assert settings.autotune_adaptive_timeout  # Helion's default
    rule = _adaptive.rule_for(settings)
    full = effort_profile.get_effort_profile("full").pattern_search
    assert rule is not None
    assert (rule.quantile, rule.lower_bound_s) == (
        full.compile_timeout_quantile,
        full.compile_timeout_lower_bound,
    )

    class Search:  # a PatternSearch/LFBO/DE built with its own values
        compile_timeout_quantile = 0.5
        compile_timeout_lower_bound = 7

    assert _adaptive.rule_for(settings, Search()) == _adaptive.AdaptiveRule(0.5, 7.0, "Search")
    assert _adaptive.rule_for(helion.Settings(autotune_adaptive_timeout=False)) is None


# -- the cut, on real fork-mode precompiles ------------------------------------------------------


@pytest.fixture
def lower_bound_2s(monkeypatch: pytest.MonkeyPatch) -> float:
    """Helion's effort profile "full" with a lower bound of 2 s (1.5.1's is 30 s)."""
    profile = effort_profile.get_effort_profile("full")
    lowered = {
        name: dataclasses.replace(getattr(profile, name), compile_timeout_lower_bound=2.0)
        for name in ("pattern_search", "lfbo_pattern_search", "differential_evolution")
    }
    monkeypatch.setitem(effort_profile._PROFILES, "full", dataclasses.replace(profile, **lowered))
    return 2.0


@pytest.fixture
def thresholds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, int]]:
    """Every threshold the stream computed, with the batch size it was computed for."""
    seen: list[tuple[Any, int]] = []
    real = _adaptive.threshold

    def spy(times: Any, batch: int, rule: Any, timeout: float) -> Any:
        times = list(times)
        cut = real(times, batch, rule, timeout)
        seen.append((cut, batch))
        return cut

    monkeypatch.setattr(_adaptive, "threshold", spy)
    return seen


def _many_configs(bound: Any, n: int) -> list[Any]:
    """``n`` distinct configs of ``test_helion._add`` (256×256), none compiled in this process."""
    base = bound.config_spec.default_config().config
    shapes = [(b0, b1, w) for w in (4, 2, 8, 1) for b0 in (16, 32, 64) for b1 in (32, 64)]
    configs = [
        helion.Config(**{**base, "block_sizes": [b0, b1], "num_warps": w})
        for b0, b1, w in shapes[:n]
    ]
    for config in configs:
        _jit(bound, config).device_caches.clear()
    return configs


def _hang_in_c(bound: Any, config: Any) -> None:
    """The compile of ``config`` (in the forked child) blocks in libc's ``sleep``."""
    jit = _jit(bound, config)
    real = jit.compile

    def hangs(*a: Any, **k: Any) -> Any:
        crashers.c_hang_holding_gil()
        return real(*a, **k)

    jit.compile = hangs
    from test_helion import _INJECTED

    _INJECTED.append((jit, real))


def _group_gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


GOOD = 9
"""Configs that compile: ≥ the minimum count (8), so the rule can apply to a batch of 10."""


def _batch_with_a_hang(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, **settings: Any
) -> tuple[list[Any], list[bool], float, list[logging.LogRecord]]:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with (
        PrecompileExecutor(4) as executor,
        _fork_batch(tmp_path, **settings) as (bound, args, ctx),
    ):
        ctx.jobs = 4
        configs = _many_configs(bound, GOOD + 1)
        with peh.use(executor):
            futures = [_create(ctx, bound, c, args) for c in configs]
            _hang_in_c(bound, configs[0])  # first: it holds one of the 4 slots throughout
            t0 = time.monotonic()
            ok = PrecompileFuture.wait_for_all(futures)
            wall = time.monotonic() - t0
    named = [
        r for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.INFO and str(configs[0]) in r.getMessage()
    ]  # fmt: skip
    return futures, ok, wall, named


@pytest.mark.timeout(240)
def test_a_hung_compile_is_cut_by_helions_adaptive_timeout_in_the_first_batch(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    lower_bound_2s: float,
    thresholds: list[tuple[Any, int]],
) -> None:
    """Compile timeout 120 s, lower bound 2 s: once 8 of the 10 configs have compiled, the hung
    one is cut at the p90 of their compile times (at least 2 s) — killed, failed as a timeout,
    logged once — and the batch ends long before the compile timeout."""
    futures, ok, wall, named = _batch_with_a_hang(tmp_path, caplog, autotune_compile_timeout=120)
    assert ok == [False] + [True] * GOOD
    hung = futures[0]
    assert hung.failure_reason == "timeout" and hung.cut is not None
    assert hung.cut.rule.lower_bound_s == lower_bound_2s
    assert hung.elapsed >= lower_bound_2s and hung.elapsed >= hung.cut.seconds
    assert wall < 90  # well before the 120 s compile timeout
    assert hung.process is not None and _group_gone(hung.process.pid)
    assert [f.failure_reason for f in futures[1:]] == ["ok"] * GOOD
    assert all(f.cut is None for f in futures[1:])
    assert len(named) == 1  # exactly one INFO line names it
    text = named[0].getMessage()
    assert "adaptive compile timeout" in text and "lower bound 2s" in text
    assert "compile timeout 120s" in text
    computed = [(cut, batch) for cut, batch in thresholds if cut is not None]
    assert computed, "a threshold was computed"
    for cut, batch in computed:  # never from fewer than the minimum count, never below the bound
        assert cut.finished >= _adaptive.min_finished(batch) == 8
        assert cut.seconds >= lower_bound_2s


@pytest.mark.timeout(240)
def test_with_the_adaptive_timeout_off_a_hung_compile_waits_the_full_timeout(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    lower_bound_2s: float,
    thresholds: list[tuple[Any, int]],
) -> None:
    futures, ok, _wall, named = _batch_with_a_hang(
        tmp_path, caplog, autotune_compile_timeout=8, autotune_adaptive_timeout=False
    )
    assert ok == [False] + [True] * GOOD
    hung = futures[0]
    assert hung.failure_reason == "timeout" and hung.cut is None
    assert hung.elapsed >= 8  # the executor's own timeout: Helion's compile timeout, in full
    assert hung.process is not None and _group_gone(hung.process.pid)
    assert named == [] and thresholds == []  # no rule, no cut, no line


@pytest.mark.timeout(240)
def test_a_slow_compile_under_the_lower_bound_is_not_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, thresholds: list[tuple[Any, int]]
) -> None:
    """Uniform compiles and one slower than all of them but under the lower bound (10 s here):
    the quantile is below the bound, and the bound holds — nothing is cut."""
    profile = effort_profile.get_effort_profile("full")
    slow = dataclasses.replace(profile.pattern_search, compile_timeout_lower_bound=10.0)
    monkeypatch.setitem(
        effort_profile._PROFILES, "full", dataclasses.replace(profile, pattern_search=slow)
    )
    with (
        PrecompileExecutor(4) as executor,
        _fork_batch(tmp_path, autotune_compile_timeout=120) as (bound, args, ctx),
    ):
        ctx.jobs = 4
        configs = _many_configs(bound, GOOD + 1)
        with peh.use(executor):
            futures = [_create(ctx, bound, c, args) for c in configs]
            _inject(bound, configs[0], "sleep:6")  # slower than the others, under 10 s
            ok = PrecompileFuture.wait_for_all(futures)
    assert ok == [True] * (GOOD + 1)
    assert all(f.cut is None for f in futures)
    assert futures[0].elapsed > max(f.elapsed for f in futures[1:])
    computed = [cut for cut, _ in thresholds if cut is not None]
    assert computed and all(cut.seconds >= 10.0 for cut in computed)
    assert any(cut.quantile_s < 10.0 for cut in computed)  # the bound, not the quantile, held


# -- use() on a fresh executor: nothing waits for workers ----------------------------------------


def _native_fork_outcomes(tmp_path: Path, count: int) -> list[bool]:
    """What Helion's own fork mode reports for the first ``count`` configs of the batch."""
    with _fork_batch(tmp_path / "native") as (bound, args, ctx):
        native = [
            PrecompileFuture.create(
                ctx=ctx, config=c, fn=bound.compile_config(c), args=args,
                result_path=str(tmp_path / f"r{i}.pkl"), args_path=None,
            )
            for i, c in enumerate(_many_configs(bound, count))
        ]  # fmt: skip
        return PrecompileFuture.wait_for_all(native)


@pytest.mark.timeout(240)
def test_use_on_a_fresh_executor_compiles_before_any_worker_started(
    tmp_path: Path, fresh_helion_state: None
) -> None:
    """Fork mode: ``with use():`` on a fresh process's default executor forks each config's
    compile from the autotuning process; no worker is started for it (none is waited for), and
    the outcome is native fork's."""
    expected = _native_fork_outcomes(tmp_path, 4)
    with _fork_batch(tmp_path / "ours") as (bound, args, ctx):
        configs = _many_configs(bound, 4)
        with peh.use() as executor:
            assert isinstance(executor, PrecompileExecutor)
            futures = [_create(ctx, bound, c, args) for c in configs]
            ours = PrecompileFuture.wait_for_all(futures)
            stats = executor.statistics()
    assert ours == expected == [True] * 4
    assert [f.process.path for f in futures] == ["fork"] * 4
    # no spawn worker started (one started would still be alive, idle), every task forked
    assert (stats.workers_alive, stats.spawn_tasks, stats.fork_tasks) == (0, 0, 4), stats
    assert stats.completed == 4
    assert sorted(os.listdir(tmp_path / "ours" / "triton")) == sorted(
        os.listdir(tmp_path / "native" / "triton")
    )


@pytest.mark.timeout(240)
def test_streamed_the_hung_config_is_cut_and_helion_records_a_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The path an autotune takes (the streaming provider): the search's own lower bound (2 s
    here; ``PatternSearch`` and LFBO carry one) reaches the stream, the hung config is cut while
    the others are measured, and Helion's own ``benchmark()`` gives it the timeout status."""
    from test_helion import _streaming_provider

    class Search:  # the provider's search, as BaseSearch._prepare sets it (_seam)
        compile_timeout_quantile = 0.9
        compile_timeout_lower_bound = 2.0

    caplog.set_level(logging.INFO, logger=LOGGER)
    measured: list[tuple[Any, float]] = []
    with (
        PrecompileExecutor(4) as executor,
        _fork_batch(tmp_path) as (bound, args, ctx),
        peh.use(executor),
    ):
        from helion.autotuner.precompile_future import _prepare_precompiler_for_fork

        configs = _many_configs(bound, GOOD + 1)
        fn = bound.compile_config(configs[0])
        _prepare_precompiler_for_fork(fn, args, configs[0], bound, "", ctx.log)  # sets compile
        _hang_in_c(bound, configs[0])
        provider = _streaming_provider(
            bound, args, measured, autotune_compile_timeout=120, autotune_precompile_jobs=4
        )
        provider.search = Search()
        provider.setup()
        t0 = time.monotonic()
        try:
            results = provider.benchmark(configs)
        finally:
            provider.cleanup()
        wall = time.monotonic() - t0
    assert [r.status for r in results] == ["timeout"] + ["ok"] * GOOD
    assert {id(c) for c, _ in measured} == {id(c) for c in configs[1:]}
    assert wall < 90  # well before the 120 s compile timeout
    lines = [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO
    ]
    named = [line for line in lines if str(configs[0]) in line]
    assert len(named) == 1 and "lower bound 2s" in named[0] and "(Search)" in named[0]


@pytest.mark.timeout(240)
def test_spawn_mode_on_a_cold_executor_compiles_on_the_fork_path_until_workers_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Spawn mode, ``use(ex)`` on an executor whose workers have not started: the configs queued
    for a spawn worker are compiled on the fork path meanwhile (counted), and come out as native
    fork mode's. (On this machine a spawn task itself could not run: launching needs a GPU, so a
    config that reached a worker would fail the test.)"""
    caplog.set_level(logging.INFO, logger=LOGGER)
    expected = _native_fork_outcomes(tmp_path, 4)
    stolen: list[int] = []
    real_close = _future.Stream.close

    def close(stream: Any) -> None:
        stolen.append(stream.stolen)
        real_close(stream)

    gate = tmp_path / "workers-may-start"
    with (
        _fork_batch(tmp_path / "ours") as (bound, args, ctx),
        # Its workers cannot answer before the gate opens (after the batch): no pooled worker
        # of another test's executor fits this initializer, and none of its own is ready.
        PrecompileExecutor(2, initializer=held_until, initargs=(str(gate),)) as executor,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setattr(_future.Stream, "close", close)
        ctx.settings.autotune_precompile = "spawn"
        ctx.jobs = 4
        configs = _many_configs(bound, 4)
        with peh.use(executor):
            futures = [_create(ctx, bound, c, args) for c in configs]
            assert all(f.path == "spawn" and f.fallback is not None for f in futures)
            ours = PrecompileFuture.wait_for_all(futures)
        stats = executor.statistics()
        gate.touch()
    assert ours == expected == [True] * 4
    assert stolen == [4] and [f.process.path for f in futures] == ["fork"] * 4
    assert (stats.spawn_tasks, stats.fork_tasks, stats.cancelled) == (0, 4, 4), stats
    assert sorted(os.listdir(tmp_path / "ours" / "triton")) == sorted(
        os.listdir(tmp_path / "native" / "triton")
    )
    assert (
        sum("while the executor's spawn workers start" in r.getMessage() for r in caplog.records)
        == 1
    )


@pytest.mark.timeout(240)
def test_spawn_mode_on_warm_workers_steals_nothing(tmp_path: Path) -> None:
    """Once the executor has started a spawn task, configs are prepared without a fork-path
    stand-in: every one goes to the workers."""
    with (
        _fork_batch(tmp_path) as (bound, args, ctx),
        PrecompileExecutor(1, initializer=peh.import_helion) as executor,
    ):
        executor.submit(os.getpid).result(timeout=120)  # a spawn task started: workers answered
        ctx.settings.autotune_precompile = "spawn"
        (config,) = _many_configs(bound, 1)
        with peh.use(executor):
            future = _create(ctx, bound, config, args)
        assert future.path == "spawn" and future.fallback is None
