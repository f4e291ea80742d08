"""Helion 1.5.1 autotuning, whole process: Helion's native fork mode versus ours, one run.

    python -m benchmarks.helion_bench [--only SCENARIO ...] [--rounds N] [--out FILE] [--quick]

Each run is a fresh interpreter with fresh caches (``HELION_SKIP_CACHE=1``, a new
``TRITON_CACHE_DIR``), timed from its start to its exit (**whole process**: interpreter, imports,
executor start and warm-up included). Rounds are interleaved (every scenario's modes once, then
again); the table gives medians and each mode's ratio to its scenario's baseline.

Scenarios (``--only`` takes their names):

* ``skew``: a row softmax over 8192×4096 fp16, a seeded ``RandomSearch`` of 24 configs whose
  compile times are skewed (full-row tiles of large blocks compile for tens of seconds), with
  ``autotune_compile_timeout`` = ``--compile-timeout`` (15 s) so some time out;
* ``matmul``: matmul 4096³ fp16, seeded ``RandomSearch`` of 32;
* ``lfbo``: the same matmul under Helion's default search (LFBO tree search, effort "quick");
* ``softmax``: the ``skew`` softmax and search under Helion's defaults (compile timeout 60 s,
  ``autotune_adaptive_timeout`` on): one of its 24 configs' compile does not finish within 60 s on
  the H100 and the H200 — the ``timeouts`` table names it (config, how long, cut by whom) —, so
  native waits the full 60 s for it and ours cuts it by Helion's adaptive timeout (docs/helion.md,
  "A hung compile: Helion's adaptive timeout from the first batch");
* ``bmm``: batched matmul 16×1024³ fp16, seeded ``RandomSearch`` of 32.

``--cpu-check`` runs what a machine without a GPU can of the ``softmax`` and ``bmm`` scenarios
(each kernel bound to its real shapes on the compile-only sm_90 driver, a few seeded random configs
generated and precompiled by Helion's provider and by ours through ``use()``, measurements standing
in) and the report over those rows, so that a GPU session does not fail on a slip.

Modes (``--modes`` picks; ``SCENARIO:MODE`` picks one for that scenario only): ``native-fork``
(Helion alone, its default), ``ours-fork`` and ``ours-spawn`` (``with use():``, no argument: in
spawn mode the executor is built and warmed in the background), ``install-spawn`` (``install()`` as
the program's first line, before Helion and torch are imported: the executor is built from the
environment and its template imports Helion beside the program's own imports), ``install-fork``
(``install()`` first in fork mode: Helion's benchmark worker starts beside the program's imports),
``ours-fork-nonice`` (``ours-fork`` with the precompile children at the parent's priority: the A/B
of ``_fork_task.NICENESS``), ``ours-fork-idle`` (the children under ``SCHED_IDLE``:
``_fork_task.IDLE_PRIORITY``), ``ours-fork-lateworker`` (Helion's benchmark subprocess started by
its first measurement, as Helion does: the A/B of ``_bench_worker.STARTS_EARLY``),
``ours-fork-batched`` (each batch's code generated first, then its children forked back to back: the
A/B of ``_provider.FORKS_AFTER_CODEGEN``), ``install-fork-coldcaller`` (``install-fork`` without
warming the autotuning process's Triton before its first fork: the A/B of
``_warm.WARMS_CALLER``), ``hand-spawn`` (the best hand-tuned set-up:
``PrecompileExecutor(16, initializer=import_helion, initargs=(target,), devices=[0])``,
``warm_up()``, then ``use(ex)``).
Spawn modes run with ``HELION_AUTOTUNE_PRECOMPILE=spawn``, as a spawn-mode user sets it.

Per run: whole-process seconds, the autotune, the configs measured in the autotuning process
while Helion's benchmark subprocess started (``measured here``: docs/helion.md, "Measured here
while the benchmark subprocess starts"), the time the autotuner waited for precompiles
(inside ``PrecompileFuture.wait_for_all``, and streamed: for the next one to land), failed
precompiles (and, in the ``--out`` rows, each one's reason, error and config, and every
precompile's compile time as ``[batch, seconds, ok]``: how long a batch's slowest compile held
it, and what another order of submission could give), every config's
final status (Helion's fork child reports a compile ptxas rejects as ok: its config then fails
in the benchmark), the best config and its time. A run that fails or passes ``--timeout`` is
reported as such; the others still run.

On torch builds whose ``torch._inductor.runtime.triton_compat`` lacks ``IntelGPUError`` (torch
2.11), ``import helion`` fails; this module defines it there first. That shim is for measurement
only and is reported in the output when used.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_FORK_MODES = (
    "native-fork",
    "ours-fork",
    "install-fork",
    "install-fork-coldcaller",
    "ours-fork-lateworker",
    "ours-fork-nonice",
    "ours-fork-idle",
    "ours-fork-batched",
)
"""Native fork mode, ours, and ours' fork-mode A/B variants."""
SCENARIOS: dict[str, tuple[str, ...]] = {
    "skew": _FORK_MODES,
    "matmul": (
        "native-fork",
        "ours-fork",
        "install-fork",
        "install-fork-coldcaller",
        "ours-fork-lateworker",
        "ours-fork-idle",
        "ours-fork-batched",
        "ours-spawn",
        "install-spawn",
        "hand-spawn",
    ),
    "lfbo": (*_FORK_MODES, "ours-spawn"),
    "softmax": ("native-fork", "ours-fork", "install-fork"),
    "bmm": ("native-fork", "ours-fork", "install-fork"),
}
"""Each scenario's modes (``--modes`` narrows them); ratios are to native-fork, and ours-spawn's
and install-spawn's also to hand-spawn."""
TARGETS: dict[tuple[str, ...], float] = {
    ("skew", "native-fork"): 0.75,
    ("matmul", "native-fork"): 0.9,
    ("lfbo", "native-fork"): 0.9,
    ("matmul", "hand-spawn"): 1.05,
    ("softmax", "native-fork"): 0.55,
    ("bmm", "native-fork", "ours-fork"): 0.65,
    ("bmm", "native-fork", "install-fork"): 0.6,
}
"""Targets: ours' median whole process / the baseline's, by (scenario, baseline, mode), else by
(scenario, baseline)."""
COUNTS = {"skew": 24, "softmax": 24, "matmul": 32, "bmm": 32}
"""Configs of each scenario's seeded ``RandomSearch`` (``lfbo``: Helion's search decides)."""
BMM_SHAPE = (16, 1024, 1024, 1024)
"""bmm: batch, m, k, n."""
SEED = 0
JOBS = 16
SKEW_COMPILE_TIMEOUT_S = 15
SCENARIO_TIMEOUT_S = 240.0
"""A run that takes longer is killed (its whole process group) and reported as timed out."""


