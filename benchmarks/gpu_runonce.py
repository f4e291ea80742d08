"""Run-once GPU batches: compile and run every matmul config once, the ways an autotuner can.

Usage (from the repository root, on a machine with one or more CUDA GPUs)::

    python -m benchmarks.gpu_runonce                 # 64 configs, 16 workers, every GPU
    python -m benchmarks.gpu_runonce --quick         # 8 configs, 4 workers, small sizes
    python -m benchmarks.gpu_runonce --json out.json # also write the figures as JSON

What it measures, in one process and one run (so the figures share a machine state):

1. **Autotune batch, one GPU** — ``--configs`` matmul configs (``benchmarks._kernels``), each
   compiled and run once on GPU 0 with ``--workers`` at a time, each strategy with a fresh Triton
   cache: *Helion's fork mode* (re-implemented in ``benchmarks._helion_modes``: one forked child per
   config compiles it under the compile-only driver, then the parent runs each config once, a cache
   hit each); *Helion's spawn mode* (one fresh interpreter per config loads the arguments written
   once with ``torch.save``, compiles and runs the kernel between device synchronisations); *ours*
   (warm ``PrecompileExecutor`` workers pinned to GPU 0 run ``run_once`` tasks with ``share_args``
   arguments, loaded once per worker); *ideal*: ``max(sum(compile) / workers, longest compile + run,
   sum(run) / GPUs)``, from the workers' compile times and each kernel's time alone on a GPU (CUDA
   events, measured in this process after the batch).
2. **The same batch on every GPU** — ours with ``devices=[0, 1, ...]``: the ratio to one GPU.
3. **Run-phase scaling** — the same configs on a ``--big`` matmul (compiles cached), run once
   per config on one GPU and on every GPU, twice each; the ratio of the second passes.
4. **Shared arguments vs pickled** — one compiled config run ``--configs`` times with the
   arguments shared (loaded once per worker) or sent with each task (pickled in the caller,
   copied to the GPU in the worker every time).

Timeouts bound every task (``--timeout``); a failed config is counted, not fatal.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import triton

from benchmarks import _helion_modes, _kernels
from benchmarks._common import stamp, usable_cores
from precompile_executor import PrecompileExecutor, stop_idle_workers
from precompile_executor.gpu import RunOnce, RunReport, SharedArgs, run_once, share_args
from precompile_executor.triton import TensorSpec, classify, compile_only_driver, parse_target

TARGET = "cuda:90"
"""What the fork-mode children compile for (the H100/H200); a launch here must hit their cache."""

Configs = Sequence[_kernels.Config]


# -- tasks (module level: workers and fresh interpreters import them by reference) ------------


def matmul_kwargs(cfg: _kernels.Config) -> dict[str, Any]:
    """The launch keyword arguments of one ``(BLOCK_M, BLOCK_N, BLOCK_K, stages, warps)``."""
    bm, bn, bk, stages, warps = cfg
    blocks = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    return {**blocks, "num_stages": stages, "num_warps": warps}


def matmul_grid(meta: Any) -> tuple[int]:
    """One program per output tile."""
    return (triton.cdiv(meta["M"], meta["BLOCK_M"]) * triton.cdiv(meta["N"], meta["BLOCK_N"]),)


def matmul_args(size: int, device: str) -> tuple[Any, ...]:
    """``(a, b, c, M, N, K, strides...)`` of a ``size``-cubed fp16 matmul."""
    a, b = (torch.randn(size, size, dtype=torch.float16, device=device) for _ in range(2))
    c = torch.empty(size, size, dtype=torch.float16, device=device)
    return (a, b, c, size, size, size, *a.stride(), *b.stride(), *c.stride())


def in_cache(cache_dir: str, task: RunOnce) -> RunReport:
    """Run ``task`` with Triton's cache in ``cache_dir`` (each strategy starts empty)."""
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    return task()


def warm_worker(delay_s: float) -> int:
    """What a worker that served an earlier batch has done: CUDA up, compiler libraries loaded
    (a launch of the package's layer norm, ``benchmarks._kernels.layer_norm``)."""
    with _kernels.triton_cache_dir(tempfile.mkdtemp(prefix="bench-warm-"), remove=True):
        x = torch.ones(4, 1024, device="cuda")
        w, rows = torch.ones(1024, device="cuda"), torch.empty(4, device="cuda")
        args = (x, torch.empty_like(x), w, torch.zeros_like(w), rows, torch.empty_like(rows))
        _kernels.layer_norm[(4,)](*args, x.stride(0), 1024, 1e-5, BLOCK_SIZE=1024)
        torch.cuda.synchronize()
    time.sleep(delay_s)
    return os.getpid()


