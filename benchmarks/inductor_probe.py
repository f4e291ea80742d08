"""Where max-autotune's time goes, stock vs ``precompile_executor.inductor.use()``: a short probe.

    python -m benchmarks.inductor_probe --out-dir DIR [--variants ours,stock] [--deadline 115]
        [--process-timeout 75] [--tokens 4096] [--width 1024]
    python -m benchmarks.inductor_probe --out-dir DIR --cpu     # the plumbing, on a CPU

A model of three ``nn.Linear`` of different shapes (fp16 on the GPU; ``tokens × width`` →
``3·width`` → GELU → ``width`` → ``width/2``), so that ``torch.compile(mode="max-autotune")``
spends its time on the GEMM template choices of three matmuls and their epilogues. Each variant
is one fresh interpreter with empty Inductor and Triton caches (``inductor_bench``'s child:
its timers, counters and instruments), run in turn (``ours`` first, by default) within
``--deadline`` seconds in all.

Written under ``--out-dir`` as it goes, so a time-out loses nothing finished:

* ``VARIANT.log`` — the child's output while it runs: its breakdown, both profiles; if it is
  still running a few seconds before its limit, every thread's stack (``faulthandler``);
* ``VARIANT-progress.json`` — the instruments' counters, rewritten every few seconds;
* ``VARIANT-profile.txt`` / ``.prof`` — ``cProfile`` of the caller's compile and first call
  (the main thread; on Python 3.12 ``cProfile`` sees every thread): top 25 by cumulative time
  and top 25 by own time, and the raw stats; ``VARIANT-profile-partial.txt``: the same, so
  far, if the compile still runs a few seconds before the limit;
* ``VARIANT.json`` — the record: whole wall, the breakdown, the seam's compile counts, the
  caller's Triton compiles (cache hits and misses), ``compilation_time_metrics``, the ``ptxas``
  the caller and a worker use, a census of the Triton cache;
* ``summary.txt`` — each process's breakdown, appended as each ends.
"""

from __future__ import annotations

import argparse
import cProfile
import faulthandler
import io
import json
import pstats
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import inductor_bench

VARIANTS = ("ours", "stock", "ours-before", "ours-cost-order", "ours-warm")
"""``ours-before``: ``use()`` without the two things that keep the caller from compiling again
what the workers compiled (a template choice's kernel landing where benchmarking runs it; the
caller's Triton on the workers' ``ptxas``): what ``use()`` did when max-autotune was 2x stock.
``ours-cost-order``: ``use()`` with Inductor's compiles in the executor's own order (priority,
then the longest predicted) instead of the order Inductor sent them
(``state.in_submission_order = False``; docs/inductor.md, "Order of the compiles").
``ours-warm``: ``install()`` before the model is built, so the default executor's workers are
warm when the compile starts (``ours`` starts them at ``use()``, just before the compile)."""
DEFAULT_VARIANTS = ("ours", "stock")
PROGRESS_INTERVAL_S = 5.0
"""How often a child rewrites its progress file."""
STACKS_BEFORE_LIMIT_S = 6.0
"""A child still running this long before its limit writes every thread's stack to its log."""
MIN_RUN_S = 20.0
"""A variant starts only with at least this much of the deadline left."""
PROFILE_ROWS = 25


