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
    pytest.mark.filterwarnings("ignore:.*TRITON_DEFAULT_FP_FUSION.*:UserWarning"),
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
    executor: PrecompileExecutor, tmp_path: Path
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
    import os, sys, time, random, logging
    sys.path.insert(0, os.getcwd())
    from benchmarks.helion_bench import inject_fault, shim_intel_gpu_error, worker_init
    shim_intel_gpu_error()
    import torch, helion, helion.language as hl
    from helion.autotuner.precompile_future import PrecompileFuture
    from helion.autotuner.random_search import RandomSearch
    from precompile_executor import PrecompileExecutor, stop_idle_workers
    import precompile_executor.helion as peh

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
@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_gpu_autotune_with_ours(mode: str) -> None:
    proc = _run_script(
        _GPU_PRELUDE
        + f"""
    if __name__ == "__main__":
        random.seed(0)
        x = torch.randn(2048, 2048, device="cuda", dtype=torch.float16); y = torch.randn_like(x)
        add.settings.autotune_precompile = "{mode}"
        add.settings.autotuner_fn = lambda k, a, **kw: RandomSearch(k, a, count=8)
        with PrecompileExecutor(8, initializer=worker_init) as ex, peh.use(ex):
            best = add.autotune((x, y), force=True)
        torch.testing.assert_close(add(x, y), x + y)
        print("BEST", best)
    """
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "BEST" in proc.stdout


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
            proc.stdout.close()  # else its ResourceWarning fails the test (H200, session 4)