def fork_compile(cfg: _kernels.Config, size: int, cache_dir: str) -> float:
    """Helion's fork mode, child side: compile one config, as the JIT would for the real launch."""
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    a = TensorSpec("fp16", (size, size))
    specs = (a, a, a, size, size, size, *a.stride(), *a.stride(), *a.stride())
    start = time.perf_counter()
    with compile_only_driver(parse_target(TARGET)):
        _kernels.matmul.warmup(*specs, grid=(1,), **matmul_kwargs(cfg))
    return time.perf_counter() - start


def _tag(name: str) -> None:
    """Initializer: gives each strategy's executor a pool of its own (fresh, cold JIT caches)."""
    os.environ["PRECOMPILE_BENCH_POOL"] = name


# -- helpers ------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The run's stamp (``benchmarks._common.stamp``) with the GPUs and CUDA."""
    try:
        query = ["nvidia-smi", "--query-gpu=index,name,driver_version,pci.bus_id", "--format=csv"]
        gpus = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        gpus = f"(\n{exc})"
    info: dict[str, Any] = stamp(
        usable_cores(), " ".join(["python -m benchmarks.gpu_runonce", *sys.argv[1:]])
    )
    return info | {"gpus": gpus.splitlines()[1:], "cuda": torch.version.cuda}


