"""precompile_executor.helion: Helion 1.5.1's autotuner precompiling on a PrecompileExecutor.

CPU tests drive the seam exactly as Helion's benchmark provider does — ``PrecompileFuture.create``
per config, then ``PrecompileFuture.wait_for_all`` — with a real bound Helion kernel. Fork mode
compiles real sm_90 binaries on the CPU, with a compile-only Triton driver in the parent. Spawn
mode runs on real spawn workers with stand-in "generated modules" (plain functions in files),
since launching a Triton kernel needs a GPU. Tests marked ``gpu`` run a real autotune.
"""

# Helion's and Triton's decorators are untyped.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

helion = pytest.importorskip("helion")
torch = pytest.importorskip("torch")
hl = pytest.importorskip("helion.language")

from helion import exc as helion_exc  # noqa: E402
from helion.autotuner.logger import AutotuningLogger  # noqa: E402
from helion.autotuner.precompile_future import PrecompileContext, PrecompileFuture  # noqa: E402

import precompile_executor.helion as peh  # noqa: E402
from precompile_executor import PrecompileExecutor  # noqa: E402
from precompile_executor.helion import _seam  # noqa: E402
from precompile_executor.helion._future import HelionFuture  # noqa: E402
from precompile_executor.triton import compile_only_driver, parse_target  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

WAIT_S = 120.0


def _cuda() -> bool:
    return bool(torch.cuda.is_available())


def _add() -> Any:
    """A fresh Helion kernel: bound kernels and their compiled configs are cached per kernel, and
    each test injects faults into its own."""

    @helion.kernel(static_shapes=True)
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        for tile in hl.tile(out.size()):
            out[tile] = x[tile] + y[tile]
        return out

    return add


def _originals() -> tuple[Any, Any, Any]:
    from helion.autotuner.base_search import BaseSearch

    return (
        PrecompileFuture.__dict__["create"].__func__,
        PrecompileFuture.__dict__["wait_for_all"].__func__,
        BaseSearch.__dict__["_prepare"],
    )


HELION_ORIGINALS = _originals()


@pytest.fixture
def executor() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(2, initializer=peh.import_helion) as ex:
        yield ex


@pytest.fixture(autouse=True)
def _always_restored() -> Iterator[None]:
    yield
    assert _originals() == HELION_ORIGINALS, "a test left Helion patched"


# -- the seam --------------------------------------------------------------------------------------


def _what_is_warm() -> tuple[bool, bool]:
    return "helion" in sys.modules, "precompile_executor.triton._prewarm" in sys.modules


@pytest.mark.timeout(180)
def test_import_helion_with_a_target_keeps_the_template_forkable() -> None:
    """The recommended initializer — Helion imported, one tiny compile for the target — runs
    once in a warm template that can still fork (no thread, no CUDA), and every worker has it."""
    with PrecompileExecutor(
        2, initializer=peh.import_helion, initargs=("cuda:90",), timeout=60
    ) as ex:
        ex.warm_up(timeout=150)
        assert ex.submit(_what_is_warm).result(timeout=60) == (True, True)
        assert ex.statistics().start == "template"


def test_check_accepts_the_installed_helion_1_5_1() -> None:
    assert peh.helion_version() == "1.5.1"
    peh.check_helion()


def test_check_refuses_another_version_and_patches_nothing(executor: PrecompileExecutor) -> None:
    with pytest.raises(peh.UnsupportedHelionError, match=r"supports Helion 1\.5\.1, found 1\.6\.0"):
        peh.check_helion(version="1.6.0")
    with (
        pytest.MonkeyPatch.context() as mp,
        pytest.raises(peh.UnsupportedHelionError, match="Nothing was patched"),
    ):
        mp.setattr(_seam, "helion_version", lambda: "1.4.0")
        with peh.use(executor):
            pass
    assert _originals() == HELION_ORIGINALS


