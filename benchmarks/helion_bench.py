"""Helion 1.5.1 autotuning: its own precompile modes versus ours, one run, same seeded configs.

    python -m benchmarks.helion_bench [--quick] [--out FILE] [--timeout S]

Scenarios, each in a fresh interpreter with fresh caches (``HELION_SKIP_CACHE=1``, a new
``TRITON_CACHE_DIR``):

* a seeded ``RandomSearch`` of 32 configs of a matmul 4096³ fp16, 16 precompile jobs, under
  Helion's native fork, native spawn, ours-fork and ours-spawn;
* Helion's default search (LFBO tree search, effort "quick", seeded) under native fork, native
  spawn and ours-spawn.

Per scenario: the whole autotune, the time inside ``PrecompileFuture.wait_for_all`` (summed over
batches), configs that failed precompile, the best config and its time, and (ours) the executor's
warm-up, which happens once per process, before the autotune, and is reported apart. A scenario
that fails or passes ``--timeout`` is reported as such; the others still run.

On torch builds whose ``torch._inductor.runtime.triton_compat`` lacks ``IntelGPUError`` (torch
2.11), ``import helion`` fails; this module defines it there first. That shim is for measurement
only and is reported in the output when used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("native-fork", "native-spawn", "ours-fork", "ours-spawn")
SCENARIOS = [(m, "random") for m in MODES] + [
    ("native-fork", "lfbo"),
    ("native-spawn", "lfbo"),
    ("ours-spawn", "lfbo"),
]
SEED = 0
JOBS = 16
SCENARIO_TIMEOUT_S = 1800.0
"""A scenario that runs longer is killed (its whole process group) and reported as timed out."""


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


def run_scenario(mode: str, search: str, quick: bool) -> dict[str, Any]:
    """Autotune the matmul once under ``mode`` with ``search``; return the measurements."""
    import torch
    from helion.autotuner.metrics import register_post_autotune_hook
    from helion.autotuner.precompile_future import PrecompileFuture
    from helion.autotuner.random_search import RandomSearch

    from precompile_executor import PrecompileExecutor
    from precompile_executor.helion import use

    size, count, jobs = (1024, 8, 4) if quick else (4096, 32, JOBS)
    random.seed(SEED)
    torch.manual_seed(SEED)
    x = torch.randn(size, size, device="cuda", dtype=torch.float16)
    y = torch.randn(size, size, device="cuda", dtype=torch.float16)
    kernel = _matmul()
    settings = kernel.settings
    settings.autotune_precompile = mode.split("-")[1]
    settings.autotune_precompile_jobs = jobs
    settings.autotune_random_seed = SEED
    settings.autotune_progress_bar = False
    if search == "random":
        settings.autotuner_fn = lambda bound, args, **kw: RandomSearch(bound, args, count=count)
    else:
        settings.autotune_effort = "quick"
        settings.autotune_initial_population_strategy = "from_random"
    metrics: list[Any] = []
    register_post_autotune_hook(metrics.append)
    out: dict[str, Any] = {"mode": mode, "search": search, "size": size, "jobs": jobs}
    with contextlib.ExitStack() as stack:
        if mode.startswith("ours"):
            # Spawn workers pinned to the GPU: each creates its CUDA context as it starts.
            ex = stack.enter_context(
                PrecompileExecutor(
                    jobs,
                    initializer=worker_init,
                    initargs=(_triton_target(),),
                    devices=[0] if mode == "ours-spawn" else None,
                )
            )
            if mode == "ours-spawn":  # the fork path needs no spawn workers
                t0 = time.perf_counter()
                ex.warm_up(timeout=300)
                out["warm_up_s"] = time.perf_counter() - t0
                out["start"] = ex.statistics().start
                out["start_note"] = ex.statistics().start_note
            stack.enter_context(use(ex))
        waits: list[float] = []
        failures: list[int] = []
        parts = dict.fromkeys(("tasks", "in_worker_s", "load_s", "run_s", "arg_loads"), 0.0)
        real_wait = PrecompileFuture.__dict__["wait_for_all"].__func__

        def timed_wait(futures: list[Any], desc: str | None = None) -> list[bool]:
            t = time.perf_counter()
            try:
                ok = real_wait(futures, desc)
            finally:
                waits.append(time.perf_counter() - t)
            failures.append(ok.count(False))
            for f in futures:  # ours-spawn: where each config's time in its worker went
                fut = getattr(f, "future", None)
                if fut is None or fut.cancelled() or fut.exception() is not None:
                    continue
                r = fut.result()
                parts["tasks"] += 1
                parts["in_worker_s"] += r.elapsed_s
                run = getattr(r, "value", None)
                if run is not None and hasattr(run, "load_s"):
                    parts["load_s"] += run.load_s
                    parts["run_s"] += run.launch_s
                    parts["arg_loads"] += int(run.args_loaded)
            return ok

        PrecompileFuture.wait_for_all = staticmethod(timed_wait)  # type: ignore[method-assign]
        t0 = time.perf_counter()
        try:
            best = kernel.autotune((x, y), force=True)
        finally:
            PrecompileFuture.wait_for_all = staticmethod(real_wait)  # type: ignore[method-assign]
        out["autotune_s"] = time.perf_counter() - t0
    out.update(precompile_wait_s=sum(waits), batches=len(waits), failures=sum(failures))
    if parts["tasks"]:
        out["in_worker"] = {k: round(v, 3) for k, v in parts.items()}
    out["best_config"] = str(best)
    if metrics:
        m = metrics[-1]
        out.update(best_ms=m.best_perf_ms, configs_tested=m.num_configs_tested)
    ref = x @ y
    torch.testing.assert_close(kernel(x, y), ref, rtol=2e-2, atol=2e-1)
    return out


# -- the run (parent process) ----------------------------------------------------------------------


def _child(mode: str, search: str, quick: bool, timeout_s: float, tmp: Path) -> dict[str, Any]:
    result = tmp / f"{mode}-{search}.json"
    cache = tmp / f"triton-{mode}-{search}"
    env = {**os.environ, "HELION_SKIP_CACHE": "1", "TRITON_CACHE_DIR": str(cache)}
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.helion_bench",
        "--child",
        mode,
        search,
        "--json",
        str(result),
    ] + (["--quick"] if quick else [])
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
        return {
            "mode": mode,
            "search": search,
            "error": f"timed out after {timeout_s:.0f}s",
            "log": log[-4000:],
        }
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)  # anything it left behind
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not result.exists():
        return {
            "mode": mode,
            "search": search,
            "error": f"exit {proc.returncode}",
            "log": log[-4000:],
        }
    data: dict[str, Any] = json.loads(result.read_text())
    data["process_s"] = wall
    return data


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def report(rows: list[dict[str, Any]], stamp: dict[str, str]) -> str:
    """The markdown table, with machine, versions and date."""
    lines = [
        "| search | mode | autotune s | precompile wait s | failures | batches | best ms | "
        "configs | executor warm-up s, start | best config |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {r["search"]: r for r in rows if r["mode"] == "native-fork" and "error" not in r}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['search']} | {r['mode']} | FAILED: {r['error']} |||||||| |")
            continue
        nf = base.get(r["search"])
        ratio = f" ({r['autotune_s'] / nf['autotune_s']:.2f}×)" if nf else ""
        wratio = (
            f" ({r['precompile_wait_s'] / nf['precompile_wait_s']:.2f}×)"
            if nf and nf["precompile_wait_s"] > 0
            else ""
        )
        lines.append(
            f"| {r['search']} | {r['mode']} | {r['autotune_s']:.1f}{ratio} | "
            f"{r['precompile_wait_s']:.1f}{wratio} | {r['failures']} | {r['batches']} | "
            f"{_fmt(r.get('best_ms'), '.4f')} | {r.get('configs_tested', '—')} | "
            f"{_fmt(r.get('warm_up_s'))}{' ' + r['start'] if 'start' in r else ''} | "
            f"`{r['best_config']}` |"
        )
    head = [f"- {k}: {v}" for k, v in stamp.items()]
    return "\n".join(head + ["", *lines, ""])


def main(argv: list[str] | None = None) -> int:
    """Entry point: the whole run, or one scenario with ``--child``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1024³, 8 configs, 4 jobs")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--timeout", type=float, default=SCENARIO_TIMEOUT_S)
    parser.add_argument("--only", nargs="*", help="scenarios to run, e.g. ours-spawn:random")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "SEARCH"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        data = run_scenario(*args.child, args.quick)
        assert args.json is not None
        args.json.write_text(json.dumps(data))
        print(json.dumps(data))
        return 0

    from benchmarks._common import stamp, usable_cores, version

    info = stamp(usable_cores(), "python -m benchmarks.helion_bench" + " --quick" * args.quick)
    info["helion"] = version("helion")
    info["IntelGPUError shim"] = (
        "defined by this benchmark (measurement only: torch lacks it)" if SHIMMED else "not needed"
    )
    with contextlib.suppress(Exception):
        import torch

        info["gpu"] = torch.cuda.get_device_name(0)
    wanted = [tuple(s.split(":")) for s in args.only] if args.only else SCENARIOS
    rows = []
    with tempfile.TemporaryDirectory(prefix="helion-bench-") as tmp:
        for mode, search in wanted:
            print(f"== {mode} {search}", flush=True)
            row = _child(mode, search, args.quick, args.timeout, Path(tmp))
            print(json.dumps({k: v for k, v in row.items() if k != "log"}), flush=True)
            if "error" in row:
                print(row.get("log", ""), flush=True)
            rows.append(row)
    text = report(rows, info)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