def shim_intel_gpu_error() -> bool:
    """Define ``IntelGPUError`` in ``torch._inductor.runtime.triton_compat`` if it is missing.

    Measurement-only: helion 1.5.1 imports it, torch 2.11 lacks it. Returns True if it defined it.
    """
    from torch._inductor.runtime import triton_compat

    if hasattr(triton_compat, "IntelGPUError"):
        return False

    class IntelGPUError(RuntimeError):
        """Stand-in defined by benchmarks.helion_bench (torch lacks it)."""

    triton_compat.IntelGPUError = IntelGPUError  # type: ignore[attr-defined]
    return True


_PROCESS_STARTED = __import__("psutil").Process().create_time()
if sys.argv[1:2] == ["--child"] and sys.argv[3:4] in (
    ["install-spawn"],
    ["install-fork"],
    ["install-fork-coldcaller"],
):
    # The install-* runs' first line, as a program's: install() before anything imports
    # Helion or torch (docs/helion.md, "Warm-up off the clock"). Run here, at the top of the
    # child's module, ahead of the shim below, which imports torch.
    import precompile_executor.helion

    if sys.argv[3] == "install-fork-coldcaller":  # the A/B of warming the caller's Triton
        from precompile_executor.helion import _warm

        _warm.WARMS_CALLER = False
    precompile_executor.helion.install()
"""When this interpreter started: whole-process figures are the parent's; this splits them into
before the autotune (interpreter, imports, inputs, executor set-up), the autotune, and after."""
SHIMMED = shim_intel_gpu_error()  # at import: spawn children of Helion import this module first


def worker_init(target: str | None = None) -> None:
    """Spawn workers' initializer: the shim, then what every config needs (imports, and with a
    Triton ``target`` one tiny compile: :func:`precompile_executor.helion.import_helion`)."""
    shim_intel_gpu_error()
    from precompile_executor.helion import import_helion

    import_helion(target)


def _triton_target() -> str:
    """This machine's GPU as a Triton target, e.g. ``"cuda:90"``."""
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return f"cuda:{major}{minor}"


def inject_fault(kind: str, *, every: int = 3) -> Any:
    """See :func:`benchmarks._helion_faults.inject_fault`."""
    from benchmarks._helion_faults import inject_fault as inject

    return inject(kind, every=every)


# -- one scenario (child process) ------------------------------------------------------------------


def _matmul() -> Any:
    # Module globals, not locals: Helion refuses a kernel that closes over names.
    global hl, torch
    import helion
    import helion.language as hl
    import torch

    @helion.kernel(static_shapes=True)
    def matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        m, k = x.size()
        _, n = y.size()
        out = torch.empty([m, n], dtype=torch.float16, device=x.device)
        for tile_m, tile_n in hl.tile([m, n]):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.addmm(acc, x[tile_m, tile_k], y[tile_k, tile_n])
            out[tile_m, tile_n] = acc.to(torch.float16)
        return out

    return matmul