def test_check_refuses_a_changed_signature(
    executor: PrecompileExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def create(ctx, config, fn, args, result_path):  # args_path gone
        raise AssertionError

    monkeypatch.setattr(PrecompileFuture, "create", staticmethod(create))
    with pytest.raises(peh.UnsupportedHelionError, match=r"PrecompileFuture\.create\(.*args_path"):
        with peh.use(executor):
            pass


def test_check_refuses_a_missing_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    from helion.autotuner import precompile_future

    monkeypatch.delattr(precompile_future, "_prepare_precompiler_for_fork")
    with pytest.raises(
        peh.UnsupportedHelionError, match="_prepare_precompiler_for_fork is missing"
    ):
        peh.check_helion()


def test_check_refuses_a_changed_provider_and_builds_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The streaming provider's Helion methods are checked too; refused, use() builds no
    executor and patches nothing (BaseSearch._prepare included)."""
    from helion.autotuner.benchmark_provider import LocalBenchmarkProvider

    def benchmark(self, configs, *, desc="Benchmarking"):  # raise_if_no_viable_config gone
        raise AssertionError

    monkeypatch.setattr(LocalBenchmarkProvider, "benchmark", benchmark)
    peh.state.reset()
    with pytest.raises(peh.UnsupportedHelionError) as info, peh.use():
        pass
    assert "LocalBenchmarkProvider.benchmark(" in str(info.value)
    assert "nothing was patched" in str(info.value)
    assert peh.state.default is None
    assert _originals() == HELION_ORIGINALS


def test_check_refuses_a_search_that_no_longer_reaches_the_provider_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from helion.autotuner.base_search import BaseSearch

    def _prepare(self):  # builds its provider some other way
        return None

    monkeypatch.setattr(BaseSearch, "_prepare", _prepare)
    with pytest.raises(
        peh.UnsupportedHelionError, match=r"BaseSearch\._prepare no longer uses _benchmark_provider"
    ):
        peh.check_helion()


def test_check_refuses_a_benchmark_worker_that_starts_differently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The provider starts Helion's benchmark worker itself (``_bench_worker``): a worker whose
    start or run changed is refused before anything is patched."""
    from helion.autotuner.benchmark_worker import BenchmarkWorker

    def run(self, job):  # timeout gone
        raise AssertionError

    monkeypatch.setattr(BenchmarkWorker, "run", run)
    with pytest.raises(peh.UnsupportedHelionError, match=r"BenchmarkWorker\.run\("):
        peh.check_helion()


@pytest.mark.timeout(240)
def test_use_without_an_executor_builds_one_for_helion_once(
    fresh_helion_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HELION_AUTOTUNE_PRECOMPILE", raising=False)
    monkeypatch.setenv("HELION_AUTOTUNE_PRECOMPILE_JOBS", "3")
    from precompile_executor.helion import _warm

    with peh.use() as first:
        with peh.use() as second:
            assert second is first and _seam.current_executor() is first
        assert first.max_workers == 3  # Helion's autotune_precompile_jobs
        assert not _warm.warming()  # fork mode: nothing to warm
        # import_helion ran in the template its workers came from
        assert first.submit(_what_is_warm).result(timeout=WAIT_S)[0] is True
    try:
        peh.install()
        assert _seam.current_executor() is first
    finally:
        peh.uninstall()


@pytest.mark.timeout(240)
def test_use_without_an_executor_warms_it_in_the_background_in_spawn_mode(
    fresh_helion_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELION_AUTOTUNE_PRECOMPILE", "spawn")
    monkeypatch.setenv("HELION_AUTOTUNE_PRECOMPILE_JOBS", "2")
    from precompile_executor.helion import _warm

    with peh.use() as ex:
        assert _warm.warming()
        assert peh.state.warming is not None
        peh.state.warming.join(timeout=WAIT_S)
        stats = ex.statistics()
        assert stats.start == "template"
        assert len(ex.warm_up(timeout=WAIT_S)) == 2  # already warm: the same two workers


_BEFORE_HELION = r"""
import importlib.abc, importlib.util, json, os, sys, time

import precompile_executor.helion as peh
from precompile_executor.helion import _seam

import psutil

seen = {}


def command(p):  # "" for a process that is gone, or dead and not yet reaped (a zombie)
    try:
        return "" if p.status() == psutil.STATUS_ZOMBIE else " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return ""


class Spy(importlib.abc.MetaPathFinder):
    # when this process's `import helion` has run: which of its child processes exist

    def find_spec(self, name, path=None, target=None):
        if name != "helion":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        real = spec.loader.exec_module

        def exec_module(module):
            real(module)
            kids = psutil.Process().children(recursive=True)
            seen["children"] = [c for c in map(command, kids) if c]

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, Spy())
out = {"helion_before": "helion" in sys.modules}
if sys.argv[1] == "refuse":
    _seam._seam_problems = lambda: ["injected: a changed signature"]
    try:
        peh.install()
    except peh.UnsupportedHelionError as error:
        out["refused"] = str(error)
    def left():  # the template and workers; not the process-wide helpers (trackers, guardian)
        helpers = ("resource_tracker", "signal.SIG_IGN")
        commands = [command(p) for p in psutil.Process().children(recursive=True)]
        return [c for c in commands if c and not any(h in c for h in helpers)]

    deadline = time.monotonic() + 60
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    out["children_left"] = [c[:200] for c in left()]
    out["default"] = repr(peh.state.default)
else:
    peh.install()
    ex = _seam.current_executor()
    # the template (a loky-started interpreter) was there while this process imported Helion
    out["template_during_import"] = any("popen_loky" in c for c in seen["children"])
    out["built_early"] = "built" in peh.state.times
    out["early_device"] = peh.state.early_device
    out["max_workers"] = ex.max_workers
    out["pids"] = len(ex.warm_up(timeout=120))
    import tests.test_helion_child as child

    out["workers"] = sorted(set(ex.map(child.worker_view, range(8), timeout=120)))
    peh.uninstall()
    ex.shutdown()
print(json.dumps(out))
"""


def _before_helion(mode: str, **env: str) -> dict[str, Any]:
    """Run a fresh interpreter that calls ``install()`` before importing Helion; its report."""
    import json

    full = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(sys.path)}
    if "HELION_AUTOTUNE_PRECOMPILE" not in env:
        full.pop("HELION_AUTOTUNE_PRECOMPILE", None)  # Helion's default: fork mode
    done = subprocess.run(
        [sys.executable, "-c", _BEFORE_HELION, mode],
        env=full,
        capture_output=True,
        text=True,
        timeout=200,
        cwd=Path(__file__).parent.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.timeout(240)
def test_install_before_helion_is_imported_warms_from_the_environment_first() -> None:
    """``install()`` at the top of a program, spawn mode in the environment: the executor is
    built and warming before this process imports Helion (the template imports it meanwhile),
    with Helion's jobs and pinned to the first GPU the process sees."""
    report = _before_helion(
        "install",
        HELION_AUTOTUNE_PRECOMPILE="spawn",
        HELION_AUTOTUNE_PRECOMPILE_JOBS="2",
        CUDA_VISIBLE_DEVICES="3,5",
    )
    assert report["helion_before"] is False
    assert report["built_early"] is True and report["template_during_import"] is True
    assert report["early_device"] == "3"
    assert report["max_workers"] == 2 and report["pids"] == 2
    # each worker: forked from the template that imported Helion, pinned to GPU "3"
    assert report["workers"] == [[True, "3"]]


@pytest.mark.slow  # a fresh interpreter; the default run has the spawn-mode sibling
@pytest.mark.timeout(240)
def test_install_before_helion_in_fork_mode_builds_nothing_early() -> None:
    report = _before_helion("install", HELION_AUTOTUNE_PRECOMPILE_JOBS="2")
    assert report["built_early"] is False and report["early_device"] is None
    assert report["template_during_import"] is False
    assert report["max_workers"] == 2


@pytest.mark.slow  # a fresh interpreter; refusals are in the default run in-process
@pytest.mark.timeout(240)
def test_install_before_helion_that_is_refused_leaves_nothing_built() -> None:
    """The executor built before the check is shut down when the check refuses: no process
    of it is left and the next install() starts from nothing."""
    report = _before_helion(
        "refuse", HELION_AUTOTUNE_PRECOMPILE="spawn", HELION_AUTOTUNE_PRECOMPILE_JOBS="2"
    )
    assert "injected: a changed signature" in report["refused"]
    assert report["children_left"] == []
    assert report["default"] == "None"


def test_use_patches_and_restores_also_on_exception(executor: PrecompileExecutor) -> None:
    assert not peh.installed()
    with pytest.raises(ZeroDivisionError), peh.use(executor) as ex:
        assert ex is executor and peh.installed()
        assert PrecompileFuture.__dict__["create"].__func__ is not HELION_ORIGINALS[0]
        1 / 0  # noqa: B018
    assert not peh.installed()
    assert _originals() == HELION_ORIGINALS


def test_use_nests_innermost_wins(executor: PrecompileExecutor) -> None:
    with PrecompileExecutor(1) as other, peh.use(executor):
        with peh.use(other):
            assert _seam.current_executor() is other
        assert _seam.current_executor() is executor
    assert not peh.installed()


def _on_a_thread(fn: Any) -> Any:
    """``fn()`` on a fresh thread (a fresh, empty context); what it returned."""
    import threading

    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    return box[0]


def test_a_use_block_is_seen_by_every_thread_while_open(executor: PrecompileExecutor) -> None:
    """The scope rule (docs/helion.md, "Which executor: the scope rule"): an autotune on any
    thread — a fresh one, a pool thread — goes through an open block; none after its exit."""
    from concurrent.futures import ThreadPoolExecutor

    with peh.use(executor):
        assert _on_a_thread(_seam.current_executor) is executor
        assert _on_a_thread(peh.installed)
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(_seam.current_executor).result(WAIT_S) is executor
    assert not _on_a_thread(peh.installed)
    with pytest.raises(RuntimeError, match="no use\\(\\) block and no install\\(\\)"):
        _seam.current_executor()


def test_the_innermost_block_here_wins_other_threads_follow_the_newest(
    executor: PrecompileExecutor,
) -> None:
    import threading

    entered, leave = threading.Event(), threading.Event()
    seen: list[Any] = []
    with PrecompileExecutor(1) as other, peh.use(executor):

        def other_block() -> None:
            with peh.use(other):
                seen.append(_seam.current_executor())
                entered.set()
                assert leave.wait(WAIT_S)

        thread = threading.Thread(target=other_block)
        thread.start()
        try:
            assert entered.wait(WAIT_S)
            assert _seam.current_executor() is executor  # this context's own block
            assert _on_a_thread(_seam.current_executor) is other  # the newest open block
        finally:
            leave.set()
            thread.join(WAIT_S)
        assert seen == [other]
        assert _on_a_thread(_seam.current_executor) is executor
    assert _originals() == HELION_ORIGINALS


def test_helion_is_patched_once_and_put_back_when_the_last_holder_leaves(
    executor: PrecompileExecutor,
) -> None:
    """The first holder patches, the last one restores; ``install()`` is the fallback below
    every open block, and ``uninstall()`` inside a block leaves the block's patch in place."""
    peh.install(executor)
    try:
        patched = PrecompileFuture.__dict__["create"]
        with PrecompileExecutor(1) as other, peh.use(other):
            assert PrecompileFuture.__dict__["create"] is patched  # not patched twice
            assert _on_a_thread(_seam.current_executor) is other
            peh.uninstall()
            assert peh.installed() and _seam.current_executor() is other
        assert not peh.installed()
        assert _originals() == HELION_ORIGINALS
    finally:
        peh.uninstall()


def test_install_is_process_wide_until_uninstall(executor: PrecompileExecutor) -> None:
    try:
        peh.install(executor)
        peh.install(executor)  # again: replaces, does not stack
        assert peh.installed() and _seam.current_executor() is executor
    finally:
        peh.uninstall()
    peh.uninstall()  # a no-op now
    assert not peh.installed()


def test_use_refuses_something_else_than_a_precompile_executor() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool, pytest.raises(TypeError, match="PrecompileExecutor"):
        with peh.use(pool):  # type: ignore[arg-type]
            pass


# -- fork mode on the CPU: real sm_90 compiles ----------------------------------------------------


def _args() -> tuple[Any, Any]:
    x = torch.randn(256, 256, dtype=torch.float16)
    return x, torch.randn_like(x)


def _configs(bound: Any, n: int) -> list[Any]:
    """``n`` distinct configs, none compiled in this process yet.

    Helion caches generated modules by source, so the same config of two kernels shares one
    ``JITFunction``: its in-memory compile cache is emptied here so the config really compiles.
    """
    base = bound.config_spec.default_config().config
    sizes = [(32, 4), (64, 4), (64, 8), (128, 2), (16, 4), (32, 8)]
    configs = [helion.Config(**{**base, "block_sizes": [b, 32], "num_warps": w}) for b, w in sizes]
    for config in configs[:n]:
        _jit(bound, config).device_caches.clear()
    return configs[:n]


def _jit(bound: Any, config: Any) -> Any:
    fn = bound.compile_config(config)
    return fn.__globals__[f"_helion_{fn.__name__}"]


_INJECTED: list[tuple[Any, Any]] = []


@pytest.fixture(autouse=True)
def _undo_injections() -> Iterator[None]:
    yield
    while _INJECTED:
        jit, real = _INJECTED.pop()
        jit.compile = real


def _context(bound: Any, args: Any, jobs: int = 2, **settings: Any) -> Any:
    s = helion.Settings(**settings)
    return PrecompileContext(
        settings=s, log=AutotuningLogger(s), kernel=bound, args=args, jobs=jobs
    )


@contextlib.contextmanager
def _fork_batch(tmp_path: Path, **settings: Any) -> Iterator[tuple[Any, Any, Any]]:
    """A bound kernel, its args and a fork-mode context, with a fresh Triton cache."""
    args = _args()
    old = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    try:
        with compile_only_driver(parse_target("cuda:90")):
            bound = _add().bind(args)
            yield bound, args, _context(bound, args, autotune_precompile="fork", **settings)
    finally:
        if old is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = old


def _create(ctx: Any, bound: Any, config: Any, args: Any) -> Any:
    return PrecompileFuture.create(
        ctx=ctx,
        config=config,
        fn=bound.compile_config(config),
        args=args,
        result_path="/nonexistent/result.pkl",
        args_path=None,
    )


def _inject(bound: Any, config: Any, fault: str) -> None:
    """Make the compile of ``config`` (in a forked child, which inherits this) do ``fault``."""
    jit = _jit(bound, config)
    real = jit.compile
    _INJECTED.append((jit, real))

    def faulty(*a: Any, **k: Any) -> Any:
        if fault == "raise":
            raise RuntimeError("injected compiler bug")
        if fault == "ptxas":
            raise type("PTXASError", (RuntimeError,), {})("ptxas fatal: injected")
        if fault == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if fault == "hang":
            time.sleep(600)
        if fault.startswith("sleep:"):  # a slow compile: its duration in seconds
            time.sleep(float(fault.split(":")[1]))
        if fault.startswith("key:"):  # write whether Triton's installation hash was inherited
            Path(fault.split(":", 1)[1]).write_text(str(_triton_key().cache_info().currsize))
        if fault.startswith("nice:"):  # write the compiling process's niceness and policy
            priority = (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))
            Path(fault.split(":", 1)[1]).write_text(" ".join(map(str, priority)))
        return real(*a, **k)

    jit.compile = faulty


def test_fork_mode_compiles_each_config_in_a_child(
    executor: PrecompileExecutor, tmp_path: Path
) -> None:
    with _fork_batch(tmp_path) as (bound, args, ctx), peh.use(executor):
        configs = _configs(bound, 4)
        futures = [_create(ctx, bound, c, args) for c in configs]
        assert all(isinstance(f, HelionFuture) and f.ok is None for f in futures)
        t0 = time.time()
        assert PrecompileFuture.wait_for_all(futures) == [True] * 4
        wall = time.time() - t0
    for f in futures:
        assert f.ok and f.failure_reason == "ok" and f.started
        assert f.process is not None and f.process.path == "fork" and f.process.pid != os.getpid()
        assert 0 < f.elapsed <= wall
    assert len({f.process.pid for f in futures}) == 4  # one child per config
    assert len(os.listdir(tmp_path / "triton")) >= 4  # the parent's cache was filled


@pytest.mark.parametrize("idle", [False, True], ids=["nice", "sched-idle"])
def test_fork_mode_children_compile_below_the_autotuning_process(
    executor: PrecompileExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, idle: bool
) -> None:
    """Streamed, the parent generates code and measures while children compile: they run at a
    lower priority (``NICENESS``, or ``SCHED_IDLE`` with ``IDLE_PRIORITY``), so the parent's
    share of the CPU holds when every core compiles."""
    from precompile_executor.helion import _fork_task

    monkeypatch.setattr(_fork_task, "IDLE_PRIORITY", idle)
    record = tmp_path / "niceness"
    with _fork_batch(tmp_path) as (bound, args, ctx), peh.use(executor):
        (config,) = _configs(bound, 1)
        future = _create(ctx, bound, config, args)
        _inject(bound, config, f"nice:{record}")
        assert PrecompileFuture.wait_for_all([future]) == [True]
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    nice, policy = map(int, record.read_text().split())
    if idle:
        assert (nice, policy) == (mine, os.SCHED_IDLE)
    else:
        assert (nice, policy) == (min(mine + _fork_task.NICENESS, 19), os.SCHED_OTHER)
        assert nice > mine
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # the parent's own is untouched
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def _triton_key() -> Any:
    """Triton's cached hash of its installation (``triton.runtime.cache`` from 3.9 on)."""
    import triton.compiler.compiler
    import triton.runtime.cache

    found = getattr(triton.runtime.cache, "triton_key", None)
    return found or triton.compiler.compiler.triton_key


def test_fork_mode_children_inherit_the_callers_warm_triton(
    executor: PrecompileExecutor, tmp_path: Path, fresh_helion_state: None
) -> None:
    """A child forked before this process hashed Triton's installation hashes it again in its
    own compile, every child (0.3–0.5 s each; docs/gpu-runs.md, "Helion, fork mode"): ``use()`` starts
    that work on a background thread and fork-mode precompiles fork after it."""
    from precompile_executor.helion import _warm

    _triton_key().cache_clear()  # as in a process that has not compiled yet
    record = tmp_path / "inherited"
    with _fork_batch(tmp_path) as (bound, args, ctx), peh.use(executor):
        (config,) = _configs(bound, 1)
        assert _triton_key().cache_info().currsize == 0  # codegen does not hash it
        future = _create(ctx, bound, config, args)
        _inject(bound, config, f"key:{record}")
        assert PrecompileFuture.wait_for_all([future]) == [True]
    assert record.read_text() == "1"
    assert list(peh.state.caller_warms) == [_warm.FALLBACK_TARGET]  # no CUDA context here
    assert not any(thread.is_alive() for thread in peh.state.caller_warms.values())


def test_a_caller_warm_up_that_fails_costs_nothing_but_its_head_start(
    executor: PrecompileExecutor,
    fresh_helion_state: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The background warm-up is only a head start: if it raises, that is logged (debug) and
    precompiles run as before."""
    from precompile_executor.helion import _warm
    from precompile_executor.triton import _prewarm

    def broken(target: str) -> None:
        raise RuntimeError(f"no backend for {target}")

    caplog.set_level(logging.DEBUG, logger="precompile_executor.helion")
    monkeypatch.setattr(_prewarm, "warm_caller", broken)
    with _fork_batch(tmp_path) as (bound, args, ctx), peh.use(executor):
        (config,) = _configs(bound, 1)
        future = _create(ctx, bound, config, args)
        assert PrecompileFuture.wait_for_all([future]) == [True]
    assert _warm.wait_caller_warm_up(timeout=5)
    assert f"warming this process's Triton for {_warm.FALLBACK_TARGET} failed" in caplog.text
    assert "no backend for" in caplog.text


def test_a_config_already_compiled_is_skipped_without_a_process(
    executor: PrecompileExecutor, tmp_path: Path
) -> None:
    with _fork_batch(tmp_path) as (bound, args, ctx), peh.use(executor):
        config = _configs(bound, 1)[0]
        fn = bound.compile_config(config)
        from helion.autotuner.precompile_future import _prepare_precompiler_for_fork

        assert _prepare_precompiler_for_fork(fn, args, config, bound, "", ctx.log)() is True
        (future,) = [_create(ctx, bound, config, args)]
        assert PrecompileFuture.wait_for_all([future]) == [True]
        assert future.process is None  # Helion's own skip future


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("ptxas", "error"), ("segfault", "error"), ("hang", "timeout")],
)
def test_fork_mode_a_failing_config_fails_alone(
    executor: PrecompileExecutor, tmp_path: Path, fault: str, reason: str
) -> None:
    with _fork_batch(tmp_path, autotune_compile_timeout=3) as (bound, args, ctx):
        configs = _configs(bound, 3)
        with peh.use(executor):
            futures = [_create(ctx, bound, c, args) for c in configs]
            _inject(bound, configs[1], fault)
            t0 = time.time()
            assert PrecompileFuture.wait_for_all(futures) == [True, False, True]
            assert time.time() - t0 < 30
    bad = futures[1]
    assert bad.failure_reason == reason and bad.process is not None
    if fault == "hang":
        assert 3.0 <= bad.elapsed < 10  # from the real start, to the kill
    assert [f.failure_reason for f in futures] == ["ok", reason, "ok"]


def test_fork_mode_raise_classified_error_aborts_as_helion_does(
    executor: PrecompileExecutor, tmp_path: Path
) -> None:
    with _fork_batch(tmp_path) as (bound, args, ctx):
        configs = _configs(bound, 3)
        with peh.use(executor):
            futures = [_create(ctx, bound, c, args) for c in configs]
            _inject(bound, configs[0], "raise")
            with pytest.raises(helion_exc.TritonError, match="injected compiler bug") as info:
                PrecompileFuture.wait_for_all(futures)
    assert "RuntimeError" in str(info.value)
    assert all(f.ok is not None for f in futures)


def test_fork_mode_ignore_errors_reports_failure_without_raising(
    executor: PrecompileExecutor, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _fork_batch(tmp_path, autotune_ignore_errors=True) as (bound, args, ctx):
        configs = _configs(bound, 2)
        with peh.use(executor):
            futures = [_create(ctx, bound, c, args) for c in configs]
            _inject(bound, configs[0], "raise")
            assert PrecompileFuture.wait_for_all(futures) == [False, True]
    assert futures[0].failure_reason == "error"
    assert "injected compiler bug" in str(futures[0].error)


def test_native_fork_mode_1_5_1_records_a_failed_compile_as_ok(tmp_path: Path) -> None:
    """The bug ours fixes (REFERENCE.md): Helion's own fork child exits 0 after sys.exit(1)."""
    with _fork_batch(tmp_path) as (bound, args, ctx):
        configs = _configs(bound, 2)
        futures = [
            PrecompileFuture.create(
                ctx=ctx,
                config=c,
                fn=bound.compile_config(c),
                args=args,
                result_path=str(tmp_path / f"result-{i}.pkl"),
                args_path=None,
            )
            for i, c in enumerate(configs)
        ]
        _inject(bound, configs[0], "ptxas")
        assert PrecompileFuture.wait_for_all(futures) == [True, True]  # the failure is lost


def test_jobs_caps_how_many_run_at_once(executor: PrecompileExecutor, tmp_path: Path) -> None:
    with _fork_batch(tmp_path) as (bound, args, _):
        ctx = _context(bound, args, jobs=1, autotune_precompile="fork")
        with peh.use(executor):
            futures = [_create(ctx, bound, c, args) for c in _configs(bound, 3)]
            assert PrecompileFuture.wait_for_all(futures) == [True] * 3
    spans = sorted((f.start_time, f.end_time) for f in futures)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end - 0.05  # one at a time


def test_ctrl_c_during_a_batch_kills_every_task(
    executor: PrecompileExecutor, tmp_path: Path, sigint_raises: None
) -> None:
    with _fork_batch(tmp_path) as (bound, args, ctx):
        configs = _configs(bound, 3)
        with peh.use(executor):
            futures = [_create(ctx, bound, c, args) for c in configs]
            for c in configs:
                _inject(bound, c, "hang")
            timer = _interrupt_after(1.5)
            t0 = time.time()
            with pytest.raises(KeyboardInterrupt):
                PrecompileFuture.wait_for_all(futures)
            timer.cancel()
    assert time.time() - t0 < 15
    assert [f.ok for f in futures] == [False, False, False]
    # no process left: the autouse fixture of conftest.py checks it


def _interrupt_after(seconds: float) -> Any:
    import threading

    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


# -- streaming: each config benchmarked as its precompile lands --------------------------------


def _slow_configs(bound: Any, args: Any, ctx: Any, faults: list[str]) -> list[Any]:
    """One config per fault, whose compile (in a forked child, which inherits this) does it."""
    from helion.autotuner.precompile_future import _prepare_precompiler_for_fork

    configs = _configs(bound, len(faults))
    for config, fault in zip(configs, faults, strict=True):
        fn = bound.compile_config(config)
        _prepare_precompiler_for_fork(fn, args, config, bound, "", ctx.log)  # sets jit.compile
        _inject(bound, config, fault)
    return configs


def _streaming_provider(
    bound: Any,
    args: Any,
    measured: list[tuple[Any, float]],
    reference: Any = None,
    **settings: Any,
):
    """Helion's provider with ours streaming on top; only the GPU parts stand in: the baseline's
    reference run (it launches the kernel: ``reference(cloned args)``) and the timing of one
    config (records when, returns 1 ms)."""
    from benchmarks._helion_cpu import on_the_cpu
    from precompile_executor.helion._provider import StreamingBenchmarkProvider

    def measure(config: Any) -> float:
        measured.append((config, time.time()))
        return 1.0

    s = helion.Settings(autotune_precompile="fork", autotune_progress_bar=False, **settings)
    return on_the_cpu(StreamingBenchmarkProvider, bound, args, s, measure, reference)


@pytest.mark.timeout(240)
def test_streaming_benchmarks_in_completion_order_straggler_later_timeout_stays(
    tmp_path: Path,
) -> None:
    """Four configs whose precompiles take 4 s, ~0, 2 s and forever (timeout 8 s): each is
    benchmarked as soon as its precompile lands — the fast ones while the slow ones still
    compile, the straggler when it lands — and the hang is a timeout, never benchmarked."""
    measured: list[tuple[Any, float]] = []
    with (
        PrecompileExecutor(4) as executor,
        _fork_batch(tmp_path) as (bound, args, ctx),
        peh.use(executor),
    ):
        configs = _slow_configs(bound, args, ctx, ["sleep:4", "none", "sleep:2", "hang"])
        provider = _streaming_provider(
            bound, args, measured, autotune_compile_timeout=8, autotune_precompile_jobs=4
        )
        provider.setup()
        seen: list[Any] = []
        real = provider._create_precompile_future

        def keep(config: Any, fn: Any) -> Any:
            future = real(config, fn)
            seen.append(future)
            return future

        provider._create_precompile_future = keep
        try:
            results = provider.benchmark(configs)
        finally:
            provider.cleanup()
    order = [c for c, _ in measured]
    assert order == [configs[1], configs[2], configs[0]]  # completion order
    futures = {id(f.config): f for f in seen if isinstance(f, HelionFuture)}
    straggler = futures[id(configs[0])]
    # the fast config was measured while the straggler was still compiling
    assert measured[0][1] < straggler.end_time
    assert [r.status for r in results] == ["ok", "ok", "ok", "timeout"]
    assert results[3].perf == float("inf")
    for r, c in zip(results[:3], configs[:3], strict=True):
        assert r.compile_time == pytest.approx(futures[id(c)].elapsed)
    assert results[0].compile_time > results[2].compile_time > results[1].compile_time


@pytest.mark.timeout(240)
def test_streaming_a_raise_verdict_aborts_the_batch_and_kills_the_rest(tmp_path: Path) -> None:
    measured: list[tuple[Any, float]] = []
    with (
        PrecompileExecutor(4) as executor,
        _fork_batch(tmp_path) as (bound, args, ctx),
        peh.use(executor),
    ):
        configs = _slow_configs(bound, args, ctx, ["hang", "raise", "hang"])
        provider = _streaming_provider(
            bound, args, measured, autotune_compile_timeout=120, autotune_precompile_jobs=4
        )
        provider.setup()
        try:
            with pytest.raises(helion_exc.TritonError, match="injected compiler bug"):
                provider.benchmark(configs)
        finally:
            provider.cleanup()
    assert measured == []
    # the two hanging children were killed: the autouse leak check of conftest.py sees to it


@pytest.mark.timeout(240)
def test_fork_mode_baseline_runs_while_the_first_batch_compiles(tmp_path: Path) -> None:
    """Helion runs its baseline when the provider is built; ours runs it in the first batch,
    after the precompiles started and before the first measurement — once, with Helion's own
    bookkeeping (the mutated arguments it shows, the set-up that needs it)."""
    measured: list[tuple[Any, float]] = []
    baselines: list[float] = []

    def reference(cloned: Any) -> Any:
        baselines.append(time.time())
        cloned[0].add_(1)  # mutates its first argument: Helion must see it
        return cloned[0] + cloned[1]

    with (
        PrecompileExecutor(2) as executor,
        _fork_batch(tmp_path) as (bound, args, ctx),
        peh.use(executor),
    ):
        before = [a.clone() for a in args]
        configs = _slow_configs(bound, args, ctx, ["sleep:2", "sleep:2", "none"])
        provider = _streaming_provider(bound, args, measured, reference, autotune_precompile_jobs=2)
        provider.setup()
        assert baselines == []  # not at construction nor at set-up
        seen: list[Any] = []
        real_add = peh._future.Stream.add

        def add(stream: Any, hf: Any) -> None:
            seen.append(hf)
            real_add(stream, hf)

        peh._future.Stream.add = add
        try:
            results = provider.benchmark(configs)
        finally:
            peh._future.Stream.add = real_add
            provider.cleanup()
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    assert len(baselines) == 1
    assert len(seen) == 3 and seen[0].start_time is not None
    assert seen[0].start_time < baselines[0] < min(t for _, t in measured)
    assert baselines[0] < seen[0].end_time  # the children were compiling meanwhile
    assert list(provider.mutated_arg_indices) == [0]
    for a, b in zip(args, before, strict=True):
        assert torch.equal(a, b)  # the caller's tensors: untouched by the precompiles


@pytest.mark.timeout(240)
def test_fork_mode_a_failing_deferred_baseline_raises_and_kills_the_batch(tmp_path: Path) -> None:
    measured: list[tuple[Any, float]] = []

    def reference(cloned: Any) -> Any:
        raise RuntimeError("the reference run failed")

    with (
        PrecompileExecutor(2) as executor,
        _fork_batch(tmp_path) as (bound, args, ctx),
        peh.use(executor),
    ):
        configs = _slow_configs(bound, args, ctx, ["hang", "hang"])
        provider = _streaming_provider(bound, args, measured, reference, autotune_precompile_jobs=2)
        provider.setup()
        t0 = time.monotonic()
        try:
            with pytest.raises(RuntimeError, match="the reference run failed"):
                provider.benchmark(configs)
            with pytest.raises(RuntimeError, match="the reference run failed"):
                provider.mutated_arg_indices  # noqa: B018 -- read again: raises again
        finally:
            provider.cleanup()
    assert time.monotonic() - t0 < 60  # the hanging children were killed, not waited for
    assert measured == []


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.timeout(240)
def test_fork_mode_forks_as_each_config_is_generated_or_after_the_batch(
    batched: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default each config's child is forked as soon as its code exists; with
    ``FORKS_AFTER_CODEGEN`` every config is generated first and the children are forked back to
    back (each fork makes the parent's pages copy-on-write again: docs/helion.md)."""
    from precompile_executor.helion import _provider

    monkeypatch.setattr(_provider, "FORKS_AFTER_CODEGEN", batched)
    events: list[str] = []
    with (
        PrecompileExecutor(3) as executor,
        _fork_batch(tmp_path) as (bound, args, ctx),
        peh.use(executor),
    ):
        configs = _configs(bound, 3)
        provider = _streaming_provider(bound, args, [], autotune_precompile_jobs=3)
        provider.setup()
        real_codegen = bound.compile_config
        real_add = peh._future.Stream.add

        def codegen(config: Any, **kw: Any) -> Any:
            events.append("codegen")
            return real_codegen(config, **kw)

        def add(stream: Any, hf: Any) -> None:
            events.append("fork")
            real_add(stream, hf)

        monkeypatch.setattr(bound, "compile_config", codegen)
        monkeypatch.setattr(peh._future.Stream, "add", add)
        try:
            results = provider.benchmark(configs)
        finally:
            provider.cleanup()
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    first = events[: events.index("fork", events.index("fork") + 1) + 1]  # up to the 2nd fork
    if batched:
        assert first == ["codegen", "codegen", "codegen", "fork", "fork"]
    else:
        assert first == ["codegen", "fork", "codegen", "fork"]


@pytest.mark.parametrize("why", ["spawn", "large"])
def test_the_baseline_runs_at_construction_when_it_cannot_wait(
    why: str, executor: PrecompileExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spawn mode sizes its jobs from the baseline's output; tensors over the copy limit would
    need a scratch copy: both keep Helion's order."""
    from benchmarks._helion_cpu import on_the_cpu
    from precompile_executor.helion import _provider

    ran: list[bool] = []
    if why == "large":
        monkeypatch.setattr(_provider, "DEFERRED_BASELINE_MAX_BYTES", 1)
    args = _args()
    with compile_only_driver(parse_target("cuda:90")), peh.use(executor):
        bound = _add().bind(args)
        s = helion.Settings(
            autotune_precompile="spawn" if why == "spawn" else "fork", autotune_progress_bar=False
        )
        on_the_cpu(
            _provider.StreamingBenchmarkProvider,
            bound,
            args,
            s,
            lambda c: 1.0,
            lambda cloned: ran.append(True),
        )
    assert ran == [True]


@pytest.mark.timeout(240)
def test_helions_benchmark_worker_starts_with_the_provider_and_warms_up(
    tmp_path: Path, executor: PrecompileExecutor
) -> None:
    """Helion starts its benchmark subprocess at the first measurement; ours starts that same
    worker when the provider is built and warms it in the background. The first read of the
    worker waits for the warm-up, and Helion's next job runs in the same, warm process."""
    import psutil

    from benchmarks._helion_cpu import on_the_cpu
    from precompile_executor.helion._provider import StreamingBenchmarkProvider

    with _fork_batch(tmp_path) as (bound, args, _ctx), peh.use(executor):
        s = helion.Settings(autotune_precompile="fork", autotune_progress_bar=False)
        provider = on_the_cpu(
            StreamingBenchmarkProvider, bound, args, s, lambda c: 1.0, benchmark_subprocess=True
        )
        early = provider.__dict__["_early_benchmark_worker"]
        try:
            pid = early.worker._process.pid  # started by the constructor, before any batch
            assert psutil.Process(pid).ppid() == os.getpid()
            worker = provider._benchmark_worker  # waits for the warm-up's round trip
            assert early.ended is not None and early.error is None
            assert early.result["pid"] == pid
            assert worker.run(os.getpid, timeout=60) == pid  # no second cold start
        finally:
            provider.cleanup()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow  # two cold torch imports
@pytest.mark.timeout(240)
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a warm-up that fails: no CUDA")
def test_a_benchmark_worker_that_cannot_warm_up_is_replaced_by_a_fresh_one() -> None:
    """A worker whose warm-up fails (here: no CUDA device for the kernel's ``cuda:0``) would
    fail every measurement after it; it is stopped, and Helion's next job starts a new one."""
    import psutil

    from precompile_executor.helion import _bench_worker

    s = helion.Settings(autotune_benchmark_subprocess=True)
    early = _bench_worker.start_early(s, torch.device("cuda:0"))
    assert early is not None
    first = early.worker._process.pid
    try:
        early.join()
        assert early.error is not None and early.result is None
        assert not psutil.pid_exists(first) or (
            psutil.Process(first).status() == psutil.STATUS_ZOMBIE
        )
        fresh = early.worker.run(os.getpid, timeout=120)  # Helion's own restart
        assert fresh != first
    finally:
        early.worker.shutdown()


_KILLED_SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
import helion
import psutil
import precompile_executor.helion as peh
from benchmarks._helion_cpu import on_the_cpu
from precompile_executor import PrecompileExecutor
from precompile_executor.helion._provider import StreamingBenchmarkProvider
from precompile_executor.triton import compile_only_driver, parse_target
from test_helion import _add, _args

args = _args()
with PrecompileExecutor(2) as ex, peh.use(ex), compile_only_driver(parse_target("cuda:90")):
    bound = _add().bind(args)
    s = helion.Settings(autotune_precompile="fork", autotune_progress_bar=False)
    p = on_the_cpu(
        StreamingBenchmarkProvider, bound, args, s, lambda c: 1.0, benchmark_subprocess=True
    )
    worker = p.__dict__["_early_benchmark_worker"].worker._process.pid
    if sys.argv[2] == "batch":  # mid-batch: two fork-mode compiles hang in their children
        import threading
        from helion.autotuner.precompile_future import PrecompileFuture
        from test_helion import _configs, _context, _create, _inject

        p._benchmark_worker  # warm
        before = len(psutil.Process().children(recursive=True))
        ctx = _context(bound, args, autotune_precompile="fork")
        configs = _configs(bound, 2)
        futures = [_create(ctx, bound, c, args) for c in configs]
        for c in configs:
            _inject(bound, c, "hang")
        # On another thread, as an autotune may run: the open use() block reaches it too.
        threading.Thread(target=PrecompileFuture.wait_for_all, args=(futures,), daemon=True).start()
        deadline = time.monotonic() + 60
        while len(psutil.Process().children(recursive=True)) < before + 2:
            assert time.monotonic() < deadline, "the batch's children never started"
            time.sleep(0.05)
    else:
        time.sleep(float(sys.argv[2]))
    print(worker, *(c.pid for c in psutil.Process().children(recursive=True)), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""

DIES_WITH_ITS_PARENT_S = 2.0
"""How soon after a SIGKILL of the autotuning process every process it started is gone: the
guardians kill at once (docs/helion.md, "Helion's benchmark subprocess, started before the
autotune"); the rest is the kernel's and the scheduler's."""


def _pids_printed_before_its_sigkill(
    argv: list[str], env: dict[str, str] | None = None
) -> list[int]:
    """Run a script that prints pids on its first line and then SIGKILLs itself; check that it
    did, return the pids (whose processes should die with the script), as soon as it is dead.

    Its output is not read to the end: its children inherit the pipe, and waiting for the end of
    it would wait for them too (``subprocess.run`` would).
    """
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", *argv],
            cwd=Path(__file__).parent.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        assert proc.stdout is not None
        with proc.stdout:
            first = proc.stdout.readline()
            returncode = proc.wait(timeout=200)
        stderr.seek(0)
        assert returncode == -signal.SIGKILL, stderr.read()[-4000:]
    return list(dict.fromkeys(int(pid) for pid in first.split()))


def _assert_all_gone(pids: list[int], timeout_s: float = DIES_WITH_ITS_PARENT_S) -> None:
    """Every process of ``pids`` is gone (or a zombie) within ``timeout_s`` of now."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    left = []
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            left.append(f"{proc.pid}: {' '.join(proc.cmdline())[:150]}")
            proc.kill()  # not left for later tests
    assert not left, f"alive {timeout_s} s after the SIGKILL:\n" + "\n".join(left)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "after",
    [
        "0.5",
        pytest.param("8", marks=pytest.mark.slow),
        "batch",
    ],  # "warm": a longer wait, same cleanup
    ids=["warming", "warm", "mid-batch"],
)
def test_a_sigkill_of_the_autotuning_process_leaves_no_process(after: str, tmp_path: Path) -> None:
    """The benchmark worker the provider started (Helion's own ``_start``) and every other
    process of the autotuning process die with it: killed while the worker still starts, after
    it warmed up, or while a fork-mode batch compiles (the compile children hang)."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    argv = [_KILLED_SCRIPT, str(Path(__file__).parent), after]
    pids = _pids_printed_before_its_sigkill(argv, env)
    assert len(pids) >= (4 if after == "batch" else 2)  # the worker, the tracker, children...
    _assert_all_gone(pids)


@pytest.mark.timeout(240)
def test_an_autotune_cut_short_kills_the_benchmark_worker_still_warming_up(
    tmp_path: Path, executor: PrecompileExecutor
) -> None:
    """``cleanup()`` while the worker still starts (an autotune that failed or was interrupted
    early) kills it instead of waiting for its cold start; no process is left."""
    import psutil

    from benchmarks._helion_cpu import on_the_cpu
    from precompile_executor.helion._provider import StreamingBenchmarkProvider

    with _fork_batch(tmp_path) as (bound, args, _ctx), peh.use(executor):
        s = helion.Settings(autotune_precompile="fork", autotune_progress_bar=False)
        provider = on_the_cpu(
            StreamingBenchmarkProvider, bound, args, s, lambda c: 1.0, benchmark_subprocess=True
        )
        early = provider.__dict__["_early_benchmark_worker"]
        pid = early.worker._process.pid
        warming = early.ended is None  # a new interpreter importing torch: still running
        provider.cleanup()
    assert early.ended is not None
    if warming:
        assert early.error is not None  # its round trip was cut, not completed
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_every_search_gets_the_streaming_provider(executor: PrecompileExecutor) -> None:
    """PatternSearch and LFBO do not forward benchmark_provider_cls: the seam chooses it."""
    from helion.autotuner.base_search import BaseSearch
    from helion.autotuner.benchmark_provider import LocalBenchmarkProvider

    from precompile_executor.helion._provider import StreamingBenchmarkProvider

    chosen: list[Any] = []

    class Search:  # what BaseSearch.__init__ leaves for _prepare
        _benchmark_provider_cls = LocalBenchmarkProvider

    class Custom(LocalBenchmarkProvider):  # type: ignore[misc]
        pass

    def prepare(self: Any) -> None:
        chosen.append(self._benchmark_provider_cls)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BaseSearch, "_prepare", prepare)
        with peh.use(executor):
            BaseSearch._prepare(Search())
            custom = Search()
            custom._benchmark_provider_cls = Custom
            BaseSearch._prepare(custom)
        BaseSearch._prepare(Search())
    assert chosen == [StreamingBenchmarkProvider, Custom, LocalBenchmarkProvider]


# -- the GPU lease: real processes, no GPU --------------------------------------------------------

_HOLDER = """
import os, sys, time
from precompile_executor.helion._lease import GpuLease
directory, mode, name, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lease = GpuLease("GPU-test", directory)
hold = getattr(lease, mode)
for i in range(rounds):
    with hold():
        start = time.monotonic()
        open(os.path.join(directory, f"{name}.in"), "w").close()
        gate = os.path.join(directory, f"{name}.go")
        while rounds == 1 and not os.path.exists(gate) and time.monotonic() - start < 60:
            time.sleep(0.01)
        if rounds > 1:
            time.sleep(0.005)
        end = time.monotonic()
    with open(os.path.join(directory, f"{name}.spans"), "a") as f:
        f.write(f"{start} {end}\\n")
"""


def _holder(directory: Path, mode: str, name: str, rounds: int = 1) -> subprocess.Popen[bytes]:
    script = directory / "holder.py"
    if not script.exists():
        script.write_text(_HOLDER)
    return subprocess.Popen([sys.executable, str(script), str(directory), mode, name, str(rounds)])


def _wait_for(path: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.02)


def _wait_blocked(pid: int, timeout_s: float = 60) -> None:
    """Wait until ``pid`` waits for a file lock (the kernel lists waiters in /proc/locks)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with open("/proc/locks") as f:
            if any("->" in line and str(pid) in line.split() for line in f):
                return
        assert time.monotonic() < deadline, f"pid {pid} never waited for the lease"
        time.sleep(0.02)


def _spans(directory: Path, name: str) -> list[tuple[float, float]]:
    text = (directory / f"{name}.spans").read_text().split()
    values = [float(v) for v in text]
    return list(zip(values[::2], values[1::2], strict=True))


@pytest.mark.timeout(180)
def test_gpu_lease_shared_holders_together_exclusive_alone_and_first_in_line(
    tmp_path: Path,
) -> None:
    """Worker runs (shared) hold the lease side by side; a measurement (exclusive) waits for them,
    and a worker run that asks after the measurement waits behind it (the turnstile)."""
    first, second = _holder(tmp_path, "shared", "s1"), _holder(tmp_path, "shared", "s2")
    procs = [first, second]
    try:
        _wait_for(tmp_path / "s1.in")
        _wait_for(tmp_path / "s2.in")  # both inside at once
        measurement = _holder(tmp_path, "exclusive", "m")
        procs.append(measurement)
        _wait_blocked(measurement.pid)  # it asked, and waits for the two shared holders
        assert not (tmp_path / "m.in").exists()
        late = _holder(tmp_path, "shared", "s3")  # asks after the measurement did
        procs.append(late)
        _wait_blocked(late.pid)  # held at the turnstile
        assert not (tmp_path / "s3.in").exists()
        for name in ("s1", "s2"):
            (tmp_path / f"{name}.go").touch()
        _wait_for(tmp_path / "m.in")
        (tmp_path / "m.go").touch()
        _wait_for(tmp_path / "s3.in")
        (tmp_path / "s3.go").touch()
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    ((m_start, m_end),) = _spans(tmp_path, "m")
    ((s3_start, _),) = _spans(tmp_path, "s3")
    assert max(end for _, end in _spans(tmp_path, "s1") + _spans(tmp_path, "s2")) <= m_start
    assert m_end <= s3_start


@pytest.mark.timeout(180)
def test_gpu_lease_measurements_never_overlap_worker_runs(tmp_path: Path) -> None:
    """Three processes take the lease shared and one exclusive, 30 times each: no exclusive
    span overlaps any other span."""
    names = ["w1", "w2", "w3"]
    procs = [_holder(tmp_path, "shared", n, rounds=30) for n in names]
    procs.append(_holder(tmp_path, "exclusive", "m", rounds=30))
    try:
        for p in procs:
            assert p.wait(timeout=150) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    exclusive = _spans(tmp_path, "m")
    others = [s for n in names for s in _spans(tmp_path, n)]
    assert len(exclusive) == 30 and len(others) == 90
    for start, end in exclusive:
        assert all(o_end <= start or o_start >= end for o_start, o_end in others)


@pytest.mark.timeout(120)
def test_gpu_lease_is_released_when_its_holder_is_sigkilled(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "exclusive", "dead")
    try:
        _wait_for(tmp_path / "dead.in")
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        after = _holder(tmp_path, "exclusive", "next")
        _wait_for(tmp_path / "next.in")
        (tmp_path / "next.go").touch()
        assert after.wait(timeout=60) == 0
    finally:
        for p in (holder,):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def test_gpu_lease_refuses_a_key_that_is_not_a_file_name(tmp_path: Path) -> None:
    from precompile_executor.helion._lease import GpuLease

    with pytest.raises(ValueError, match="plain file name"):
        GpuLease("../etc", str(tmp_path))


# -- spawn mode on the CPU: stand-in generated modules on warm workers ---------------------------

_GENERATED = {
    "ok": """
        import os
        def kernel(x, y, out_dir):
            name = os.path.join(out_dir, f"{os.getpid()}-{id(x)}-INDEX")
            with open(name, "w") as f:
                f.write(os.environ.get("TRITON_CACHE_DIR", ""))
            return x + y
    """,
    "raise": """
        def kernel(x, y, out_dir):
            raise RuntimeError("injected failure at launch")
    """,
    "sticky": """
        def kernel(x, y, out_dir):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    """,
    "segfault": """
        import os, signal
        def kernel(x, y, out_dir):
            os.kill(os.getpid(), signal.SIGSEGV)
    """,
    "hang": """
        import time
        def kernel(x, y, out_dir):
            time.sleep(600)
    """,
}


def _generated_fn(tmp_path: Path, kind: str, index: int) -> Any:
    """A stand-in for a config's generated module: a file holding ``kernel``."""
    name = f"_pe_generated_{kind}_{index}_{os.getpid()}_{time.monotonic_ns()}"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(_GENERATED[kind]).replace("INDEX", str(index)))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.kernel


@contextlib.contextmanager
def _spawn_batch(tmp_path: Path, **settings: Any) -> Iterator[tuple[Any, Any, Any]]:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = (*_args(), str(out_dir))
    with compile_only_driver(parse_target("cuda:90")):
        bound = _add().bind(args[:2])
    yield bound, args, _context(bound, args, autotune_precompile="spawn", **settings)


def _spawn_create(ctx: Any, config: Any, fn: Any) -> Any:
    return PrecompileFuture.create(
        ctx=ctx, config=config, fn=fn, args=ctx.args, result_path="/nonexistent", args_path=None
    )


def test_spawn_mode_runs_each_config_on_warm_workers_with_the_parents_triton_cache(
    executor: PrecompileExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor.warm_up(timeout=WAIT_S)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "autotune-cache"))
    with _spawn_batch(tmp_path) as (bound, args, ctx), peh.use(executor):
        configs = _configs(bound, 4)
        fns = [_generated_fn(tmp_path, "ok", i) for i in range(4)]
        futures = [_spawn_create(ctx, c, fn) for c, fn in zip(configs, fns, strict=True)]
        assert PrecompileFuture.wait_for_all(futures) == [True] * 4
    written = list((tmp_path / "out").iterdir())
    assert len(written) == 4
    assert {p.read_text() for p in written} == {str(tmp_path / "autotune-cache")}
    pids = {f.process.pid for f in futures}
    assert pids <= set(executor.warm_up(timeout=WAIT_S))  # warm workers, not fresh interpreters
    # arguments loaded once per worker per batch: one id(x) per worker
    assert len({tuple(p.name.split("-")[:2]) for p in written}) == len(pids)
    for f in futures:
        assert f.failure_reason == "ok" and f.process.path == "spawn" and f.elapsed > 0


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("sticky", "error"), ("segfault", "error"), ("hang", "timeout")],
)
def test_spawn_mode_a_faulting_config_fails_alone(
    executor: PrecompileExecutor, tmp_path: Path, kind: str, reason: str
) -> None:
    executor.warm_up(timeout=WAIT_S)
    before = executor.statistics().worker_restarts
    with _spawn_batch(tmp_path, autotune_compile_timeout=10) as (bound, args, ctx):
        configs = _configs(bound, 3)
        kinds = ["ok", kind, "ok"]
        fns = [_generated_fn(tmp_path, k, i) for i, k in enumerate(kinds)]
        with peh.use(executor):
            futures = [_spawn_create(ctx, c, fn) for c, fn in zip(configs, fns, strict=True)]
            assert PrecompileFuture.wait_for_all(futures) == [True, False, True]
    assert futures[1].failure_reason == reason
    if kind == "sticky":  # the worker retires after reporting; the executor replaces it
        deadline = time.monotonic() + 30
        while executor.statistics().worker_restarts == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert executor.statistics().worker_restarts > before


def test_spawn_mode_raise_classified_error_aborts(
    executor: PrecompileExecutor, tmp_path: Path
) -> None:
    with _spawn_batch(tmp_path) as (bound, args, ctx), peh.use(executor):
        configs = _configs(bound, 2)
        fns = [_generated_fn(tmp_path, "raise", 0), _generated_fn(tmp_path, "ok", 1)]
        futures = [_spawn_create(ctx, c, fn) for c, fn in zip(configs, fns, strict=True)]
        with pytest.raises(helion_exc.TritonError, match="injected failure at launch"):
            PrecompileFuture.wait_for_all(futures)


@pytest.mark.timeout(180)
def test_spawn_worker_compiles_with_a_launcher_that_launches_nothing(tmp_path: Path) -> None:
    """A spawn worker compiles a config outside the GPU lease: Helion's generated host function
    runs with our compile-only launcher, which fills the JIT's cache (the real call is then a
    cache hit) and launches nothing (the compile-only driver here could not launch)."""
    from precompile_executor.helion._spawn_task import _compile_only, _takes_launcher

    with _fork_batch(tmp_path) as (bound, args, _):
        (config,) = _configs(bound, 1)
        fn = bound.compile_config(config)
        assert _takes_launcher(fn)
        fn(*args, _launcher=_compile_only)
        caches = _jit(bound, config).device_caches
        assert sum(len(kernels) for kernels, *_ in caches.values()) == 1
    assert os.listdir(tmp_path / "triton")  # the binary went to the Triton cache on disk


def test_spawn_mode_module_cache_by_source_hash(tmp_path: Path) -> None:
    from helion.autotuner.precompile_future import _serialize_compiled_fn

    from precompile_executor.helion import _spawn_task

    spec = _serialize_compiled_fn(_generated_fn(tmp_path, "ok", 0))
    a = _spawn_task.generated_kernel(spec)
    assert a == _spawn_task.generated_kernel(spec)  # same source, same env: same key
    before = _spawn_task.loaded_modules()
    x, y = _args()
    a(x, y, str(tmp_path))
    a(x, y, str(tmp_path))
    assert _spawn_task.loaded_modules() == before + 1


# -- on a GPU: real autotunes --------------------------------------------------------------------

gpu = pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")


def _run_script(
    script: str, timeout_s: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a GPU scenario in a fresh interpreter (spawn mode needs a __main__ guard, and the fork
    path must not run in a process that has a CUDA context)."""
    return subprocess.run(
        [sys.executable, _script_file(script)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "HELION_SKIP_CACHE": "1", **(env or {})},
    )


def _script_file(script: str) -> str:
    """Write ``script`` to a file: Helion reads its kernels' source (``inspect.getsource``),
    which a ``python -c`` script does not have."""
    fd, path = tempfile.mkstemp(prefix="helion-gpu-", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(textwrap.dedent(script))
    return path


_GPU_PRELUDE = """
    import os, sys, time, random, logging, signal
    # KeyboardInterrupt on SIGINT even when the suite runs with SIGINT ignored (see
    # tests/conftest.py, sigint_raises): the Ctrl-C test interrupts this script.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, os.getcwd())
    from benchmarks.helion_bench import inject_fault, shim_intel_gpu_error, worker_init
    shim_intel_gpu_error()
    import torch, helion, helion.language as hl
    from helion.autotuner.precompile_future import PrecompileFuture
    from helion.autotuner.random_search import RandomSearch
    from precompile_executor import PrecompileExecutor, stop_idle_workers
    import precompile_executor.helion as peh

    # These scripts inject faults into spawn-mode runs: every config must reach a spawn worker,
    # none compiled on the fork path while the workers start (docs/helion.md, "Cold start").
    from precompile_executor.helion import _future
    _future.STEALS_WHILE_WORKERS_START = False
    FAULT = os.environ.get("PE_FAULT", "")

    @helion.kernel(static_shapes=True)
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        for tile in hl.tile(out.size()):
            out[tile] = x[tile] + y[tile]
        return out
"""


@gpu
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("mode", "setup"), [("fork", "ex"), ("spawn", "ex"), ("spawn", "none")])
def test_gpu_autotune_with_ours(mode: str, setup: str) -> None:
    """A real autotune, streamed; ``none``: ``use()`` builds and warms the executor itself."""
    line = "peh.use(ex)" if setup == "ex" else "peh.use()"
    proc = _run_script(
        _GPU_PRELUDE
        + f"""
    if __name__ == "__main__":
        from precompile_executor.helion._provider import StreamingBenchmarkProvider
        providers = []
        real = StreamingBenchmarkProvider.benchmark
        def counting(self, configs, **kw):
            providers.append(len(configs))
            return real(self, configs, **kw)
        StreamingBenchmarkProvider.benchmark = counting
        random.seed(0)
        x = torch.randn(2048, 2048, device="cuda", dtype=torch.float16); y = torch.randn_like(x)
        add.settings.autotune_precompile = "{mode}"
        add.settings.autotuner_fn = lambda k, a, **kw: RandomSearch(k, a, count=8)
        with PrecompileExecutor(8, initializer=worker_init) as ex, {line}:
            best = add.autotune((x, y), force=True)
        torch.testing.assert_close(add(x, y), x + y)
        print("STREAMED", providers)
        print("BEST", best)
    """,
        env={"HELION_AUTOTUNE_PRECOMPILE": mode},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "BEST" in proc.stdout
    assert "STREAMED [8" in proc.stdout, proc.stdout[-3000:]  # the batch went through ours


_FAULT_SCRIPT = """
    if __name__ == "__main__":
        import psutil
        random.seed(0)
        x = torch.randn(2048, 2048, device="cuda", dtype=torch.float16); y = torch.randn_like(x)
        add.settings.autotune_precompile = "spawn"
        add.settings.autotune_compile_timeout = 20
        add.settings.autotuner_fn = lambda k, a, **kw: RandomSearch(k, a, count=6)
        oks = []
        real_wait = PrecompileFuture.__dict__["wait_for_all"].__func__
        with PrecompileExecutor(4, initializer=worker_init) as ex, peh.use(ex):
            real_wait = PrecompileFuture.__dict__["wait_for_all"].__func__
            def counting(futures, desc=None):
                ok = real_wait(futures, desc)
                oks.extend(ok)
                return ok
            PrecompileFuture.wait_for_all = staticmethod(counting)
            with inject_fault(FAULT, every=3):
                best = add.autotune((x, y), force=True)
        torch.testing.assert_close(add(x, y), x + y)
        print("OKS", oks.count(True), "FAILED", oks.count(False))
        stop_idle_workers()
        time.sleep(2)
        # Long-lived helpers of the process, not of the batch: loky's resource tracker and the
        # executor's guardian (whose code ignores SIGINT), as the suite's leak check counts them.
        left = [p for p in psutil.Process().children(recursive=True)
                if not any(m in " ".join(p.cmdline()) for m in ("resource_tracker", "SIG_IGN"))]
        print("LEFT", len(left), [" ".join(p.cmdline())[:120] for p in left])
        print("BEST", best)
"""


@gpu
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("fault", ["segfault", "hang", "illegal_memory_access"])
def test_gpu_injected_fault_fails_alone_and_the_autotune_completes(fault: str) -> None:
    proc = _run_script(_GPU_PRELUDE + _FAULT_SCRIPT, env={"PE_FAULT": fault})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    said = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "BEST" in proc.stdout, said
    counts = proc.stdout.split("OKS", 1)[1].split()
    oks, failed = int(counts[0]), int(counts[2])
    assert failed >= 2 and oks >= 1, said  # the 1st and the 4th config faulted; the rest went on
    assert "LEFT 0 " in proc.stdout, said


@gpu
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_ctrl_c_during_a_batch_leaves_no_process() -> None:
    import psutil

    script = (
        _GPU_PRELUDE
        + """
    if __name__ == "__main__":
        x = torch.randn(2048, 2048, device="cuda", dtype=torch.float16); y = torch.randn_like(x)
        add.settings.autotune_precompile = "spawn"
        add.settings.autotuner_fn = lambda k, a, **kw: RandomSearch(k, a, count=16)
        with (PrecompileExecutor(4, initializer=worker_init) as ex, peh.use(ex),
              inject_fault("hang", every=1)):
            print("STARTED", flush=True)
            add.autotune((x, y), force=True)
    """
    )
    proc = subprocess.Popen(
        [sys.executable, _script_file(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "STARTED" in line:
                break
        time.sleep(20)  # inside the first precompile batch: every config hangs
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the batch should be running in workers"
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"left behind: {[p.pid for p in alive]}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()  # else its ResourceWarning fails the test (filterwarnings = error)


@gpu
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("first", ["use", "install"], ids=["use", "install-first"])
def test_gpu_sigkill_of_the_autotuning_process_leaves_no_process_and_no_gpu_memory(
    first: str,
) -> None:
    """``install-first``: ``install()`` as the program's first lines, so the tree also holds
    the spare benchmark worker (docs/helion.md, "Helion's benchmark subprocess, started before
    the autotune") and the template the environment's spawn mode started early."""
    import psutil

    top = "    import precompile_executor.helion as peh\n    peh.install()\n"
    script = (
        (top if first == "install" else "")
        + _GPU_PRELUDE
        + f"""
    if __name__ == "__main__":
        import contextlib
        x = torch.randn(2048, 2048, device="cuda", dtype=torch.float16); y = torch.randn_like(x)
        add.settings.autotune_precompile = "spawn"
        add.settings.autotuner_fn = lambda k, a, **kw: RandomSearch(k, a, count=16)
        with {"peh.use()" if first == "use" else "contextlib.nullcontext()"}, \\
                inject_fault("hang", every=1):
            print("STARTED", flush=True)
            add.autotune((x, y), force=True)
    """
    )
    proc = subprocess.Popen(
        [sys.executable, _script_file(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "HELION_SKIP_CACHE": "1", "HELION_AUTOTUNE_PRECOMPILE": "spawn"},
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "STARTED" in line:
                break
        time.sleep(30)  # inside the first batch: every config hangs on the GPU
        tree = [proc.pid] + [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert len(tree) > 1, "the batch should be running in workers"
        os.kill(proc.pid, signal.SIGKILL)  # the autotuning process only, not its group
        proc.wait(timeout=60)
        _assert_all_gone(tree[1:])  # within DIES_WITH_ITS_PARENT_S: the guardians kill at once
        deadline = time.monotonic() + 60
        while True:  # no CUDA context of that tree is left on the GPU
            apps = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.split()
            left = sorted(set(tree) & {int(p) for p in apps if p.isdigit()})
            if not left or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert not left, f"GPU contexts left: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
