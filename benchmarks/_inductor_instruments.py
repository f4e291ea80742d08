"""Where max-autotune's time goes in one ``torch.compile`` process: timers and counters for the
benchmark (``inductor_bench``), installed in the measured process itself.

:func:`install` wraps, for the rest of the process, the Inductor and Triton functions through
which max-autotune's template work passes, stock and inside ``precompile_executor.inductor.use()``
alike, and :func:`snapshot` reports what they saw:

* ``AlgorithmSelectorCache.make_precompile_fn`` (submits a template's choices) and the
  precompile function it returns (waits for them): **template precompile wall in the caller**;
  how many Triton choices it **sent to a pool** (``AsyncCompile.triton`` while it submits);
* ``TritonBenchmarkRequest.precompile``: a choice **compiled in the caller** (stock's thread pool
  before its process pool is ready, or a choice the pool path skipped);
* ``AlgorithmSelectorCache.benchmark`` and the scheduler's epilogue-fusion benchmarks:
  **time benchmarking**;
* ``triton.compile`` in the caller, with Triton's compilation listener where it has one: every
  compile the caller runs itself, whether Triton's disk cache had it (a hit costs
  milliseconds; a miss is a full compile), and how many ran while benchmarking;
* ``AsyncCompile.triton``: the kernels sent to a pool in all.

Each wrapper keeps the wrapped function's signature (``functools.wraps``): the seam's
``check_torch()`` reads signatures and code through it and still finds Inductor's.

Also here: :func:`thread_cpu` (CPU seconds per thread of this process), :func:`children_cpu`
(of its live child processes: the compile workers), :func:`ptxas_facts` (which ``ptxas`` the
caller's Triton uses: its version is part of Triton's cache key) and :func:`triton_cache_census`
(entries in a Triton cache directory, and how many are the same kernel compiled under two keys).

Threads: the counters are guarded by one lock; a wrapper runs on whichever thread calls it.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()
_COUNTS: collections.Counter[str] = collections.Counter()
_SECONDS: collections.defaultdict[str, float] = collections.defaultdict(float)
_BY_THREAD: collections.defaultdict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
_LOCAL = threading.local()  # .submitting: inside make_precompile_fn on this thread
_benchmarking = 0  # how many benchmark calls are in progress (any thread)
_installed = False
FULL_COMPILE_S = 0.25
"""A caller's ``triton.compile`` longer than this was (almost surely) a full compile, not a
disk-cache hit (milliseconds), where Triton has no compilation listener to say which."""


def _add(name: str, seconds: float, count: int = 1) -> None:
    with _LOCK:
        _COUNTS[name] += count
        _SECONDS[name] += seconds


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _add(name, time.perf_counter() - start)

    return timed


def _wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace ``owner.name`` (a plain function in its ``__dict__``) by ``make(original)``."""
    raw = getattr(owner, "__dict__", {}).get(name)
    if raw is None or not callable(raw) or isinstance(raw, (staticmethod, classmethod)):
        return False
    setattr(owner, name, make(raw))
    return True