def _bmm() -> Any:
    global hl, torch
    import helion
    import helion.language as hl
    import torch

    @helion.kernel(static_shapes=True)
    def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        batch, m, k = a.size()
        _, _, n = b.size()
        out = torch.empty([batch, m, n], dtype=torch.float16, device=a.device)
        for tile_b, tile_m, tile_n in hl.tile([batch, m, n]):
            acc = hl.zeros([tile_b, tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.baddbmm(acc, a[tile_b, tile_m, tile_k], b[tile_b, tile_k, tile_n])
            out[tile_b, tile_m, tile_n] = acc.to(torch.float16)
        return out

    return bmm


def scenario_inputs(scenario: str, quick: bool, device: str) -> tuple[Any, tuple[Any, ...], int]:
    """``(kernel, args, configs)`` of a scenario: the H200's shapes, or ``--quick``'s."""
    import torch

    if scenario in ("skew", "softmax"):
        rows, cols, count = (2048, 1024, 8) if quick else (8192, 4096, COUNTS[scenario])
        x = torch.randn(rows, cols, device=device, dtype=torch.float16)
        return _softmax(), (x,), count
    if scenario == "bmm":
        batch, m, k, n = (4, 256, 256, 256) if quick else BMM_SHAPE
        a = torch.randn(batch, m, k, device=device, dtype=torch.float16)
        b = torch.randn(batch, k, n, device=device, dtype=torch.float16)
        return _bmm(), (a, b), 8 if quick else COUNTS["bmm"]
    size = 1024 if quick else 4096
    x = torch.randn(size, size, device=device, dtype=torch.float16)
    return _matmul(), (x, torch.randn_like(x)), 8 if quick else COUNTS["matmul"]


def _reference(scenario: str, args: tuple[Any, ...]) -> Any:
    import torch

    if scenario in ("skew", "softmax"):
        return torch.softmax(args[0].float(), dim=1).half()
    if scenario == "bmm":
        return torch.bmm(args[0], args[1])
    return args[0] @ args[1]


def _softmax() -> Any:
    global hl, torch
    import helion
    import helion.language as hl
    import torch

    @helion.kernel(static_shapes=True)
    def softmax(x: torch.Tensor) -> torch.Tensor:
        n, _m = x.size()
        out = torch.empty_like(x)
        for tile_n in hl.tile(n):
            values = x[tile_n, :]
            amax = torch.amax(values, dim=1, keepdim=True)
            exp = torch.exp(values - amax)
            out[tile_n, :] = exp / torch.sum(exp, dim=1, keepdim=True)
        return out

    return softmax


_PROVIDER = ("helion.autotuner.benchmark_provider", "LocalBenchmarkProvider")
PHASES = {
    "codegen": ("helion.runtime.kernel", "BoundKernel", "compile_config"),
    "baseline": (*_PROVIDER, "_compute_baseline"),
    "measure": (*_PROVIDER, "_benchmark_function"),
    "rebenchmark": (*_PROVIDER, "benchmark_isolated"),
}
"""Where an autotune's time goes: Helion's serial steps on the autotuning thread, each timed
(Σ seconds, calls) by wrapping the method named here for the run. ``codegen`` is each config's
host code (its ``compile_config``, called again as a cache hit by ``benchmark``), ``measure`` the
accuracy check and timing of one config, ``rebenchmark`` the final re-timing of the best."""
EXTRA = {
    "batches": ("helion.autotuner.base_search", "BaseSearch", "benchmark_batch"),
    "create": (*_PROVIDER, "_create_precompile_future"),
}
"""Timed like :data:`PHASES` but not part of the serial split (they contain its steps):
``batches`` every batch the search benchmarks (so autotune − batches is the search's own work:
choosing configs, LFBO's model), ``create`` the making of each config's precompile future (in
ours, where fork-mode tasks are submitted). The parent's ``os.fork`` calls (any thread: Helion's
fork mode and our fork path both fork the autotuning process per config) are counted as
``forks``."""


@contextlib.contextmanager
def _phase_timers(into: dict[str, list[float]], measures: list[list[Any]] | None = None) -> Any:
    """Time :data:`PHASES` (outermost calls only) while the block runs; restore them after.
    ``measures`` gets one ``[start s (from the block's start), seconds, config key, measured
    ms, where]`` per measurement (``where``: ``"here"`` for ours measuring in the autotuning
    process while Helion's benchmark subprocess started, else ``"helion"``: wherever Helion
    measured it): the same seeded search measures the same configs in every mode, so the
    per-config times and results pair up across modes."""
    import hashlib
    import importlib

    saved = []
    began = time.perf_counter()
    for name, (module, cls_name, attr) in {**PHASES, **EXTRA}.items():
        cls = getattr(importlib.import_module(module), cls_name)
        real = cls.__dict__[attr]
        into[name] = [0.0, 0]
        depth = [0]
        calls = measures if name == "measure" else None

        def timed(*a: Any, _real: Any = real, _acc: list[float] = into[name],
                  _depth: list[int] = depth, _calls: list[list[Any]] | None = calls,
                  **kw: Any) -> Any:  # fmt: skip
            _depth[0] += 1
            t = time.perf_counter()
            # ours sets it around Helion's in-process path (_provider, _while_starting)
            here = bool(a and getattr(a[0], "_measuring_here", False))
            result: Any = None
            try:
                result = _real(*a, **kw)
                return result
            finally:
                _depth[0] -= 1
                if not _depth[0]:
                    took = time.perf_counter() - t
                    _acc[0] += took
                    _acc[1] += 1
                    if _calls is not None and len(a) > 1:  # (provider, config, fn)
                        key = hashlib.sha1(str(a[1]).encode()).hexdigest()[:10]
                        ms = result if isinstance(result, float) else None
                        where = "here" if here else "helion"
                        _calls.append([round(t - began, 3), round(took, 4), key, ms, where])

        setattr(cls, attr, timed)
        saved.append((cls, attr, real))
    real_fork = os.fork
    forks = into["forks"] = [0.0, 0]

    def timed_fork() -> int:
        t = time.perf_counter()
        pid = real_fork()
        if pid:  # the parent's side only: the child's clock stops mattering here
            forks[0] += time.perf_counter() - t
            forks[1] += 1
        return pid

    os.fork = timed_fork
    try:
        yield into
    finally:
        os.fork = real_fork
        for cls, attr, real in saved:
            setattr(cls, attr, real)


def run_scenario(
    scenario: str, mode: str, quick: bool, compile_timeout: float = SKEW_COMPILE_TIMEOUT_S
) -> dict[str, Any]:
    """Autotune once under ``mode``; return the measurements (the parent times the process)."""
    import torch
    from helion.autotuner.benchmark_provider import LocalBenchmarkProvider
    from helion.autotuner.metrics import register_post_autotune_hook
    from helion.autotuner.precompile_future import PrecompileFuture
    from helion.autotuner.random_search import RandomSearch

    from precompile_executor import PrecompileExecutor
    from precompile_executor.helion import state as peh_state
    from precompile_executor.helion import use

    jobs = 4 if quick else JOBS
    random.seed(SEED)
    torch.manual_seed(SEED)
    out: dict[str, Any] = {"scenario": scenario, "mode": mode, "jobs": jobs}
    with contextlib.ExitStack() as stack:
        # The one line goes first, as a user writes it: the executor warms while we set up.
        t_use = time.monotonic()
        if mode.startswith("install-"):
            pass  # installed at the top of this process, before Helion was imported
        elif mode.startswith("ours"):
            if mode == "ours-fork-nonice":  # the A/B of the children's lower priority
                from precompile_executor.helion import _fork_task

                _fork_task.NICENESS = 0
            if mode == "ours-fork-lateworker":  # the A/B of Helion's benchmark worker's start
                from precompile_executor.helion import _bench_worker

                _bench_worker.STARTS_EARLY = False
            if mode == "ours-fork-idle":  # the A/B of children under SCHED_IDLE
                from precompile_executor.helion import _fork_task

                _fork_task.IDLE_PRIORITY = True
            if mode == "ours-fork-batched":  # the A/B of forking a batch's children back to back
                from precompile_executor.helion import _provider

                _provider.FORKS_AFTER_CODEGEN = True
            stack.enter_context(use())
        elif mode == "hand-spawn":
            ex = stack.enter_context(
                PrecompileExecutor(
                    jobs, initializer=worker_init, initargs=(_triton_target(),), devices=[0]
                )
            )
            t0 = time.perf_counter()
            ex.warm_up(timeout=300)
            out["warm_up_s"] = time.perf_counter() - t0
            out["start"] = ex.statistics().start
            stack.enter_context(use(ex))
        kernel, args, count = scenario_inputs(scenario, quick, "cuda")
        settings = kernel.settings
        settings.autotune_precompile = mode.split("-")[1]
        settings.autotune_precompile_jobs = jobs
        settings.autotune_random_seed = SEED
        settings.autotune_progress_bar = False
        if scenario == "skew":
            settings.autotune_compile_timeout = int(compile_timeout)
        # softmax: Helion's default compile timeout (60 s) and adaptive timeout (on)
        if scenario == "lfbo":
            settings.autotune_effort = "quick"
            settings.autotune_initial_population_strategy = "from_random"
        else:
            settings.autotuner_fn = lambda bound, a, **kw: RandomSearch(bound, a, count=count)
        metrics: list[Any] = []
        register_post_autotune_hook(metrics.append)
        # Streamed (ours), the autotuner waits for precompiles in the stream, not in
        # wait_for_all: count both.
        from precompile_executor.helion import _future

        streamed: list[float] = []
        real_close = _future.Stream.close

        def timed_close(self: Any) -> None:
            if not getattr(self, "_counted", False):
                self._counted = True
                streamed.append(self.waited_s)
            real_close(self)

        waits: list[float] = []
        failures: list[int] = []
        failed: list[dict[str, Any]] = []
        compiles: list[list[Any]] = []
        real_wait = PrecompileFuture.__dict__["wait_for_all"].__func__

        def timed_wait(futures: list[Any], desc: str | None = None) -> list[bool]:
            t, before = time.perf_counter(), len(streamed)
            try:
                ok = real_wait(futures, desc)
            finally:
                waits.append(time.perf_counter() - t)
                del streamed[before:]  # a batch not streamed: already counted here
            failures.append(ok.count(False))
            for f, good in zip(futures, ok, strict=True):
                if not good and len(failed) < 60:
                    failed.append(_failure(f))
                if f.process is not None:  # ran in a process: its compile time, by batch
                    batch = phases.get("batches", [0.0, 0])[1]  # batches finished so far
                    compiles.append([int(batch), round(f.elapsed, 3), bool(good)])
            return ok

        # Each config's final status (Helion 1.5.1's fork child reports a failed compile as ok:
        # the parent compiles it again and the benchmark records the error).
        statuses: collections.Counter[str] = collections.Counter()
        real_benchmark = LocalBenchmarkProvider.__dict__["benchmark"]
        depth = [0]

        def counted(self: Any, configs: Any, **kw: Any) -> Any:
            depth[0] += 1
            try:
                results = real_benchmark(self, configs, **kw)
            finally:
                depth[0] -= 1
            if not depth[0]:
                statuses.update(str(r.status) for r in results)
            return results

        # Helion's benchmark worker as ours starts it (when, and its warm-up).
        from precompile_executor.helion import _bench_worker

        early: list[tuple[str, Any]] = []
        real_start_early, real_take = _bench_worker.start_early, _bench_worker.take

        def kept_start_early(*a: Any, **kw: Any) -> Any:
            started = real_start_early(*a, **kw)
            early.append(("provider", started))
            return started

        def kept_take(*a: Any, **kw: Any) -> Any:
            taken = real_take(*a, **kw)
            early.append(("spare", taken))  # started by install()/use(), before the autotune
            return taken

        _bench_worker.start_early = kept_start_early
        _bench_worker.take = kept_take
        LocalBenchmarkProvider.benchmark = counted  # type: ignore[method-assign]
        PrecompileFuture.wait_for_all = staticmethod(timed_wait)  # type: ignore[method-assign]
        _future.Stream.close = timed_close  # type: ignore[method-assign]
        phases: dict[str, list[float]] = {}
        measures: list[list[Any]] = []
        out["before_autotune_s"] = time.time() - _PROCESS_STARTED
        t0 = time.perf_counter()
        try:
            with _phase_timers(phases, measures):
                best = kernel.autotune(args, force=True)
        finally:
            PrecompileFuture.wait_for_all = staticmethod(real_wait)  # type: ignore[method-assign]
            _future.Stream.close = real_close  # type: ignore[method-assign]
            LocalBenchmarkProvider.benchmark = real_benchmark  # type: ignore[method-assign]
            _bench_worker.start_early, _bench_worker.take = real_start_early, real_take
        out["autotune_s"] = time.perf_counter() - t0
        out["bench_workers"] = [
            {
                "how": how,
                "warm_s": None if e.ended is None else round(e.ended - e.started, 3),
                "started_s": round(e.started - t0, 3),
                "error": None if e.error is None else repr(e.error)[:200],
            }
            for how, e in early
            if e is not None
        ]
        # configs measured in this process while Helion's benchmark subprocess started (ours:
        # docs/helion.md, "Measured here while the benchmark subprocess starts"; native: none)
        out["measured_here"] = peh_state.statistics().measured_while_starting
        out["phases"] = {k: [round(v[0], 3), v[1]] for k, v in phases.items()}
        out["measures"] = measures
        if mode in ("ours-spawn", "install-spawn"):  # the background warm-up, from use() or
            # from install() at the top, against the autotune
            from precompile_executor.helion import _warm

            times = _warm.warm_up_times()
            if "ended" in times:
                out["warm_up_s"] = times["ended"] - times["started"]
                out["warm_up_ended_after_use_s"] = times["ended"] - t_use
            out["autotune_started_after_use_s"] = time.monotonic() - t_use - out["autotune_s"]
    out.update(precompile_wait_s=sum(waits) + sum(streamed), failures=sum(failures))
    out["failed"] = failed
    out["compiles"] = compiles
    out["statuses"] = dict(statuses)
    out["streamed_batches"] = len(streamed)
    out["best_config"] = str(best)
    if metrics:
        m = metrics[-1]
        out.update(best_ms=m.best_perf_ms, configs_tested=m.num_configs_tested)
    torch.testing.assert_close(kernel(*args), _reference(scenario, args), rtol=2e-2, atol=2e-1)
    return out


def _failure(future: Any) -> dict[str, Any]:
    """What one failed precompile was (ours: ``error``; Helion's: ``remote_error``)."""
    error = getattr(future, "error", None) or getattr(future, "remote_error", None)
    kind = getattr(error, "exc_type", None) or (type(error).__name__ if error else None)
    text = str(getattr(error, "exc_args", None) or error or "")
    cut = getattr(future, "cut", None)  # ours: cut by Helion's adaptive timeout
    return {
        "reason": future.failure_reason,
        "cut": None if cut is None else cut.describe(),
        "elapsed_s": round(future.elapsed, 2) if future.process is not None else None,
        "error": kind,
        "message": " ".join(text.split())[:240],
        "config": str(future.config)[:400],
    }


# -- without a GPU: what can be checked before the GPU session -------------------------------------

CPU_CHECK_SCENARIOS = ("softmax", "bmm")


def cpu_check_row(scenario: str, mode: str, quick: bool, configs: int) -> dict[str, Any]:
    """One scenario's kernel on the compile-only sm_90 driver: bound to its shapes, its seeded
    search's worth of random configs generated (host code for each), ``configs`` of them
    precompiled by Helion's provider (``native-fork``) or ours through ``use()``
    (``ours-fork``), each measurement standing in (1 ms). A row shaped like a GPU run's."""
    import helion
    from helion.autotuner.benchmark_provider import LocalBenchmarkProvider
    from helion.autotuner.config_generation import ConfigGeneration

    import precompile_executor.helion as peh
    from benchmarks._helion_cpu import on_the_cpu
    from precompile_executor import PrecompileExecutor
    from precompile_executor.helion._provider import StreamingBenchmarkProvider
    from precompile_executor.triton import compile_only_driver, parse_target

    t0 = time.perf_counter()
    random.seed(SEED)
    kernel, args, count = scenario_inputs(scenario, quick, "cpu")
    old_cache = os.environ.get("TRITON_CACHE_DIR")
    with (
        tempfile.TemporaryDirectory(prefix="helion-bench-cpu-") as cache,
        compile_only_driver(parse_target("cuda:90")),
        contextlib.ExitStack() as stack,
    ):
        os.environ["TRITON_CACHE_DIR"] = cache
        try:
            bound = kernel.bind(args)
            generation = ConfigGeneration(bound.config_spec)
            drawn: list[Any] = []
            while len(drawn) < count:  # persistent pid types need a device's SM count
                config = generation.unflatten(generation.random_flat())
                if config.config.get("pid_type", "flat") == "flat":
                    drawn.append(config)
            for config in drawn:
                bound.compile_config(config)  # every drawn config's host code
            settings = helion.Settings(
                autotune_precompile="fork",
                autotune_progress_bar=False,
                autotune_precompile_jobs=2,
                autotune_compile_timeout=120,
            )
            if mode == "ours-fork":
                stack.enter_context(peh.use(stack.enter_context(PrecompileExecutor(2))))
            base = StreamingBenchmarkProvider if mode == "ours-fork" else LocalBenchmarkProvider
            provider = on_the_cpu(base, bound, args, settings, lambda config: 1.0)
            provider.setup()
            try:
                results = provider.benchmark(drawn[:configs])
            finally:
                provider.cleanup()
        finally:
            if old_cache is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = old_cache
    wall = time.perf_counter() - t0
    statuses = collections.Counter(str(r.status) for r in results)
    return {
        "scenario": scenario,
        "mode": mode,
        "round": 1,
        "process_s": wall,
        "autotune_s": wall,
        "drawn": count,
        "statuses": dict(statuses),
        "failures": sum(r.status != "ok" for r in results),
        "best_config": str(drawn[0]),
        "best_ms": 1.0,
        "measured_here": peh.state.statistics().measured_while_starting,
    }


def cpu_check(scenarios: list[str], quick: bool, configs: int) -> list[dict[str, Any]]:
    """:func:`cpu_check_row` for each scenario, native then ours."""
    return [
        cpu_check_row(scenario, mode, quick, configs)
        for scenario in scenarios
        for mode in ("native-fork", "ours-fork")
    ]


# -- the run (parent process) ----------------------------------------------------------------------


def _child(
    scenario: str,
    mode: str,
    quick: bool,
    timeout_s: float,
    tmp: Path,
    tag: str,
    compile_timeout: float,
) -> dict[str, Any]:
    result = tmp / f"{scenario}-{mode}-{tag}.json"
    cache = tmp / f"triton-{scenario}-{mode}-{tag}"
    env = {**os.environ, "HELION_SKIP_CACHE": "1", "TRITON_CACHE_DIR": str(cache)}
    if mode.endswith("spawn"):
        env["HELION_AUTOTUNE_PRECOMPILE"] = "spawn"  # what a spawn-mode user sets
    cmd = [sys.executable, "-m", "benchmarks.helion_bench", "--child", scenario, mode]
    cmd += ["--json", str(result), "--compile-timeout", str(compile_timeout)]
    cmd += ["--quick"] if quick else []
    base = {"scenario": scenario, "mode": mode}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        log, _ = proc.communicate()
        return {**base, "error": f"timed out after {timeout_s:.0f}s", "log": log[-4000:]}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)  # anything it left behind
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not result.exists():
        return {**base, "error": f"exit {proc.returncode}", "log": log[-4000:]}
    data: dict[str, Any] = json.loads(result.read_text())
    data["process_s"] = wall
    return data


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r and r[key] is not None]
    return statistics.median(values) if values else None


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def _warm_cell(ok: list[dict[str, Any]]) -> str:
    """The executor's warm-up: on the clock (hand-spawn), or in the background (ours-spawn:
    when it ended and when the autotune started, seconds after ``use()``)."""
    warm = _median(ok, "warm_up_s")
    ended = _median(ok, "warm_up_ended_after_use_s")
    autotune = _median(ok, "autotune_started_after_use_s")
    if ended is None:
        return _fmt(warm, ".1f")
    return f"{_fmt(warm, '.1f')} (ready +{ended:.1f} s, autotune from +{_fmt(autotune, '.1f')} s)"


