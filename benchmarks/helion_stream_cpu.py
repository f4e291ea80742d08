"""Helion's batch against ours streamed, on a machine without a GPU: the autotuning process's side.

    python -m benchmarks.helion_stream_cpu [--configs 16] [--rounds 3] [--jobs 2]

What the H200 runs cannot separate: how much the autotuning process's own work — Helion's codegen
(``compile_config``) and each config's measurement — slows down while precompile children
compile beside it, which is what streaming does (docs/helion.md, "Streaming"). Each run is a fresh
interpreter that binds a Helion matmul with ``compile_only_driver`` (real sm_90 compiles, no GPU)
and calls one ``benchmark()`` of a provider whose GPU parts stand in, as in tests/test_helion.py:
no baseline run, and each config's measurement is a fixed amount of CPU work (about 0.1 s on an
idle core), timed. Modes, interleaved per round:

* ``native``: Helion's ``LocalBenchmarkProvider`` and its own fork mode (codegen of every config,
  then all precompiles, then the measurements: nothing compiles while it measures);
* ``ours``: ``StreamingBenchmarkProvider`` on a ``PrecompileExecutor``, as the package is: each
  config's precompile forked as soon as its code exists;
* ``ours-batched``: every config of the batch generated and prepared first, then the children
  forked back to back (``_provider.FORKS_AFTER_CODEGEN = True``).

Per run: the batch's wall time, the autotuning thread's CPU time, Σ codegen and Σ measurement
(seconds and calls). The table gives medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

MODES = ("native", "ours", "ours-batched")
WORK = 1_500_000
"""Loop iterations standing in for one measurement's CPU work."""


def run(mode: str, configs: int, jobs: int) -> dict[str, Any]:
    """One batch in this process (``--child``); returns its figures."""
    import contextlib
    import random
    import warnings

    warnings.filterwarnings("ignore")
    import helion
    import torch
    from helion.autotuner.benchmark_provider import LocalBenchmarkProvider
    from helion.autotuner.config_generation import ConfigGeneration
    from helion.runtime.kernel import BoundKernel

    import precompile_executor.helion as peh
    from benchmarks._helion_cpu import on_the_cpu
    from precompile_executor import PrecompileExecutor
    from precompile_executor.helion._provider import StreamingBenchmarkProvider
    from precompile_executor.triton import compile_only_driver, parse_target

    if mode == "ours-batched":
        from precompile_executor.helion import _provider

        _provider.FORKS_AFTER_CODEGEN = True
    spent = {"codegen": [0.0, 0], "measure": [0.0, 0]}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name][0] += time.perf_counter() - t
                spent[name][1] += 1

        return wrapper

    BoundKernel.compile_config = timed("codegen", BoundKernel.compile_config)  # type: ignore[method-assign]

    from benchmarks.helion_bench import _matmul

    matmul = _matmul()  # the H200 scenario's kernel (Helion refuses closures: module globals)
    base = LocalBenchmarkProvider if mode == "native" else StreamingBenchmarkProvider

    def measure(config: Any) -> float:
        x = 0
        for i in range(WORK):
            x += i
        return 1.0

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="helion-stream-cpu-")
    x = torch.randn(512, 512, dtype=torch.float16)
    args = (x, torch.randn_like(x))
    with compile_only_driver(parse_target("cuda:90")), contextlib.ExitStack() as stack:
        bound = matmul.bind(args)
        random.seed(0)
        generation = ConfigGeneration(bound.config_spec)
        chosen: list[Any] = []
        while len(chosen) < configs:  # persistent pid types need a device's SM count
            config = generation.unflatten(generation.random_flat())
            if config.config.get("pid_type") == "flat":
                chosen.append(config)
        settings = helion.Settings(
            autotune_precompile="fork",
            autotune_progress_bar=False,
            autotune_precompile_jobs=jobs,
            autotune_compile_timeout=120,
        )
        if mode != "native":
            stack.enter_context(peh.use(stack.enter_context(PrecompileExecutor(jobs))))
        provider = on_the_cpu(base, bound, args, settings, timed("measure", measure))
        provider.setup()
        t0, cpu0 = time.perf_counter(), time.thread_time()
        results = provider.benchmark(chosen)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        provider.cleanup()
    return {
        "mode": mode,
        "wall_s": wall,
        "thread_cpu_s": cpu,
        "codegen": spent["codegen"],
        "measure": spent["measure"],
        "ok": sum(r.status == "ok" for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point: the interleaved rounds, or one run with ``--child``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run(args.child, args.configs, args.jobs)))
        return 0
    from benchmarks._common import stamp, usable_cores

    info = stamp(usable_cores(), f"python -m benchmarks.helion_stream_cpu {' '.join(argv or [])}")
    rows = []
    for round_ in range(args.rounds):
        for mode in MODES:
            cmd = [sys.executable, "-m", "benchmarks.helion_stream_cpu", "--child", mode]
            cmd += ["--configs", str(args.configs), "--jobs", str(args.jobs)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                print(f"round {round_ + 1} {mode} failed:\n{done.stderr[-3000:]}")
                return 1
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps({"round": round_ + 1, **row}), flush=True)
            rows.append(row)
    print("\n".join(f"- {k}: {v}" for k, v in info.items()))
    print(f"- configs: {args.configs}, jobs: {args.jobs}, rounds: {args.rounds}\n")
    print("| mode | batch wall s | vs ours | thread CPU s | codegen s / calls | measure s |")
    print("|---|---|---|---|---|---|")
    median = {m: statistics.median(r["wall_s"] for r in rows if r["mode"] == m) for m in MODES}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        codegen = statistics.median(r["codegen"][0] for r in mine)
        print(
            f"| {mode} | {median[mode]:.2f} | {median[mode] / median['ours']:.3f} | "
            f"{statistics.median(r['thread_cpu_s'] for r in mine):.2f} | "
            f"{codegen:.2f} / {mine[0]['codegen'][1]} | "
            f"{statistics.median(r['measure'][0] for r in mine):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