def _make_precompile_fn(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def make_precompile_fn(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        _LOCAL.submitting = True
        try:
            precompile = original(self, *args, **kwargs)
        finally:
            _LOCAL.submitting = False
            _add("precompile.submit", time.perf_counter() - start)

        def timed_wait(fn: Callable[[], Any]) -> Callable[[], Any]:
            def wait() -> Any:
                began = time.perf_counter()
                try:
                    return fn()
                finally:
                    _add("precompile.wait", time.perf_counter() - began)

            return wait

        if callable(getattr(precompile, "fn", None)):
            # torch 2.13: a PrecompileFunction object that Inductor keeps using; time its fn.
            precompile.fn = timed_wait(precompile.fn)
            return precompile
        return (
            functools.wraps(precompile)(timed_wait(precompile))
            if callable(precompile)
            else precompile
        )

    return make_precompile_fn


def _async_triton(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def triton(self: Any, kernel_name: str, source_code: str, device_str: str = "cuda") -> Any:
        start = time.perf_counter()
        try:
            return original(self, kernel_name, source_code, device_str)
        finally:
            seconds = time.perf_counter() - start
            _add("async_compile.triton", seconds)
            if getattr(_LOCAL, "submitting", False):
                _add("precompile.sent_to_pool", seconds)

    return triton


def _benchmark(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def benchmark(*args: Any, **kwargs: Any) -> Any:
        global _benchmarking
        with _LOCK:
            _benchmarking += 1
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            with _LOCK:
                _benchmarking -= 1
            _add("benchmark.choices", time.perf_counter() - start)

    return benchmark


def _triton_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - start
            _add("caller_triton_compile", seconds)
            if _benchmarking:
                _add("caller_triton_compile.while_benchmarking", seconds)
            if seconds > FULL_COMPILE_S:
                _add("caller_triton_compile.over_250ms", seconds)
            with _LOCK:
                entry = _BY_THREAD[threading.current_thread().name]
                entry[0] += 1
                entry[1] += seconds

    return compile


def _listener(**kwargs: Any) -> None:
    """Triton's compilation listener (the caller's compiles only: workers do not have it)."""
    times = kwargs.get("times")
    total_us = 0
    for field in ("ir_initialization", "store_results"):
        total_us += int(getattr(times, field, 0) or 0)
    for _, us in getattr(times, "lowering_stages", None) or ():
        total_us += int(us)
    _add(
        "caller_triton_compile.hit" if kwargs.get("cache_hit") else "caller_triton_compile.miss",
        total_us / 1e6,
    )


def install() -> None:
    """Wrap the functions listed in the module docstring (once per process; idempotent).

    Call it before ``precompile_executor.inductor.use()`` patches Inductor, so that the seam
    finds (and keeps calling) these wrappers.
    """
    global _installed
    if _installed:
        return
    _installed = True
    import torch._inductor.async_compile as async_compile
    import torch._inductor.autotune_process as autotune_process
    import torch._inductor.select_algorithm as select_algorithm

    selector = select_algorithm.AlgorithmSelectorCache
    _wrap(selector, "make_precompile_fn", _make_precompile_fn)
    _wrap(selector, "benchmark", _benchmark)
    _wrap(async_compile.AsyncCompile, "triton", _async_triton)
    _wrap(
        autotune_process.TritonBenchmarkRequest,
        "precompile",
        lambda fn: _timed("precompile.in_caller", fn),
    )
    for module_name, owner_name, name in (
        ("torch._inductor.scheduler", "Scheduler", "speedup_by_fusion"),
        ("torch._inductor.codegen.triton", "TritonScheduling", "benchmark_codegened_module"),
        ("torch._inductor.codegen.triton", "TritonScheduling", "benchmark_fused_nodes"),
    ):
        try:
            module = __import__(module_name, fromlist=[owner_name])
        except ImportError:
            continue
        owner = getattr(module, owner_name, None)
        if owner is not None:
            _wrap(owner, name, functools.partial(_timed, f"{owner_name}.{name}"))
    try:
        import triton
        from triton import knobs
    except ImportError:
        return
    triton.compile = _triton_compile(triton.compile)
    compilation = getattr(knobs, "compilation", None)
    if compilation is not None and hasattr(compilation, "listener"):
        compilation.listener = _listener


def snapshot() -> dict[str, Any]:
    """What the wrappers saw so far: ``{name: {"n": calls, "s": seconds}}`` and per thread."""
    with _LOCK:
        seen = {k: {"n": _COUNTS[k], "s": round(_SECONDS[k], 4)} for k in sorted(_COUNTS)}
        threads = {k: {"n": int(v[0]), "s": round(v[1], 4)} for k, v in _BY_THREAD.items()}
    return {"seen": seen, "caller_triton_compile_by_thread": threads}


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, by thread name."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        native = getattr(thread, "native_id", None)
        try:
            fields = Path(f"/proc/self/task/{native}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the name: state is field 3, utime 14 and stime 15 (proc(5)), so 11 and 12 here.
        out[thread.name] = round((int(fields[11]) + int(fields[12])) / ticks, 3)
    return out


def children_cpu() -> dict[str, Any]:
    """CPU seconds of this process's live descendants (compile workers, Inductor's sidecar)."""
    try:
        import psutil
    except ImportError:
        return {}
    total, count = 0.0, 0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
        count += 1
    return {"processes": count, "cpu_s": round(total, 2)}


def ptxas_facts(arch: int | None = None) -> dict[str, Any]:
    """Which ``ptxas`` this process's Triton uses for ``arch`` (default: the current GPU's), and
    torch's bundled one.

    Triton's cache key holds the ``ptxas`` version (its CUDA backend's ``hash()``); Inductor's
    compile workers point ``TRITON_PTXAS_PATH`` at torch's bundled ``ptxas`` when there is one
    (``_set_triton_ptxas_path``), the caller only when it compiles a kernel itself.
    """
    facts: dict[str, Any] = {"TRITON_PTXAS_PATH": os.environ.get("TRITON_PTXAS_PATH")}
    try:
        import torch

        bundled = Path(torch.__file__).resolve().parent / "bin" / "ptxas"
        facts["torch_bin_ptxas"] = str(bundled) if bundled.exists() else None
        if arch is None:
            if not torch.cuda.is_available():
                return facts
            major, minor = torch.cuda.get_device_capability()
            arch = major * 10 + minor
        from triton.backends.nvidia import compiler

        facts["arch"] = arch
        facts["ptxas_path"] = compiler.get_ptxas(arch).path
        # lru_cache'd per process: after a compile, the version that compile's key used.
        facts["ptxas_version"] = str(compiler.get_ptxas_version(arch)).strip()[-60:]
    except Exception as exc:  # noqa: BLE001 - a fact we could not read is reported as such
        facts["error"] = f"{type(exc).__name__}: {exc}"
    return facts


def worker_env(arch: int | None) -> dict[str, Any]:
    """Run on a compile worker: the ``ptxas`` a Triton compile there uses (no CUDA needed)."""
    if arch is None:
        return {"pid": os.getpid(), "TRITON_PTXAS_PATH": os.environ.get("TRITON_PTXAS_PATH")}
    return ptxas_facts(arch) | {"pid": os.getpid()}


def triton_cache_census(cache_dir: str | None) -> dict[str, Any]:
    """Entries of a Triton cache directory: how many, and how many compiled a kernel that
    another entry holds too (the same metadata under another key: a compile the cache missed).
    """
    if not cache_dir or not os.path.isdir(cache_dir):
        return {}
    binaries = 0
    same: collections.Counter[str] = collections.Counter()
    names: dict[str, str] = {}
    for entry in os.scandir(cache_dir):
        if not entry.is_dir():
            continue
        files = os.listdir(entry.path)
        if not any(f.endswith((".cubin", ".hsaco", ".so", ".spv")) for f in files):
            continue
        binaries += 1
        # Triton IR before any target pass: the same kernel gives the same text whatever the
        # toolchain, so two entries with equal IR are one kernel compiled under two keys.
        ttir = [f for f in files if f.endswith(".ttir")]
        if not ttir:
            continue
        try:
            text = Path(entry.path, ttir[0]).read_bytes()
        except OSError:
            continue
        digest = hashlib.sha256(text).hexdigest()
        same[digest] += 1
        names[digest] = ttir[0].removesuffix(".ttir")
    twice = {names[d]: n for d, n in same.items() if n > 1}
    return {
        "entries_with_binary": binaries,
        "kernels_under_two_or_more_keys": len(twice),
        "extra_entries": sum(n - 1 for n in twice.values()),
        "examples": dict(list(twice.items())[:8]),
    }


def timeline_summary(rows: Any, since: float | None = None) -> dict[str, Any]:
    """Where an executor's compiles waited, from its ``timeline()`` rows (Inductor's tasks).

    * ``first_queued_s``/``first_started_s``/``last_done_s``: from ``since`` (a
      ``time.monotonic()`` reading, e.g. ``use()`` entry), if given;
    * ``in_worker_s``: each task's ``started`` to ``done`` (median, sum);
    * ``queued_to_started_s``: how long tasks waited to start (median, max);
    * ``worker_idle_with_backlog_s``: for consecutive tasks on one worker where the next was
      already queued when the first was done, ``done`` to the next ``sent`` — the caller's
      round trip that hands a worker its next task (median, max, sum);
    * ``done_to_settled_s``: a returned result to its future being set (median, max, sum);
    * ``busy_fraction``: in-worker seconds over workers × (first start to last done).
    """
    import statistics

    tasks = [
        r
        for r in rows
        if r.started is not None and r.done is not None and "worker_env" not in r.function
    ]
    if not tasks:
        return {}

    def stats(values: list[float], *keys: str) -> dict[str, float]:
        out = {
            "median": statistics.median(values) if values else 0.0,
            "max": max(values, default=0.0),
            "sum": sum(values),
        }
        return {k: round(out[k], 4) for k in keys}

    gaps: list[float] = []
    by_worker: dict[int, list[Any]] = collections.defaultdict(list)
    for row in tasks:
        by_worker[row.worker_pid].append(row)
    for runs in by_worker.values():
        runs.sort(key=lambda r: r.started)
        for before, after in itertools.pairwise(runs):
            if after.sent is not None and after.queued is not None and after.queued <= before.done:
                gaps.append(after.sent - before.done)
    in_worker = [r.done - r.started for r in tasks]
    first_start = min(r.started for r in tasks)
    last_done = max(r.done for r in tasks)
    span = max(1e-9, (last_done - first_start) * len(by_worker))
    summary: dict[str, Any] = {
        "tasks": len(tasks),
        "workers": len(by_worker),
        "in_worker_s": stats(in_worker, "median", "sum"),
        "queued_to_started_s": stats(
            [r.started - r.queued for r in tasks if r.queued is not None], "median", "max"
        ),
        "worker_idle_with_backlog_s": stats(gaps, "median", "max", "sum"),
        "done_to_settled_s": stats(
            [r.settled - r.done for r in tasks if r.settled is not None], "median", "max", "sum"
        ),
        "busy_fraction": round(sum(in_worker) / span, 3),
    }
    if since is not None:
        summary |= {
            "first_queued_s": round(min(r.queued or r.started for r in tasks) - since, 3),
            "first_started_s": round(first_start - since, 3),
            "last_done_s": round(last_done - since, 3),
        }
    return summary