def _build(spec: dict[str, Any]) -> tuple[Any, Any]:
    import torch
    from torch import nn

    if spec["variant"] == "ours-warm":
        import precompile_executor.inductor as pe_inductor

        pe_inductor.install()  # the default executor warms while the model is built

    torch.manual_seed(0)
    width = spec["width"]
    dtype = getattr(torch, spec["dtype"])
    model = nn.Sequential(
        nn.Linear(width, 3 * width),
        nn.GELU(approximate="tanh"),
        nn.Linear(3 * width, width),
        nn.ReLU(),
        nn.Linear(width, width // 2),
    )
    inputs = torch.randn(spec["tokens"], width, generator=torch.Generator().manual_seed(1))
    device = spec["device"]
    return model.to(device=device, dtype=dtype).eval(), inputs.to(device=device, dtype=dtype)


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # a reader never sees half a file


def _progress(path: Path, started: float, stop: threading.Event) -> None:
    from benchmarks import _inductor_instruments as instruments

    while not stop.wait(PROGRESS_INTERVAL_S):
        snapshot = instruments.snapshot() | {
            "since_start_s": round(time.perf_counter() - started, 1),
            "caller_thread_cpu_s": instruments.thread_cpu(),
            "children_cpu": instruments.children_cpu(),
        }
        _write(path, json.dumps(snapshot, indent=1))


def _profile_text(profile: cProfile.Profile, variant: str, note: str = "") -> str:
    text = io.StringIO()
    for order in ("cumulative", "tottime"):
        text.write(f"== top {PROFILE_ROWS} by {order} ({variant}, the caller's compile{note})\n")
        stats = pstats.Stats(profile, stream=text)
        stats.strip_dirs().sort_stats(order).print_stats(PROFILE_ROWS)
    return text.getvalue()


def _profiled(
    out_dir: Path, variant: str, partial_at: float | None
) -> Callable[[Callable[[], Any]], Any]:
    """Run the compile under ``cProfile``; if it is still running at ``partial_at``
    (``time.perf_counter()``, a few seconds before the child's limit), write the profile so
    far too (SIGALRM: its handler runs on the main thread, between two bytecodes)."""

    def run(fn: Callable[[], Any]) -> Any:
        profile = cProfile.Profile()
        began = time.perf_counter()

        def partial(signum: int, frame: Any) -> None:
            profile.disable()
            try:
                note = f", PARTIAL: still compiling after {time.perf_counter() - began:.0f} s"
                text = _profile_text(profile, variant, note)
                _write(out_dir / f"{variant}-profile-partial.txt", text)
                print(text, flush=True)
            finally:
                profile.enable()

        if partial_at is not None:
            signal.signal(signal.SIGALRM, partial)
            signal.setitimer(signal.ITIMER_REAL, max(0.5, partial_at - time.perf_counter()))
        profile.enable()
        try:
            return fn()
        finally:
            profile.disable()
            signal.setitimer(signal.ITIMER_REAL, 0)
            profile.dump_stats(str(out_dir / f"{variant}-profile.prof"))
            text = _profile_text(profile, variant)
            _write(out_dir / f"{variant}-profile.txt", text)
            print(text, flush=True)

    return run


def child(spec: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """One variant in this (fresh) process: compile under the profiler; return the record."""
    started = time.perf_counter()
    variant = spec["variant"]
    late = spec.get("stacks_after_s")
    if late:
        faulthandler.dump_traceback_later(late, exit=False)
    stop = threading.Event()
    progress = threading.Thread(
        target=_progress,
        args=(out_dir / f"{variant}-progress.json", started, stop),
        name="probe-progress",
        daemon=True,
    )
    progress.start()
    entered: list[float] = []

    def before_use() -> None:
        if variant == "ours-before":
            _without_landing()
        if variant == "ours-cost-order":
            from precompile_executor.inductor import state

            state.in_submission_order = False
        entered.append(time.monotonic())  # the executor's timeline is on this clock

    try:
        partial_at = started + late if late else None
        record = inductor_bench.child(
            spec, _build, _profiled(out_dir, variant, partial_at), before_use
        )
    finally:
        stop.set()
        faulthandler.cancel_dump_traceback_later()
    if variant.startswith("ours"):
        from benchmarks import _inductor_instruments as instruments
        from precompile_executor.inductor import state

        if state.default is not None:
            record["executor_timeline"] = instruments.timeline_summary(
                state.default.timeline(), entered[0] if entered else None
            )
    from torch._dynamo import utils

    metrics = getattr(utils, "compilation_time_metrics", {})
    record["compilation_time_metrics"] = {
        name: {"n": len(times), "s": round(sum(times), 3)} for name, times in metrics.items()
    }
    return record


def _without_landing() -> None:
    """For ``ours-before``: the caller keeps its ptxas and no compiled choice lands."""
    from torch._inductor.runtime import compile_tasks

    from precompile_executor.inductor import _compiles

    def land_nothing(module_path: str, kernel_name: str, result: Any) -> None:
        pass

    def keep_ptxas() -> None:
        pass

    setattr(_compiles, "_land_template", land_nothing)  # noqa: B010 - a module's function
    setattr(compile_tasks, "_set_triton_ptxas_path", keep_ptxas)  # noqa: B010


def _specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    sizes: dict[str, Any] = {
        "model": "linears",
        "mode": "max-autotune",
        "device": "cpu" if args.cpu else "cuda",
        "dtype": "float32" if args.cpu else "float16",
        "tokens": args.tokens or (64 if args.cpu else 4096),
        "width": args.width or (64 if args.cpu else 1024),
    }
    return [{**sizes, "variant": v, "round": 0} for v in args.variants]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", type=Path, required=True, help="where everything goes")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"in this order, of {','.join(VARIANTS)}",
    )
    parser.add_argument("--deadline", type=float, default=115.0, help="seconds for all runs")
    parser.add_argument("--process-timeout", type=float, default=75.0, help="seconds per run")
    parser.add_argument("--tokens", type=int, help="rows of the input (GPU 4096, CPU 64)")
    parser.add_argument("--width", type=int, help="model width (GPU 1024, CPU 64)")
    parser.add_argument("--cpu", action="store_true", help="CPU, fp32, tiny sizes: plumbing")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.child is not None:
        record = child(json.loads(args.child), args.out_dir)
        print(inductor_bench.RESULT_MARK + json.dumps(record), flush=True)
        return 0
    args.variants = [v for v in args.variants.split(",") if v]
    if not args.variants or any(v not in VARIANTS for v in args.variants):
        parser.error(f"--variants takes a comma-separated subset of {','.join(VARIANTS)}")
    command = " ".join(["python -m benchmarks.inductor_probe", *(argv or sys.argv[1:])])
    stamp = inductor_bench._stamp(command)
    _write(args.out_dir / "stamp.json", json.dumps(stamp, indent=1))
    print(json.dumps(stamp, indent=1), flush=True)
    begun = time.perf_counter()
    ok = True
    walls: dict[str, float | None] = {}
    for spec in _specs(args):
        variant = spec["variant"]
        left = args.deadline - (time.perf_counter() - begun)
        if left < MIN_RUN_S:
            line = f"[{variant}] not run: {left:.0f} s of the deadline left"
            print(line, flush=True)
            with open(args.out_dir / "summary.txt", "a") as summary:
                summary.write(line + "\n")
            ok = False
            continue
        timeout = min(args.process_timeout, left)
        spec["stacks_after_s"] = max(1.0, timeout - STACKS_BEFORE_LIMIT_S)
        record = inductor_bench.run_child(
            spec,
            timeout,
            module="benchmarks.inductor_probe",
            log_path=args.out_dir / f"{variant}.log",
            extra_args=("--out-dir", str(args.out_dir)),
        )
        _write(args.out_dir / f"{variant}.json", json.dumps(record, indent=1))
        lines = inductor_bench.breakdown(record)
        if record["ok"]:
            seen = record.get("compilation_time_metrics", {})
            top = sorted(seen.items(), key=lambda kv: -kv[1]["s"])[:12]
            lines.append(f"[{variant}]   compilation_time_metrics (top 12 by s): {dict(top)}")
        print("\n".join(lines), flush=True)
        with open(args.out_dir / "summary.txt", "a") as summary:
            summary.write("\n".join(lines) + "\n")
        ok = ok and record["ok"] and record.get("equal", False)
        walls[variant] = record["process_wall_s"] if record["ok"] else None
    line = "whole-process wall (s): " + ", ".join(
        f"{v} {'—' if w is None else f'{w:.2f}'}" for v, w in walls.items()
    )
    print(line, flush=True)
    with open(args.out_dir / "summary.txt", "a") as summary:
        summary.write(line + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