@contextlib.contextmanager
def fresh_cache(label: str) -> Iterator[str]:
    """A new empty Triton cache directory, removed afterwards."""
    path = tempfile.mkdtemp(prefix=f"bench-gpu-{label}-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def warm_pool(pool: PrecompileExecutor, workers: int, timeout: float) -> None:
    """Start every worker and give each one the state an earlier batch would have left."""
    pool.warm_up(timeout=timeout)
    pids = {
        f.result(timeout=timeout) for f in [pool.submit(warm_worker, 0.5) for _ in range(workers)]
    }
    if len(pids) < workers:
        print(f"  (warm-up reached {len(pids)} of {workers} workers)")


def run_batch(
    pool: PrecompileExecutor, tasks: Sequence[Callable[[], Any]], timeout: float
) -> tuple[float, list[RunReport], list[str]]:
    """Submit every task, wait for all; return wall seconds, the reports and the failures."""
    start = time.perf_counter()
    futures = [pool.submit(task) for task in tasks]
    reports: list[RunReport] = []
    failures: list[str] = []
    for future in futures:
        try:
            reports.append(future.result(timeout=timeout))
        except Exception as exc:  # noqa: BLE001 - counted and shown, never fatal
            failures.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    return time.perf_counter() - start, reports, failures


def matmul_tasks(
    configs: Configs, args: SharedArgs | tuple[Any, ...], cache_dir: str
) -> list[Callable[[], RunReport]]:
    """One picklable run-once task per config, compiling into ``cache_dir``."""
    return [
        functools.partial(
            in_cache,
            cache_dir,
            run_once(_kernels.matmul, args, grid=matmul_grid, **matmul_kwargs(cfg)),
        )
        for cfg in configs
    ]


def kernel_times(configs: Configs, args: tuple[Any, ...], cache_dir: str) -> dict[str, float]:
    """Each config's kernel time alone on the GPU (CUDA events around a second launch, here;
    a worker's ``launch_s`` includes other processes' kernels' time slices on the GPU)."""
    times: dict[str, float] = {}
    with _kernels.triton_cache_dir(cache_dir):
        for cfg in configs:
            kwargs = matmul_kwargs(cfg)
            _kernels.matmul[matmul_grid](*args, **kwargs)  # loads the module
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            _kernels.matmul[matmul_grid](*args, **kwargs)
            end.record()
            end.synchronize()
            label = run_once(_kernels.matmul, (), grid=matmul_grid, **kwargs).label
            times[label] = start.elapsed_time(end) / 1000
    return times


def ideal_s(
    reports: Sequence[RunReport], alone: dict[str, float], workers: int, gpus: int
) -> float:
    """The batch's lower bound (see the module docstring)."""
    if not reports:
        return float("nan")
    runs = [alone.get(r.label, 0.0) for r in reports]
    return max(
        sum(r.compile_s for r in reports) / workers,
        max(r.compile_s + run for r, run in zip(reports, runs, strict=True)),
        sum(runs) / gpus,
    )


def _line(label: str, wall: float, extra: str = "") -> None:
    print(f"  {label:<34} {wall:8.2f} s  {extra}")


# -- the scenarios ------------------------------------------------------------------------------


def helion_fork(configs: Configs, size: int, workers: int, timeout: float) -> dict[str, Any]:
    """Forked children compile, then this process runs each config once (Helion's fork mode)."""
    args = matmul_args(size, "cuda")
    hits: list[bool] = []

    def listen(
        *, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool
    ) -> None:
        hits.append(cache_hit)

    with fresh_cache("fork") as cache_dir, _kernels.triton_cache_dir(cache_dir):
        start = time.perf_counter()
        calls = [(fork_compile, (cfg, size, cache_dir)) for cfg in configs]
        outcomes = _helion_modes.run_forked(calls, workers, timeout)
        compiled = time.perf_counter() - start
        failures = [o.error for o in outcomes if not o.ok]
        with triton.knobs.compilation.scope():
            triton.knobs.compilation.listener = listen
            for cfg in (c for c, o in zip(configs, outcomes, strict=True) if o.ok):
                try:
                    torch.cuda.synchronize()
                    _kernels.matmul[matmul_grid](*args, **matmul_kwargs(cfg))
                    torch.cuda.synchronize()
                except Exception as exc:  # noqa: BLE001
                    failures.append(f"{type(exc).__name__}: {str(exc)[:120]}")
        wall = time.perf_counter() - start
    hit = sum(hits)
    return {
        "wall_s": wall,
        "compile_phase_s": compiled,
        "run_phase_s": wall - compiled,
        "parent_cache_hits": hit,
        "parent_compiles": len(hits) - hit,
        "failures": failures,
    }


def helion_spawn(configs: Configs, size: int, workers: int, timeout: float) -> dict[str, Any]:
    """One fresh interpreter per config loads the args file, compiles and runs (spawn mode)."""
    args = matmul_args(size, "cuda")
    with fresh_cache("spawn") as cache_dir:
        start = time.perf_counter()
        with share_args(args) as shared:
            tasks = matmul_tasks(configs, shared, cache_dir)
            outcomes = _helion_modes.run_spawned(
                [(t.func, t.args) for t in tasks], workers, timeout
            )  # type: ignore[attr-defined]
        wall = time.perf_counter() - start
    reports = [o.value for o in outcomes if o.ok]
    return {
        "wall_s": wall,
        "failures": [o.error for o in outcomes if not o.ok],
        "mean_child_s": statistics.mean(o.ended - o.started for o in outcomes),
        "mean_compile_s": statistics.mean(r.compile_s for r in reports) if reports else None,
    }


def scenario_helion_modes(opts: argparse.Namespace, configs: Configs) -> dict[str, Any]:
    """1a. Helion's fork and spawn modes on one GPU."""
    fork = helion_fork(configs, opts.size, opts.workers, opts.timeout)
    _line(
        "Helion's fork mode (fork compile + parent run)",
        fork["wall_s"],
        f"compile phase {fork['compile_phase_s']:.2f} s, run phase {fork['run_phase_s']:.2f} s, "
        f"parent cache hits {fork['parent_cache_hits']}/"
        f"{fork['parent_cache_hits'] + fork['parent_compiles']}, failures {len(fork['failures'])}",
    )
    spawn = helion_spawn(configs, opts.size, opts.workers, opts.timeout)
    extra = f"mean child {spawn['mean_child_s']:.2f} s, failures {len(spawn['failures'])}"
    _line("Helion's spawn mode (interpreter per config)", spawn["wall_s"], extra)
    for failure in fork["failures"][:3] + spawn["failures"][:3]:
        print("    failure:", failure)
    return {"helion_fork": fork, "helion_spawn": spawn}


def _per_gpu(reports: Sequence[RunReport]) -> str:
    counts = collections.Counter(f"{r.device.pinned}={r.device.uuid[-8:]}" for r in reports)
    return ", ".join(f"{k}: {v} tasks" for k, v in sorted(counts.items()))


def scenario_batch(
    opts: argparse.Namespace, configs: Configs, pool: PrecompileExecutor, gpus: int, cache_dir: str
) -> dict[str, Any]:
    """1b/2. Ours: one run-once batch on a warm pool (the shared-arguments file write included);
    the ideal from its own task times."""
    args = matmul_args(opts.size, "cuda")
    start = time.perf_counter()
    with share_args(args) as shared:
        _, reports, failures = run_batch(
            pool, matmul_tasks(configs, shared, cache_dir), opts.timeout
        )
    wall = time.perf_counter() - start
    alone = kernel_times(configs, args, cache_dir)
    ideal = ideal_s(reports, alone, opts.workers, gpus)
    compile_s, run_s = sum(r.compile_s for r in reports), sum(r.launch_s for r in reports)
    _line(
        f"ours, warm pool, {gpus} GPU(s)",
        wall,
        f"failures {len(failures)}, sum compile {compile_s:.1f} s, sum launch-to-sync "
        f"{run_s:.2f} s (GPU shared by {opts.workers // gpus} workers)",
    )
    _line(
        f"ideal, {gpus} GPU(s)",
        ideal,
        "max(sum compile/workers, longest compile+run, sum run alone "
        f"{sum(alone.values()):.2f} s/GPUs)",
    )
    print(f"    tasks per GPU: {_per_gpu(reports)}")
    for failure in failures[:3]:
        print("    failure:", failure)
    return {
        "wall_s": wall,
        "ideal_s": ideal,
        "sum_compile_s": compile_s,
        "sum_launch_s": run_s,
        "sum_kernel_alone_s": sum(alone.values()),
        "longest_compile_s": max((r.compile_s for r in reports), default=0.0),
        "failures": failures,
        "per_gpu": _per_gpu(reports),
    }


def scenario_run_phase(
    opts: argparse.Namespace, configs: Configs, pools: Sequence[tuple[str, PrecompileExecutor, str]]
) -> dict[str, list[float]]:
    """3. Every config run once on a large matmul, compiles cached, two passes per pool."""
    walls: dict[str, list[float]] = {}
    big = matmul_args(opts.big, "cuda")
    with share_args(big) as shared:
        del big
        for label, pool, cache_dir in pools:
            tasks = matmul_tasks(configs, shared, cache_dir)
            walls[label] = []
            for attempt in (1, 2):
                wall, reports, failures = run_batch(pool, tasks, opts.timeout)
                walls[label].append(wall)
                _line(
                    f"{label}, pass {attempt}",
                    wall,
                    f"sum run {sum(r.launch_s for r in reports):.2f} s, sum load "
                    f"{sum(r.load_s for r in reports):.2f} s, failures {len(failures)}",
                )
    torch.cuda.empty_cache()
    return walls


def scenario_args(
    opts: argparse.Namespace, configs: Configs, pool: PrecompileExecutor
) -> dict[str, Any]:
    """4. One compiled config, run len(configs) times: shared arguments vs pickled per task."""
    args = matmul_args(opts.size, "cpu")
    mib = sum(a.numel() * a.element_size() for a in args[:3]) / 2**20
    one_config = [configs[0]]
    with fresh_cache("args") as cache_dir:
        # Compile the config on every worker first: this scenario measures the arguments only.
        run_batch(pool, matmul_tasks(one_config, args, cache_dir) * opts.workers, opts.timeout)
        start = time.perf_counter()
        with share_args(args) as shared:
            tasks = matmul_tasks(one_config, shared, cache_dir) * len(configs)
            _, shared_reports, _ = run_batch(pool, tasks, opts.timeout)
        shared_s = time.perf_counter() - start
        start = time.perf_counter()
        tasks = matmul_tasks(one_config, args, cache_dir) * len(configs)
        _, pickled_reports, _ = run_batch(pool, tasks, opts.timeout)
        pickled_s = time.perf_counter() - start
    loads = sum(r.args_loaded for r in shared_reports)
    for label, wall, n, reports in (
        ("shared (torch.save once)", shared_s, loads, shared_reports),
        ("pickled with every task", pickled_s, len(pickled_reports), pickled_reports),
    ):
        _line(
            label,
            wall,
            f"{n} loads of {mib:.0f} MiB, sum load {sum(r.load_s for r in reports):.2f} s",
        )
    print(f"  pickled / shared = {pickled_s / shared_s:.2f}x")
    return {"shared_s": shared_s, "pickled_s": pickled_s, "mib": mib, "shared_loads": loads}


def main(argv: Sequence[str] | None = None) -> int:
    """Run every scenario and print the figures (see the module docstring)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--configs", type=int, default=64)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--size", type=int, default=4096, help="matmul size of the batch")
    parser.add_argument("--big", type=int, default=16384, help="matmul size of the run phase")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per task")
    parser.add_argument("--quick", action="store_true", help="8 configs, 4 workers, small sizes")
    parser.add_argument(
        "--skip-helion-modes", action="store_true", help="leave out Helion's two modes"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.configs, opts.workers, opts.size, opts.big = 8, 4, 1024, 2048
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 2
    gpus = list(range(torch.cuda.device_count()))
    configs = _kernels.configs(opts.configs, quick=False)
    results: dict[str, Any] = {"machine": machine(), "options": vars(opts)}
    print("machine:", json.dumps(results["machine"], indent=1))
    print(
        f"batch: {len(configs)} matmul configs, {opts.size}^3 fp16, {opts.workers} workers, "
        f"GPUs {gpus}; run phase {opts.big}^3; timeout {opts.timeout:g} s per task"
    )
    print("\n1. autotune batch (compile + run once), one GPU, a fresh Triton cache each")
    # First: forking is safest before this process has pools' threads.
    if not opts.skip_helion_modes:
        results.update(scenario_helion_modes(opts, configs))
    common: dict[str, Any] = {"timeout": opts.timeout, "classify": classify, "initializer": _tag}
    one = PrecompileExecutor(opts.workers, devices=[0], initargs=("1",), **common)
    every = PrecompileExecutor(opts.workers, devices=gpus, initargs=("n",), **common)
    try:
        with fresh_cache("ours1") as cache1, fresh_cache("oursN") as cache_n:
            warm_pool(one, opts.workers, opts.timeout)
            results["ours_1gpu"] = b1 = scenario_batch(opts, configs, one, 1, cache1)
            if not opts.skip_helion_modes:
                fork_s, spawn_s = (
                    results["helion_fork"]["wall_s"],
                    results["helion_spawn"]["wall_s"],
                )
                print(
                    f"  Helion fork mode / ours = {fork_s / b1['wall_s']:.2f}x, "
                    f"Helion spawn mode / ours = "
                    f"{spawn_s / b1['wall_s']:.2f}x, "
                    f"ours / ideal = {b1['wall_s'] / b1['ideal_s']:.2f}x"
                )
            print(f"\n2. the same batch on GPUs {gpus} (a fresh pool and cache)")
            warm_pool(every, opts.workers, opts.timeout)
            results["ours_ngpu"] = bn = scenario_batch(opts, configs, every, len(gpus), cache_n)
            print(f"  1 GPU / {len(gpus)} GPUs = {b1['wall_s'] / bn['wall_s']:.2f}x")
            print(f"\n3. run phase: {opts.big}^3 matmul, compiled configs, 1 GPU vs {len(gpus)}")
            label_n = f"{len(gpus)} GPUs"
            walls = scenario_run_phase(
                opts, configs, [("1 GPU", one, cache1), (label_n, every, cache_n)]
            )
            ratio = walls["1 GPU"][1] / walls[label_n][1]
            print(f"  1 GPU / {len(gpus)} GPUs = {ratio:.2f}x (second passes)")
            results["run_phase"] = {"walls": walls, "ratio": ratio}
        print(
            f"\n4. shared arguments vs pickled with every task ({opts.size}^3 fp16 arguments, "
            f"one compiled config, {len(configs)} tasks, GPUs {gpus})"
        )
        results["args"] = scenario_args(opts, configs, every)
    finally:
        for pool in (one, every):
            pool.shutdown(wait=True)
        stop_idle_workers()
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    # Run main() from the module's importable name, so that its tasks pickle by reference (a
    # fresh interpreter of Helion's spawn mode cannot import anything from this __main__).
    from benchmarks import gpu_runonce

    sys.exit(gpu_runonce.main())