def _measured_here_cell(ok: list[dict[str, Any]]) -> str:
    """Configs measured in the autotuning process while Helion's benchmark subprocess started
    (median, and the range over the runs), then the subprocess's warm-up seconds (median)."""
    counts = [r["measured_here"] for r in ok if r.get("measured_here") is not None]
    if not counts:
        return "—"
    low, high = min(counts), max(counts)
    cell = f"{statistics.median(counts):.0f}" + (f" ({low}–{high})" if low != high else "")
    warm = [
        w["warm_s"]
        for r in ok
        for w in r.get("bench_workers", ())
        if w.get("warm_s") is not None and w.get("how") == "provider"
    ]
    return cell + (f", subprocess warm after {statistics.median(warm):.1f} s" if warm else "")


def report(rows: list[dict[str, Any]], stamp: dict[str, str]) -> str:
    """The markdown table of medians, with machine, versions and date."""
    lines = [
        "| scenario | mode | runs | whole process s (median) | vs native-fork | vs hand-spawn | "
        "autotune s | precompile wait s | warm-up s | measured here | failures | best ms | "
        "best ms vs native-fork | best configs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ok_rows(scenario: str, mode: str) -> list[dict[str, Any]]:
        return [
            r for r in rows if (r["scenario"], r["mode"]) == (scenario, mode) and "error" not in r
        ]

    def ratio(value: float | None, scenario: str, base: str, key: str, mode: str) -> str:
        ref = _median(ok_rows(scenario, base), key)
        if mode == base or value is None or not ref:
            return "—"
        target = None
        if key == "process_s" and mode != base:
            target = TARGETS.get((scenario, base, mode), TARGETS.get((scenario, base)))
        return f"{value / ref:.3f}" + (f" (target ≤ {target})" if target else "")

    for scenario, modes in SCENARIOS.items():
        for mode in modes:
            mine = [r for r in rows if (r["scenario"], r["mode"]) == (scenario, mode)]
            if not mine:
                continue
            ok = ok_rows(scenario, mode)
            errors = [r["error"] for r in mine if "error" in r]
            whole, best = _median(ok, "process_s"), _median(ok, "best_ms")
            configs = sorted({r["best_config"] for r in ok})
            runs = f"{len(ok)}" + (f" (+{len(errors)} failed: {errors})" if errors else "")
            hand = ratio(whole, scenario, "hand-spawn", "process_s", mode)
            lines.append(
                f"| {scenario} | {mode} | {runs} | {_fmt(whole, '.1f')} | "
                f"{ratio(whole, scenario, 'native-fork', 'process_s', mode)} | "
                f"{hand if mode in ('ours-spawn', 'install-spawn') else '—'} | "
                f"{_fmt(_median(ok, 'autotune_s'), '.1f')} | "
                f"{_fmt(_median(ok, 'precompile_wait_s'), '.1f')} | {_warm_cell(ok)} | "
                f"{_measured_here_cell(ok)} | "
                f"{_fmt(_median(ok, 'failures'), '.0f')} | {_fmt(best, '.4f')} | "
                f"{ratio(best, scenario, 'native-fork', 'best_ms', mode)} | "
                f"{'; '.join(f'`{c}`' for c in configs)} |"
            )
    head = [f"- {k}: {v}" for k, v in stamp.items()]
    return "\n".join(
        head
        + ["", *lines, "", *phase_table(rows), "", *measure_pairs(rows), ""]
        + [*measured_where(rows), "", *timeouts(rows), ""]
    )


def timeouts(rows: list[dict[str, Any]]) -> list[str]:
    """The configs whose precompile timed out, by scenario and mode: in how many runs, how long
    it ran (median), and who ended it (Helion's compile timeout, or ours by Helion's adaptive
    rule, with the threshold's derivation). The ``softmax`` scenario's hung config is found here."""
    found: dict[tuple[str, str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        for f in r.get("failed", ()):
            if f.get("reason") == "timeout":
                found[(r["scenario"], r["mode"], f.get("config", "?"))].append(f)
    if not found:
        return []
    lines = [
        "| scenario | mode | runs | ran s (median) | ended by | config |",
        "|---|---|---|---|---|---|",
    ]
    for (scenario, mode, config), fs in sorted(found.items()):
        ran = _median(fs, "elapsed_s")
        cuts = sorted({f["cut"] for f in fs if f.get("cut")})
        by = "adaptive timeout: " + "; ".join(cuts) if cuts else "compile timeout"
        lines.append(
            f"| {scenario} | {mode} | {len(fs)} | {_fmt(ran, '.1f')} | {by} | `{config}` |"
        )
    return lines


def measure_pairs(rows: list[dict[str, Any]]) -> list[str]:
    """Each config's measurement against native fork's of the same config (a seeded search
    measures the same configs in every mode): the median of the per-config ratios, and how many
    configs pair up. What is left of "measure" once the search path is the same."""
    lines = [
        "| scenario | mode | configs paired | "
        "measure per config vs native-fork (median, p25–p75) |",
        "|---|---|---|---|",
    ]

    def per_config(scenario: str, mode: str) -> dict[str, float]:
        times: dict[str, list[float]] = collections.defaultdict(list)
        for r in rows:
            if (r["scenario"], r["mode"]) == (scenario, mode):
                for measure in r.get("measures", ()):
                    took, key = measure[1], measure[2]
                    times[key].append(took)
        return {k: statistics.median(v) for k, v in times.items()}

    for scenario, modes in SCENARIOS.items():
        base = per_config(scenario, "native-fork")
        if not base:
            continue
        for mode in modes:
            mine = per_config(scenario, mode) if mode != "native-fork" else {}
            ratios = sorted(mine[k] / base[k] for k in mine.keys() & base.keys() if base[k] > 0)
            if len(ratios) < 2:
                continue
            q1, _q2, q3 = statistics.quantiles(ratios, n=4)
            lines.append(
                f"| {scenario} | {mode} | {len(ratios)} | "
                f"{statistics.median(ratios):.3f} ({q1:.3f}–{q3:.3f}) |"
            )
    return lines if len(lines) > 2 else []


def measured_where(rows: list[dict[str, Any]]) -> list[str]:
    """Each config's measured latency against native fork's of the same config, split by where
    ours measured it: in the autotuning process while Helion's benchmark subprocess started
    (``here``) or in the subprocess (``helion``). Helion's two paths time alike (docs/helion.md,
    "Measured here while the benchmark subprocess starts"); this is the check on a GPU."""
    lines = [
        "| scenario | mode | measured | configs paired | "
        "latency vs native-fork's for the same config (median, min–max) |",
        "|---|---|---|---|---|",
    ]

    def latencies(scenario: str, mode: str, where: str | None) -> dict[str, float]:
        found: dict[str, list[float]] = collections.defaultdict(list)
        for r in rows:
            if (r["scenario"], r["mode"]) != (scenario, mode):
                continue
            for measure in r.get("measures", ()):
                if len(measure) < 5 or measure[3] is None or not math.isfinite(measure[3]):
                    continue
                if where is None or measure[4] == where:
                    found[measure[2]].append(measure[3])
        return {k: statistics.median(v) for k, v in found.items()}

    for scenario, modes in SCENARIOS.items():
        base = latencies(scenario, "native-fork", None)
        if not base:
            continue
        for mode in modes:
            if mode == "native-fork":
                continue
            for where in ("here", "helion"):
                mine = latencies(scenario, mode, where)
                ratios = sorted(mine[k] / base[k] for k in mine.keys() & base.keys() if base[k])
                if not ratios:
                    continue
                lines.append(
                    f"| {scenario} | {mode} | {where} | {len(ratios)} | "
                    f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}–{ratios[-1]:.3f}) |"
                )
    return lines if len(lines) > 2 else []


def phase_table(rows: list[dict[str, Any]]) -> list[str]:
    """Where the whole process goes (medians, s): before the autotune, Helion's serial steps
    (:data:`PHASES`, Σ s / calls), the precompile wait, the rest of the autotune, after it."""
    lines = [
        "| scenario | mode | before autotune | " + " | ".join(PHASES) + " | precompile wait | "
        "rest of autotune | after autotune | search outside batches | create | forks | "
        "first measurement: at / takes |",
        "|---|---|---|" + "---|" * (len(PHASES) + 7),
    ]
    for scenario, modes in SCENARIOS.items():
        for mode in modes:
            ok = [
                r for r in rows
                if (r["scenario"], r["mode"]) == (scenario, mode) and "phases" in r
            ]  # fmt: skip
            if not ok:
                continue
            cells = [_fmt(_median(ok, "before_autotune_s"), ".1f")]
            spent = []
            for name in PHASES:
                sums = [r["phases"][name][0] for r in ok]
                calls = [r["phases"][name][1] for r in ok]
                spent.append(statistics.median(sums))
                cells.append(f"{statistics.median(sums):.1f} / {statistics.median(calls):.0f}")
            wait = _median(ok, "precompile_wait_s") or 0.0
            autotune = _median(ok, "autotune_s") or 0.0
            cells.append(f"{wait:.1f}")
            cells.append(f"{autotune - sum(spent) - wait:.1f}")
            after = [r["process_s"] - r["before_autotune_s"] - r["autotune_s"] for r in ok]
            cells.append(f"{statistics.median(after):.1f}")
            extra = [r for r in ok if "batches" in r["phases"]]  # rows of older runs lack them
            if extra:
                outside = [r["autotune_s"] - r["phases"]["batches"][0] for r in extra]
                cells.append(f"{statistics.median(outside):.1f}")
                for name in ("create", "forks"):
                    sums = [r["phases"][name][0] for r in extra]
                    calls = [r["phases"][name][1] for r in extra]
                    cells.append(f"{statistics.median(sums):.1f} / {statistics.median(calls):.0f}")
            else:
                cells += ["—"] * 3
            # The first measurement waits for Helion's benchmark subprocess unless it is warm
            # (docs/helion.md, "Helion's benchmark subprocess, started before the autotune").
            first = [r["measures"][0] for r in ok if r.get("measures")]
            if first:
                at = statistics.median(m[0] for m in first)
                takes = statistics.median(m[1] for m in first)
                cells.append(f"{at:.1f} / {takes:.1f}")
            else:
                cells.append("—")
            lines.append(f"| {scenario} | {mode} | " + " | ".join(cells) + " |")
    return lines if len(lines) > 2 else []


def _mode_choice(text: str) -> str:
    """``--modes`` entry: a mode (every scenario that has it) or ``SCENARIO:MODE``."""
    every = sorted({m for ms in SCENARIOS.values() for m in ms})
    scenario, _, mode = text.rpartition(":")
    known = SCENARIOS.get(scenario) if scenario else every
    if known is None or mode not in known:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not a mode of {scenario or 'any scenario'}; modes: {', '.join(every)}"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    """Entry point: the whole run, or one scenario with ``--child``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 8 configs, 4 jobs")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--timeout", type=float, default=SCENARIO_TIMEOUT_S, help="per run, s")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--only", nargs="*", choices=sorted(SCENARIOS), help="scenarios to run (default: all)"
    )
    parser.add_argument(
        "--modes",
        nargs="*",
        type=_mode_choice,
        help="modes to run, in this order (default: all); SCENARIO:MODE: for one scenario only",
    )
    parser.add_argument(
        "--compile-timeout",
        type=float,
        default=SKEW_COMPILE_TIMEOUT_S,
        help="skew: Helion's autotune_compile_timeout, s",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        help="start no scenario's round (nor run) that its modes' longest runs so far say would "
        "end past this many seconds; report then",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="write no run: the table of the rows of earlier runs' --out .json files, together",
    )
    parser.add_argument(
        "--cpu-check",
        nargs="?",
        const=2,
        type=int,
        metavar="CONFIGS",
        help="no GPU: check the softmax and bmm scenarios on the compile-only sm_90 driver "
        "(CONFIGS precompiled each, default 2; --only narrows) and print the report",
    )
    parser.add_argument("--child", nargs=2, metavar=("SCENARIO", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        data = run_scenario(*args.child, args.quick, args.compile_timeout)
        assert args.json is not None
        args.json.write_text(json.dumps(data))
        print(json.dumps(data))
        return 0

    from benchmarks._common import stamp, usable_cores, version

    if args.cpu_check is not None:
        chosen = [s for s in args.only or CPU_CHECK_SCENARIOS]
        rows = cpu_check(chosen, args.quick, args.cpu_check)
        text = report(rows, {"cpu check": "compile-only sm_90 driver, measurements stand in"})
        print(text)
        bad = [r for r in rows if r["statuses"].get("ok", 0) == 0]
        return 1 if bad else 0

    if args.merge:
        merged = [row for path in args.merge for row in json.loads(path.read_text())]
        text = report(merged, {"merged from": ", ".join(map(str, args.merge))})
        print(text)
        if args.out:
            args.out.write_text(text)
        return 0

    command = "python -m benchmarks.helion_bench" + " --quick" * args.quick
    command += f" --rounds {args.rounds}" + (f" --only {' '.join(args.only)}" if args.only else "")
    command += f" --modes {' '.join(args.modes)}" if args.modes else ""
    info = stamp(usable_cores(), command)
    info["helion"] = version("helion")
    info["IntelGPUError shim"] = (
        "defined by this benchmark (measurement only: torch lacks it)" if SHIMMED else "not needed"
    )
    with contextlib.suppress(Exception):
        import torch

        info["gpu"] = torch.cuda.get_device_name(0)
    named = {m: i for i, m in enumerate(args.modes or [])}

    def position(scenario: str, mode: str) -> int | None:
        """Where ``--modes`` names this mode (a round runs them in that order); ``None``: not
        chosen. Without ``--modes`` every mode runs, in ``SCENARIOS``' order."""
        if not named:
            return 0
        return named.get(f"{scenario}:{mode}", named.get(mode))

    plan = {
        scenario: sorted(
            ((scenario, m) for m in SCENARIOS[scenario] if position(scenario, m) is not None),
            key=lambda pair: position(*pair) or 0,
        )
        for scenario in args.only or list(SCENARIOS)
    }
    rows = []
    start = time.perf_counter()
    took: dict[tuple[str, str], float] = {}  # (scenario, mode): its longest run so far

    def expected(pairs: list[tuple[str, str]]) -> float:
        longest = max(took.values(), default=0.0)
        return sum(took.get(pair, longest) for pair in pairs)

    with tempfile.TemporaryDirectory(prefix="helion-bench-") as tmp:
        for round_ in range(args.rounds):
            for scenario, group in plan.items():
                # A round of a scenario runs whole or not at all where the deadline is known to
                # cut it: an unpaired run costs device time and gives no ratio.
                if args.deadline is not None:
                    if time.perf_counter() - start + expected(group) > args.deadline:
                        print(f"== deadline: not starting round {round_ + 1} {scenario}")
                        continue
                for pair in group:
                    elapsed = time.perf_counter() - start
                    if args.deadline is not None and elapsed + expected([pair]) > args.deadline:
                        print(f"== deadline: not starting round {round_ + 1} {' '.join(pair)}")
                        continue
                    print(f"== round {round_ + 1} {' '.join(pair)}", flush=True)
                    t0 = time.perf_counter()
                    row = _child(
                        *pair,
                        args.quick,
                        args.timeout,
                        Path(tmp),
                        str(round_),
                        args.compile_timeout,
                    )
                    took[pair] = max(took.get(pair, 0.0), time.perf_counter() - t0)
                    row["round"] = round_ + 1
                    print(json.dumps({k: v for k, v in row.items() if k != "log"}), flush=True)
                    if "error" in row:
                        print(row.get("log", ""), flush=True)
                    rows.append(row)
    text = report(rows, info)
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
