"""Compile on CPU nodes, measured: a dask cluster with no GPU serving a GPU process's autotunes.

    python -m benchmarks.fleet_bench [--out-dir DIR] [--rounds N] [--only gemm,helion,node-loss]
        [--modes stock,local,cluster,native] [--timeout S] [--alternations N]
    python -m benchmarks.fleet_bench --cpu-smoke [--out-dir DIR]   # no GPU: the plumbing only

The parent starts one dask scheduler and ``--nodes`` (2) dask workers of ``--node-threads`` (8)
threads, each a separate process (``python -m distributed.cli.dask_worker --no-nanny``) started
with ``CUDA_VISIBLE_DEVICES=""`` and every address bound to 127.0.0.1 (checked: each socket of
every cluster process), at the caller's priority, their pools' compile workers at the local
executor's workers' (the caller's benchmarks run beside them on one machine: ``NODE_NICENESS``).
It warms the nodes' pools once (``prewarm_worker`` for this GPU's target: a standing cluster's
pools are warm; later executors with the same initializer reuse
them; this also brings torch and Triton into the page cache before the first measured run),
runs one trivial task per slot through the whole task path (a standing cluster has run tasks
before; the first task a fresh dask cluster ever runs waits for dask's cold path, which held back
the first measured run's whole first batch) and shares the cluster with every run that needs it.
Each run is a fresh interpreter with a cold Triton cache (its own ``TRITON_CACHE_DIR``), timed by
the parent from its start to its exit (**whole process**); rounds are interleaved. Every run's
row is printed as soon as it ends and appended to ``DIR/fleet-runs.jsonl``, so a run cut short
keeps what finished; the Markdown report is rewritten to ``DIR/fleet-bench.md`` after each row,
with a table of where each process's time went (``PHASES``: its start, before the tune, the tune,
after it, its exit).
At the end the cluster is torn down and every process the benchmark started, orphans included
(the parent is their subreaper), must be gone.

Scenarios and modes:

* ``gemm``: ``examples.kernels.matmul_kernel`` under 48 ``@triton.autotune`` configs (the 64 of
  ``examples.autotune_kernels.matmul_configs`` less the 64×256 and 256×64 tiles), 4096³ fp16, the
  first call: ``stock`` (Triton alone), ``local`` (``with autotune.use():``: the shared default
  executor, started by the block), ``cluster`` (``with autotune.use(DaskPrecompileExecutor(client,
  initializer=prewarm_worker, ...))``, client and executor made in the run). Per run: the first
  call, the best config and every config's timing, the configs compiled on nodes or workers and
  in this process (every ``triton.compile`` here that was not a cache hit), and for ``cluster`` the
  **per-task cost**: for each compile done on a node, its wall time as this process sees it (from
  the dispatch to its node to its files installed here) less the compile's own time measured on
  the node (``CompiledArtifacts.compile_time_s``), summed and divided by the compile time moved;
  split with dask's task stream into dispatch to the node's start, on the node beside the
  compile, and back here, with the wait for a busy node's slot counted apart and left out of the
  judged figure (``DispatchProbe`` says how), and each task's times recorded in the row.
* ``helion``: Helion's matmul 4096³ fp16 (``benchmarks.helion_bench``'s), a seeded
  ``RandomSearch`` of 32 configs in fork mode, 16 jobs: ``native`` (Helion alone), ``local``
  (``precompile_executor.helion.use()``), ``cluster`` (``helion.use(dask executor)``: each
  config's compile on a node).
* ``node-loss``: the ``cluster`` gemm run again; once ``KILL_AFTER_RUNNING`` configs run on the
  nodes the run says so (a marker file) and the parent SIGKILLs node 0's dask worker. The tune
  must end with stock's best config; the row counts the compiles sent again. The parent then
  starts a new node 0 (warmed) for later runs.

The **chosen-kernel check** (``--alternations``, default 10; 0 skips it): each process's own
timings of one config differ by several per cent (clocks, the GPU's state), so the configs the
runs chose are not compared by the timings of the runs that chose them. After the runs, one more
fresh process (a cold Triton cache) builds the GEMM's inputs, compiles each distinct config that
a gemm or node-loss run chose and runs it once, untimed, then times them with stock Triton's own
benchmark (``Autotuner._bench``, the autotuner's ``do_bench``), one after another, that many
times; a run's choice passes when its median is within ``BEST_WITHIN`` of the stock run's choice
(same round) or faster. Its rows (``scenario`` ``check``: a config, the runs that chose it, its
timings) go to the JSON-lines file too. It runs only when the choices differ (the smoke runs it
anyway, on the dry-run driver). Stock's own timing of a config is shown beside it, not judged.
Helion's choices are still compared by the runs' own best timings (``best_ms``); each Helion row
keeps its choice as ``best_json`` (``helion.Config.from_json``) for a side-by-side timing.

``--cpu-smoke`` runs the same parent and cluster (2 nodes × 1 thread) with no GPU: ``gemm``
``local`` and ``cluster`` and ``node-loss`` on 4 configs, on a dry-run sm_90 driver in the run
(``tests/dry_run_gpu.py``: everything up to the launch is Triton's own, launches are recorded)
with a fixed timing per config, and checks that every compile done on a node is installed in the
run's cache and found there by its launch. Its figures mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import psutil

NODES = 2
NODE_THREADS = 8
"""Dask threads of each node: the compiles it runs at once (its window)."""
SMOKE_NODE_THREADS = 1
GEMM_CONFIGS = 48
SMOKE_CONFIGS = 4
DROPPED_TILES = {(64, 256), (256, 64)}
"""Tiles of ``matmul_configs`` left out, leaving 48 configs (6 tiles × BLOCK_K × stages × warps)."""
HELION_CONFIGS = 32
HELION_JOBS = 16
KILL_AFTER_RUNNING = 4
"""Compiles running on the nodes when node 0 is killed ("after the first few configs")."""
RUN_TIMEOUT_S = 180.0
"""A run that takes longer is killed (its process group) and reported as timed out (the longest,
stock's 48 configs or Helion alone, takes about a minute on the H200)."""
COMPILE_TIMEOUT_S = 120.0
"""Per-compile timeout of the cluster executor, counted from the compile's start on its node."""
CONNECT_TIMEOUT_S = 30.0
CLUSTER_START_TIMEOUT_S = 120.0
"""Longest wait for the scheduler's address file, or for every node to join."""
KILL_WAIT_S = 120.0
"""Longest a node-loss run waits for its marker before it runs on without a kill."""
TEARDOWN_S = 20.0
"""Longest wait for a cluster process to leave after SIGTERM (then SIGKILL), and for every
process the benchmark started to be gone."""
PER_TASK_COST_TARGET = 0.05
"""The cluster's per-task cost must stay below this fraction of the compile time it moves."""
BEST_WITHIN = 0.02
"""A best config other than stock's passes when the chosen-kernel check times it within this of
stock's choice (or faster)."""
ALTERNATIONS = 10
"""Rounds of the chosen-kernel check: each chosen config timed once a round, one after another."""
NODE_NICENESS = 0
"""The dask workers' niceness: the caller's, as a node's own process has on a CPU node (and as the
scheduler has). Their pools' workers run ``prewarm_worker``, which lowers each by the local
executor's workers' increment (``precompile_executor.triton._prewarm.WORKER_NICENESS``), so both
modes' compiles compete alike with the caller's benchmarks on this one machine (CPU nodes
elsewhere would not), and a node's dask event loop — the task's way to the node and back — is
not queued behind the 16 compiles it drives."""
LOOPBACK = frozenset({"127.0.0.1", "::ffff:127.0.0.1"})
PLAN = (
    ("gemm", "stock"),
    ("gemm", "local"),
    ("gemm", "cluster"),
    ("node-loss", "cluster"),
    ("helion", "native"),
    ("helion", "local"),
    ("helion", "cluster"),
)
"""One round, in order: the GEMM's rows first, so a round cut short by the caller's time limit
keeps them."""
SMOKE_PLAN = (("gemm", "local"), ("gemm", "cluster"), ("node-loss", "cluster"))
KILL_MARKER_ENV = "FLEET_BENCH_KILL_MARKER"
"""A node-loss run writes this file when it is time for the parent to kill node 0."""

PHASES = ("start", "before the tune", "tune", "after", "exit")
"""Where a run's process time goes: the interpreter's start (to the run's body), the imports, the
inputs and the executor before the first call or autotune, the tune, the teardown after it
(checks, ``shutdown()``, ``client.close()``) and the exit (the row written to the end of the
process as the parent sees it). The run stamps its moments (:func:`mark`); the parent adds the
spawn and the exit."""

_MARKS: dict[str, float] = {}


def mark(moment: str) -> None:
    """Stamp a moment of this run (wall clock, comparable with the parent's)."""
    _MARKS[moment] = time.time()


def phases(row: dict[str, Any]) -> dict[str, float] | None:
    """The row's :data:`PHASES` in seconds, or ``None`` if a moment is missing."""
    at = {**row.get("marks", {}), "spawned": row.get("spawned_at"), "exited": row.get("exited_at")}
    order = ("spawned", "main", "tune", "tuned", "done", "exited")
    if any(at.get(moment) is None for moment in order):
        return None
    spans = zip(PHASES, order, order[1:], strict=False)
    return {name: round(at[b] - at[a], 3) for name, a, b in spans}


_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


# -- the runs (fresh interpreters) ---------------------------------------------------------------


def gemm_configs(count: int) -> list[Any]:
    """The first ``count`` of the benchmark's 48 matmul configs (the cheapest tiles first)."""
    from precompile_executor.examples.autotune_kernels import matmul_configs

    kept = [
        c
        for c in matmul_configs()
        if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) not in DROPPED_TILES
    ]
    return kept[:count]


class CompileLog:
    """Triton's compilation listener: counts the compiles this process ran itself (a cache hit
    compiles nothing; files installed from a worker or a node reach no ``triton.compile``)."""

    def __init__(self) -> None:
        self.here = 0

    def __call__(
        self, *, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool
    ) -> None:
        if not cache_hit:
            self.here += 1


class DispatchProbe:
    """Times each task of a ``DaskPrecompileExecutor`` from its dispatch to a node to the moment
    its future resolved here (after a compile's files were installed in this process's cache),
    and splits that time with dask's task stream (when the node's dask thread ran the task).

    The split: ``to_node`` is from the dispatcher's ``send`` (``dask/_dispatch.py``:
    ``Client.submit``, the scheduler, the node's event loop) to a dask thread of the node starting
    ``run_task``; ``on_node`` is that thread's time less the compile's own; ``back`` is from the
    thread's end to the future resolved here (the outcome fetched, the files installed). A task
    sent to a node whose dask threads are all busy waits there for one: that wait is *queueing*,
    not a cost of moving the compile, so it is counted apart. The dispatcher sends a node at most
    its window (its dask threads) of tasks and frees a slot only once the task's outcome was
    fetched here (``_cluster_state.py``, ``plan`` and ``take``), so a node's threads are normally
    free when a task arrives; a task cancelled after its dispatch frees its caller-side slot at
    once, before its node stops it. The queueing is replayed from the task stream: each node's
    slots, filled in dispatch order, each held from a task's start to its end; a task waits
    ``max(0, its node's earliest free slot - its dispatch)``.

    Measurement only: no public record holds the dispatch time, so the probe wraps the
    dispatcher's ``send`` and ``take`` (the slot freed) on this executor's own state; the
    executor's behaviour is unchanged.
    Times are ``time.time()``: the nodes' task stream uses it, and they share this machine's clock.
    """

    def __init__(self, executor: Any, client: Any) -> None:
        self.sent: dict[Future[Any], tuple[str, float, str, int]] = {}
        self.settled: dict[Future[Any], float] = {}
        self.taken: dict[Future[Any], float] = {}
        self._client = client
        self._lock = threading.Lock()
        self._began = time.time()
        client.get_task_stream(start=self._began)  # the scheduler records the stream from now
        state = executor._backend
        real_send = state.send

        def send(task: Any) -> None:
            window = state.windows().get(task.node, 0)  # the node's slots when it got the task
            with self._lock:
                self.sent[task.future] = (task.key, time.time(), task.node, window)
            # Added after the compile's own callback (installing the files here): it runs last.
            task.future.add_done_callback(self._settle)
            real_send(task)

        state.send = send
        real_take = state.take

        def take(task: Any) -> bool:
            claimed: bool = real_take(task)
            if claimed:  # the node's slot is free here again: its compute had ended before
                with self._lock:
                    self.taken[task.future] = time.time()
            return claimed

        state.take = take

    def _settle(self, future: Future[Any]) -> None:
        with self._lock:
            self.settled[future] = time.time()

    def summary(self) -> dict[str, Any]:
        """Per-task cost of the compiles that came back, and what happened to the others."""
        with self._lock:
            sent, settled, taken = dict(self.sent), dict(self.settled), dict(self.taken)
        ran: dict[str, tuple[float, float]] = {}
        try:
            for record in self._client.get_task_stream(start=self._began):
                for step in record.get("startstops", ()):
                    if step.get("action") == "compute":
                        ran[str(record["key"])] = (step["start"], step["stop"])
        except Exception:  # noqa: BLE001 - the split is extra; the totals stand without it
            ran = {}
        # A dask worker shifts its task times by its estimate of the scheduler's clock offset
        # (``Worker.scheduler_delay``, renewed at each heartbeat from its round trip): on one
        # machine the clocks are the same and the estimate is noise that grows with the load,
        # moving time between "to the node" and "back" (the sum stands: it is this process's
        # clock). Each task's times are kept inside what is certain — started after its
        # dispatch, ended before the dispatcher freed its slot (``take``, once the outcome was
        # fetched) or its future resolved here — and each node's estimate at the end is
        # recorded as the noise's scale.
        try:
            found = self._client.run(_clock_offset, on_error="return")
        except Exception:  # noqa: BLE001 - the scale is extra
            found = {}
        offsets = {str(a): float(d) for a, d in found.items() if isinstance(d, int | float)}
        for future, (key, at, _, _) in sent.items():
            if key in ran:
                began, ended = ran[key]
                end_by = taken.get(future, settled.get(future, max(ended, at)))
                ended = min(max(ended, at), end_by)
                ran[key] = (min(max(began, at), ended), ended)
        queued = replay_queueing(
            [(key, at, node, window) for key, at, node, window in sent.values()], ran
        )
        walls, compiles, sizes, hashes, records = [], [], [], [], []
        split = {"to_node_s": 0.0, "queued_s": 0.0, "on_node_s": 0.0, "back_s": 0.0,
                 "split_tasks": 0}  # fmt: skip
        lost: dict[str, int] = {}
        nodes = sorted({node for _, _, node, _ in sent.values()})
        windows = {node: window for _, _, node, window in sent.values()}
        for future, (key, at, node, _) in sent.items():
            if future.cancelled():
                lost["cancelled"] = lost.get("cancelled", 0) + 1
                continue
            if future not in settled:
                lost["unsettled"] = lost.get("unsettled", 0) + 1
                continue
            exc = future.exception()
            if exc is not None:
                lost[type(exc).__name__] = lost.get(type(exc).__name__, 0) + 1
                continue
            artifacts = future.result()
            compile_s = getattr(artifacts, "compile_time_s", None)
            if compile_s is None:
                continue  # not a compile
            walls.append(settled[future] - at)
            compiles.append(float(compile_s))
            sizes.append(sum(len(b) for b in artifacts.files.values()))
            hashes.append(artifacts.hash)
            if key in ran:
                began, ended = ran[key]
                split["to_node_s"] += began - at
                split["queued_s"] += queued.get(key, 0.0)
                split["on_node_s"] += ended - began - float(compile_s)
                split["back_s"] += settled[future] - ended
                split["split_tasks"] += 1
                records.append([nodes.index(node)] + [
                    round(1e3 * (t - self._began), 1)
                    for t in (at, began, ended, settled[future])
                ] + [round(1e3 * float(compile_s), 1)])  # fmt: skip
        extra = sorted(w - c for w, c in zip(walls, compiles, strict=True))
        moved = sum(compiles)
        unqueued = sum(extra) - split["queued_s"]
        records.sort(key=lambda r: r[1])
        return {
            "tasks": len(walls),
            "compile_s": round(moved, 3),
            "task_wall_s": round(sum(walls), 3),
            "extra_s": round(sum(extra), 3),
            "per_task_cost": round(sum(extra) / moved, 4) if moved else None,
            "per_task_cost_unqueued": round(unqueued / moved, 4) if moved else None,
            "extra_ms_median": round(1e3 * extra[len(extra) // 2], 1) if extra else None,
            "extra_ms_max": round(1e3 * extra[-1], 1) if extra else None,
            **{k: round(v, 3) for k, v in split.items()},
            **to_node_by_load(records, sum(windows.values())),
            "clock_offsets_ms": {
                nodes.index(a): round(1e3 * d, 2) for a, d in offsets.items() if a in nodes
            },  # fmt: skip
            "bytes": sum(sizes),
            "not_ok": lost,
            "hashes": hashes,
            "records": records,
            "records_fields": "node, dispatch, start, end, settled (ms from the probe's start), "
            "compile ms",
        }


def _clock_offset(dask_worker: Any) -> float:
    """This dask worker's estimate of the scheduler's clock minus its own (``Client.run``)."""
    return float(dask_worker.scheduler_delay)


def replay_queueing(
    sent: list[tuple[str, float, str, int]], ran: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Each task's wait on its node for a free slot (see :class:`DispatchProbe`).

    Args:
        sent: (key, dispatch time, node, the node's slots) of every task sent.
        ran: key → (start, end) of every task a node's dask thread ran.

    Returns:
        key → seconds from its dispatch to its node's earliest free slot (0: a slot was free),
        never more than the task's own dispatch-to-start time.
    """
    import heapq

    by_node: dict[str, list[tuple[float, str, int]]] = {}
    for key, at, node, window in sent:
        if key in ran:
            by_node.setdefault(node, []).append((at, key, window))
    queued: dict[str, float] = {}
    for tasks in by_node.values():
        tasks.sort()
        free = [float("-inf")] * max(1, tasks[0][2])  # when each slot is free again
        for at, key, _ in tasks:
            began, ended = ran[key]
            slot_free = heapq.heappop(free)
            queued[key] = min(max(0.0, slot_free - at), max(0.0, began - at))
            heapq.heappush(free, ended)
    return queued


def running_at_dispatch(records: list[list[float]]) -> list[int]:
    """For each record, the compiles running on all nodes (this one host) when it was sent: the
    load its dispatch met (the nodes and the GPU process share the host's cores)."""
    return [sum(1 for o in records if o[2] <= r[1] < o[3]) for r in records]


def to_node_by_load(records: list[list[float]], slots: int) -> dict[str, Any]:
    """The mean load a dispatch met, and the median dispatch-to-start (ms) of the tasks sent
    while fewer than half of all slots ran a compile, and of those sent while more did: a
    dispatch-to-start that grows with the load is the host's busy cores, not the cluster's path."""
    if not records:
        return {}
    running = running_at_dispatch(records)
    paired = list(zip(records, running, strict=True))
    light = sorted(round(r[2] - r[1], 1) for r, n in paired if 2 * n < slots)
    heavy = sorted(round(r[2] - r[1], 1) for r, n in paired if 2 * n >= slots)
    return {
        "running_at_dispatch": round(sum(running) / len(running), 2),
        "slots": slots,
        "to_node_ms_median_light": light[len(light) // 2] if light else None,
        "to_node_ms_median_heavy": heavy[len(heavy) // 2] if heavy else None,
        "tasks_light_heavy": [len(light), len(heavy)],
    }


def _cluster_executor(scheduler: str, target: str) -> tuple[Any, Any]:
    """A client of the benchmark's cluster and an executor on it, as the parent warmed it."""
    from distributed import Client

    from precompile_executor.dask import DaskPrecompileExecutor
    from precompile_executor.triton import classify

    client = Client(scheduler, timeout=CONNECT_TIMEOUT_S)
    executor = DaskPrecompileExecutor(client, timeout=COMPILE_TIMEOUT_S, classify=classify,
                                      **node_initializer(target))  # fmt: skip
    return client, executor


def node_initializer(target: str) -> dict[str, Any]:
    """The cluster executors' initializer (the parent's warm-up and every run use the same, so
    the runs reuse the warm pools): the local executor's worker set-up, ``prewarm`` for the
    caller's target at :data:`NODE_NICENESS` plus the local workers' increment."""
    from precompile_executor.triton._prewarm import WORKER_NICENESS, prewarm_worker

    return {"initializer": prewarm_worker, "initargs": (target, WORKER_NICENESS)}


def _cached_hashes() -> set[str]:
    """The kernel hashes in this process's Triton cache (each kernel's metadata names its own)."""
    found = set()
    for path in Path(os.environ["TRITON_CACHE_DIR"]).rglob("*.json"):
        if path.name.startswith("__grp__"):
            continue
        with contextlib.suppress(OSError, ValueError, AttributeError):
            found.add(json.loads(path.read_text()).get("hash"))
    return found


def _non_loopback_here() -> list[str]:
    found = []
    for c in psutil.Process().net_connections(kind="inet"):
        for addr in (c.laddr, c.raddr):
            if addr and addr.ip not in LOOPBACK:
                found.append(f"{c.status} {c.laddr} -> {c.raddr}")
    return found


def _gemm_inputs(smoke: bool) -> tuple[Any, Any, tuple[Any, ...], Callable[[], float], Any]:
    """(driver to install or None, grid, arguments, correctness check, do_bench) of the matmul."""
    import triton

    m = n = k = 4096
    if smoke:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        import triton.language as tl
        from dry_run_gpu import DryRunGPU, FakeTensor  # type: ignore[import-not-found]

        gpu = DryRunGPU()
        a, b, c = (FakeTensor(tl.float16) for _ in range(3))
        strides = (k, 1, n, 1, n, 1)

        def fake_bench(kernel_call: Callable[[], None], quantiles: Any = None) -> list[float]:
            kernel_call()  # Triton's launch path: the kernel must be in this process's caches
            launched = gpu.launches[-1]
            area = launched["BLOCK_M"] * launched["BLOCK_N"]
            ms = 1.0 + launched["BLOCK_K"] / 1e3 + launched["num_warps"] / 1e4 + area / 1e7
            return [ms] * 3

        return gpu, (1,), (a, b, c, m, n, k, *strides), lambda: 0.0, fake_bench
    import torch

    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)

    def grid(meta: dict[str, Any]) -> tuple[int, ...]:
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    def check() -> float:
        ref = a.float() @ b.float()
        return float((c.float() - ref).abs().max() / ref.abs().max())

    return None, grid, (a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride()), check, None


def gemm_run(
    mode: str, scheduler: str | None, configs: int, smoke: bool, target: str
) -> dict[str, Any]:
    """One first call of the autotuned matmul under ``mode``; its row."""
    import triton
    from triton import knobs
    from triton.runtime.driver import driver

    from precompile_executor.examples.kernels import matmul_kernel
    from precompile_executor.triton import autotune as pe_autotune
    from precompile_executor.triton import state

    chosen = gemm_configs(configs)
    gpu, grid, args, check, bench = _gemm_inputs(smoke)
    kernel = triton.autotune(configs=chosen, key=["M", "N", "K"], do_bench=bench)(matmul_kernel.fn)
    log = CompileLog()
    knobs.compilation.listener = log
    row: dict[str, Any] = {"configs": len(chosen)}
    client = executor = probe = watcher = None
    if mode == "cluster":
        began = time.perf_counter()
        client, executor = _cluster_executor(str(scheduler), target)
        probe = DispatchProbe(executor, client)
        row["executor_start_s"] = round(time.perf_counter() - began, 3)
        marker = os.environ.get(KILL_MARKER_ENV)
        if marker:
            watcher = _KillSignal(executor, Path(marker))
    previous = driver.__dict__.get("_active")
    if gpu is not None:
        driver.set_active(gpu)
    try:
        mark("tune")
        start = time.perf_counter()
        if watcher is not None:
            watcher.start(start)
        if mode == "stock":
            kernel[grid](*args)
        elif mode == "local":
            with pe_autotune.use():
                kernel[grid](*args)
        elif mode == "cluster":
            with pe_autotune.use(executor):
                kernel[grid](*args)
        else:
            raise ValueError(f"unknown gemm mode {mode!r}")
        if not smoke:
            import torch

            torch.cuda.synchronize()
        row["first_call_s"] = round(time.perf_counter() - start, 3)
        mark("tuned")
    finally:
        if gpu is not None:
            driver.set_active(previous)
    row["compiled_here"] = log.here
    row["best"] = str(kernel.best_config)
    row["timings_ms"] = {str(c): _p50(t) for c, t in kernel.configs_timings.items()}
    row["rel_err"] = check()
    if mode == "local" and state.default is not None:
        # Its completed tasks count the module imports it sent its workers too: every config
        # compiled once, so those not compiled here were compiled in the workers.
        row["compiled_in_workers"] = len(chosen) - log.here
        row["taken_back"] = state.default.statistics().cancelled
    if executor is not None and probe is not None:
        stats = executor.statistics()
        row["compiled_on_nodes"] = stats.completed
        row["taken_back"] = stats.cancelled
        row["nodes_lost"] = stats.nodes_lost
        row["crashed"] = stats.crashed
        row["failed"] = stats.failed
        summary = probe.summary()
        hashes = summary.pop("hashes")
        row["per_task"] = summary
        row["node_files_here"] = len(set(hashes) & _cached_hashes())
        if watcher is not None:
            row["kill_signalled_at_s"] = watcher.at
            row["resends"] = summary["not_ok"].get("NodeLostError", 0)
        executor.shutdown()
        row["non_loopback_sockets"] = _non_loopback_here()
        client.close()
    return row


class _KillSignal:
    """Writes the marker once ``KILL_AFTER_RUNNING`` compiles (at most every slot) run on nodes."""

    def __init__(self, executor: Any, marker: Path) -> None:
        self.executor, self.marker, self.at = executor, marker, None
        self._thread = threading.Thread(target=self._watch, name="fleet-kill-signal", daemon=True)
        self._start = 0.0

    def start(self, start: float) -> None:
        self._start = start
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline:
            stats = self.executor.statistics()
            if stats.slots and stats.running >= min(KILL_AFTER_RUNNING, stats.slots):
                self.at = round(time.perf_counter() - self._start, 3)
                tmp = self.marker.with_suffix(".tmp")
                tmp.write_text(json.dumps({"running": stats.running}))
                tmp.replace(self.marker)
                return
            time.sleep(0.005)


def _p50(timing: Any) -> float:
    value = timing[0] if isinstance(timing, list | tuple) else timing
    return float(value)


def helion_run(mode: str, scheduler: str | None, configs: int, target: str) -> dict[str, Any]:
    """One Helion autotune of the matmul under ``mode``; its row."""
    import random

    import torch
    from helion.autotuner.metrics import register_post_autotune_hook
    from helion.autotuner.random_search import RandomSearch

    from benchmarks.helion_bench import SEED, _matmul
    from precompile_executor.helion import use

    random.seed(SEED)
    torch.manual_seed(SEED)
    row: dict[str, Any] = {"configs": configs, "jobs": HELION_JOBS}
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    args = (x, torch.randn_like(x))
    kernel = _matmul()
    settings = kernel.settings
    settings.autotune_precompile = "fork"
    settings.autotune_precompile_jobs = HELION_JOBS
    settings.autotune_random_seed = SEED
    settings.autotune_progress_bar = False
    settings.autotuner_fn = lambda bound, a, **kw: RandomSearch(bound, a, count=configs)
    metrics: list[Any] = []
    register_post_autotune_hook(metrics.append)
    client = executor = None
    with contextlib.ExitStack() as stack:
        if mode == "local":
            stack.enter_context(use())
        elif mode == "cluster":
            began = time.perf_counter()
            client, executor = _cluster_executor(str(scheduler), target)
            row["executor_start_s"] = round(time.perf_counter() - began, 3)
            stack.enter_context(use(executor))
        elif mode != "native":
            raise ValueError(f"unknown helion mode {mode!r}")
        mark("tune")
        start = time.perf_counter()
        best = kernel.autotune(args, force=True)
        row["autotune_s"] = round(time.perf_counter() - start, 3)
        mark("tuned")
    row["best"] = str(best)
    # The config itself, as Helion rebuilds it (helion.Config.from_json), for a later timing of
    # the modes' choices side by side.
    row["best_json"] = best.to_json() if hasattr(best, "to_json") else None
    if metrics:
        row["best_ms"] = metrics[-1].best_perf_ms
        row["configs_tested"] = metrics[-1].num_configs_tested
    torch.testing.assert_close(kernel(*args), args[0] @ args[1], rtol=2e-2, atol=2e-1)
    if executor is not None:
        stats = executor.statistics()
        row["compiled_on_nodes"] = stats.completed
        row["failed"] = stats.failed
        row["timed_out"] = stats.timed_out
        executor.shutdown()
        client.close()
    return row


def check_run(choices: list[str], alternations: int, configs: int, smoke: bool) -> dict[str, Any]:
    """The chosen-kernel check's body (a fresh interpreter, a cold Triton cache): each config of
    ``choices`` compiled and run once, untimed, then all timed with stock Triton's own benchmark
    (``Autotuner._bench``, hence the autotuner's ``do_bench``, as stock's tune times a config),
    one after another, ``alternations`` times. Returns config → its timings in ms."""
    import triton
    from triton.runtime.driver import driver

    from precompile_executor.examples.kernels import matmul_kernel

    every = gemm_configs(configs)
    named = {str(c): c for c in every}
    missing = [c for c in choices if c not in named]
    if missing:
        raise ValueError(f"not among the benchmark's first {configs} configs: {missing}")
    gpu, grid, args, _, bench = _gemm_inputs(smoke)
    # Every config, so that the first call tunes (a single config skips the tune); the tune's
    # prune step is replaced by the check, which then runs one config.
    kernel = triton.autotune(configs=every, key=["M", "N", "K"], do_bench=bench)(matmul_kernel.fn)
    times: dict[str, list[float]] = {c: [] for c in choices}

    def time_choices(kwargs: dict[str, Any]) -> list[Any]:
        # Autotuner.run's prune step, given the call's own keyword arguments (the grid, ...).
        for c in choices:
            kernel._bench(*args, config=named[c], **kwargs)  # the cold compile, untimed
        for _ in range(alternations):
            for c in choices:
                times[c].append(float(kernel._bench(*args, config=named[c], **kwargs)[0]))
        return [named[choices[0]]]

    kernel.prune_configs = time_choices
    previous = driver.__dict__.get("_active")
    if gpu is not None:
        driver.set_active(gpu)
    try:
        kernel[grid](*args)
    finally:
        if gpu is not None:
            driver.set_active(previous)
    return {"ms": times}


def child_main(scenario: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """The run's body in this fresh interpreter: its row (the parent adds the process time)."""
    mark("main")
    if scenario in ("gemm", "node-loss"):
        row = gemm_run(mode, args.scheduler, args.configs, args.cpu_smoke, args.target)
    else:
        row = helion_run(mode, args.scheduler, args.helion_configs, args.target)
    mark("done")
    row["marks"] = dict(_MARKS)
    return row


# -- the cluster (the parent) --------------------------------------------------------------------


class LoopbackCluster:
    """A dask scheduler and ``nodes`` dask workers, each its own process, all on 127.0.0.1,
    CUDA hidden from every one of them. ``close()`` stops them all."""

    def __init__(self, workdir: Path, nodes: int, threads: int) -> None:
        self.workdir, self.nodes, self.threads = workdir, nodes, threads
        self.env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        self.env["DASK_DISTRIBUTED__WORKER__DAEMON"] = "False"  # docs/dask.md, "Starting a cluster"
        self.scheduler: subprocess.Popen[bytes] | None = None
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.address = ""
        self.client: Any = None

    def _spawn(self, argv: list[str], log: str, niceness: int = 0) -> subprocess.Popen[bytes]:
        with open(self.workdir / log, "ab") as out:
            proc = subprocess.Popen(
                ["nice", "-n", str(niceness), sys.executable, "-m", *argv],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C at the terminal reaches the parent only
            )
        return proc

    def start(self) -> None:
        """Start the scheduler and the workers; wait until every node has joined."""
        from distributed import Client

        info = self.workdir / "scheduler.json"
        self.scheduler = self._spawn(
            ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(info)],
            "scheduler.log",
        )  # fmt: skip
        deadline = time.monotonic() + CLUSTER_START_TIMEOUT_S
        while not self.address:
            if self.scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the dask scheduler did not start; see {info.parent}")
            with contextlib.suppress(OSError, ValueError, KeyError):  # not there, or half written
                self.address = json.loads(info.read_text())["address"]
            time.sleep(0.05)
        if not self.address.startswith("tcp://127.0.0.1:"):
            raise RuntimeError(f"the scheduler listens on {self.address}, not on 127.0.0.1")
        for i in range(self.nodes):
            self.start_worker(i)
        self.client = Client(self.address, timeout=CONNECT_TIMEOUT_S)
        self.client.wait_for_workers(self.nodes, timeout=CLUSTER_START_TIMEOUT_S)

    def start_worker(self, i: int) -> None:
        """Start node ``i`` (a dask worker without a nanny: the process killed is the node)."""
        self.workers[i] = self._spawn(
            ["distributed.cli.dask_worker", self.address, "--no-nanny", "--host", "127.0.0.1",
             "--nthreads", str(self.threads), "--name", f"node-{i}",
             "--dashboard-address", "127.0.0.1:0",
             "--memory-limit", "0", "--death-timeout", "60",
             "--local-directory", str(self.workdir / f"node-{i}")],
            f"node-{i}.log",
            NODE_NICENESS,
        )  # fmt: skip

    def kill_worker(self, i: int) -> int:
        """SIGKILL node ``i``'s dask worker (its pool's workers die with it); return its pid."""
        proc = self.workers[i]
        proc.kill()
        proc.wait(timeout=TEARDOWN_S)
        return proc.pid

    def restart_worker(self, i: int) -> None:
        """Start node ``i`` again, once the scheduler has dropped the old one (a worker joining
        under a name still registered is refused), and wait until the scheduler has every node."""
        deadline = time.monotonic() + CLUSTER_START_TIMEOUT_S
        while len(self.client.nthreads()) >= self.nodes:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the scheduler still lists the killed node-{i}")
            time.sleep(0.1)
        self.start_worker(i)
        while len(self.client.nthreads()) != self.nodes or self.worker_pid(i) is None:
            if self.workers[i].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"node-{i} did not rejoin (exit status {self.workers[i].poll()}); see "
                    f"{self.workdir}/node-{i}.log"
                )
            time.sleep(0.1)

    def worker_pid(self, i: int) -> int | None:
        """The pid the scheduler's node ``i`` reports (None until it has joined)."""
        found = self.client.run(os.getpid, on_error="return")
        pid = self.workers[i].pid
        return pid if pid in found.values() else None

    def warm(self, target: str) -> dict[str, Any]:
        """Start every node's pool as the runs' executors build it (:func:`node_initializer`);
        it stays warm for the next executor with the same initializer. Returns pids and time."""
        from precompile_executor.dask import DaskPrecompileExecutor
        from precompile_executor.triton import classify

        began = time.perf_counter()
        with DaskPrecompileExecutor(
            self.client, timeout=COMPILE_TIMEOUT_S, classify=classify, **node_initializer(target)
        ) as executor:
            pids = executor.warm_up(timeout=CLUSTER_START_TIMEOUT_S)
            # One task per slot through the whole task path (client, scheduler, node, pool):
            # a standing cluster has run tasks before; the first ever pays dask's cold path.
            slots = executor.statistics().slots
            for f in [executor.submit(os.getpid) for _ in range(slots)]:
                f.result(timeout=CLUSTER_START_TIMEOUT_S)
        return {"pool_pids": pids, "warm_s": round(time.perf_counter() - began, 2)}

    def processes(self) -> list[psutil.Process]:
        """The cluster's processes now: scheduler, workers and every descendant of theirs."""
        found = []
        for proc in [self.scheduler, *self.workers.values()]:
            if proc is None or proc.poll() is not None:
                continue
            try:
                root = psutil.Process(proc.pid)
                found += [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
        return found

    def describe(self) -> dict[str, Any]:
        """Addresses, what each node sees of CUDA, and every socket not on 127.0.0.1."""
        bad, listening = [], []
        for proc in [psutil.Process(), *self.processes()]:
            try:
                conns = proc.net_connections(kind="inet")
                name = proc.name()
            except psutil.Error:
                continue
            for c in conns:
                if c.status == psutil.CONN_LISTEN:
                    listening.append(f"{name}:{proc.pid} {c.laddr.ip}:{c.laddr.port}")
                for addr in (c.laddr, c.raddr):
                    if addr and addr.ip not in LOOPBACK:
                        bad.append(f"{name} (pid {proc.pid}): {c.status} {c.laddr} -> {c.raddr}")
        return {
            "scheduler": self.address,
            "cluster_pids_on_the_gpu": _on_the_gpu({p.pid for p in self.processes()}),
            "nodes": self.client.nthreads(),
            "cuda_visible_devices": self.client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES")),
            "listening": listening,
            "non_loopback_sockets": bad,
        }

    def close(self) -> None:
        """Stop the workers, then the scheduler (a worker closes talking to it): SIGTERM, then
        SIGKILL of its group after ``TEARDOWN_S``."""
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close(timeout=10)
        for wave in (list(self.workers.values()), [self.scheduler]):
            for proc in wave:
                if proc is not None and proc.poll() is None:
                    proc.terminate()
            for proc in wave:
                if proc is None:
                    continue
                try:
                    proc.wait(timeout=TEARDOWN_S)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=TEARDOWN_S)


def _on_the_gpu(pids: set[int]) -> list[int] | None:
    """Which of ``pids`` hold a CUDA context, by ``nvidia-smi`` (None: no ``nvidia-smi``)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted(pids & {int(p) for p in out.split() if p.isdigit()})


def become_subreaper() -> bool:
    """Make orphans of this process's descendants its children (Linux), so the final check sees
    every process the benchmark started, even one whose parent died first."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def leftovers(wait_s: float) -> list[str]:
    """This process's descendants still alive after ``wait_s`` (zombies are reaped, not counted)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(proc.pid, os.WNOHANG)
                    continue
                alive.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            except psutil.Error:
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def run_one(
    scenario: str,
    mode: str,
    args: argparse.Namespace,
    cluster: LoopbackCluster | None,
    scratch: Path,
    more: bool,
) -> dict[str, Any]:
    """Run one scenario in a fresh interpreter with a cold Triton cache; its row. After a node
    loss, node 0 is started again, and warmed if ``more`` runs follow."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{scenario}-{mode}-", dir=scratch))
    out = run_dir / "row.json"
    marker = run_dir / "kill-now"
    env = dict(os.environ, TRITON_CACHE_DIR=str(run_dir / "triton-cache"), HELION_SKIP_CACHE="1")
    env.pop(KILL_MARKER_ENV, None)
    if scenario == "node-loss":
        env[KILL_MARKER_ENV] = str(marker)
    cmd = [sys.executable, "-m", "benchmarks.fleet_bench", "--child", scenario, mode,
           "--json", str(out), "--target", args.target, "--configs", str(args.configs),
           "--helion-configs", str(args.helion_configs)]  # fmt: skip
    if cluster is not None:
        cmd += ["--scheduler", cluster.address]
    if args.cpu_smoke:
        cmd.append("--cpu-smoke")
    row: dict[str, Any] = {"scenario": scenario, "mode": mode, "spawned_at": time.time()}
    start = time.perf_counter()
    with open(run_dir / "output.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        killed = timed_out = False
        try:
            if scenario != "node-loss" or cluster is None:
                try:
                    proc.wait(timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    timed_out = True
            else:
                deadline = start + args.timeout
                while proc.poll() is None and not (timed_out := time.perf_counter() > deadline):
                    if not killed and marker.exists():
                        row["killed_pid"] = cluster.kill_worker(0)
                        row["killed_at_s"] = round(time.perf_counter() - start, 3)
                        killed = True
                    time.sleep(0.005)
            ended = time.perf_counter()
            row["exited_at"] = time.time()
        finally:  # a time-out, or the parent interrupted: the run goes with all it started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # anything it left behind
            proc.wait()
    row["process_s"] = round(ended - start, 3)
    if out.exists():
        row.update(json.loads(out.read_text()))
    else:
        tail = (run_dir / "output.log").read_text(errors="replace").strip().splitlines()[-20:]
        row["error"] = "timed out" if timed_out else "\n".join(tail) or f"rc {proc.returncode}"
    if scenario == "node-loss" and cluster is not None:
        if killed:
            cluster.restart_worker(0)
        if more:
            row["rewarm"] = cluster.warm(args.target)
    shutil.rmtree(run_dir, ignore_errors=True)
    return row


def _run_label(row: dict[str, Any]) -> str:
    return f"{row['scenario']} {row['mode']} (round {row.get('round')})"


def chosen_check(
    rows: list[dict[str, Any]], args: argparse.Namespace, scratch: Path
) -> list[dict[str, Any]]:
    """The chosen-kernel check of the GEMM's runs, in one more fresh interpreter: its rows, one
    per config some run chose (or one saying why it did not run). On GPU it runs only when the
    runs chose different configs; the smoke runs it anyway, for its plumbing."""
    chosen: dict[str, list[str]] = {}  # config -> the runs that chose it
    for r in rows:
        if r["scenario"] in ("gemm", "node-loss") and "best" in r:
            chosen.setdefault(r["best"], []).append(_run_label(r))
    base = {"scenario": "check", "mode": "gemm"}
    if not chosen:
        return []
    if len(chosen) < 2 and not args.cpu_smoke:
        return [{**base, "skipped": "every run chose the same config", "config": next(iter(chosen)),
                 "chosen_by": next(iter(chosen.values()))}]  # fmt: skip
    run_dir = Path(tempfile.mkdtemp(prefix="check-", dir=scratch))
    choices, out = run_dir / "choices.json", run_dir / "check.json"
    choices.write_text(json.dumps(sorted(chosen)))
    env = dict(os.environ, TRITON_CACHE_DIR=str(run_dir / "triton-cache"))
    cmd = [sys.executable, "-m", "benchmarks.fleet_bench", "--check", str(choices),
           "--json", str(out), "--alternations", str(args.alternations),
           "--configs", str(args.configs), "--target", args.target]  # fmt: skip
    if args.cpu_smoke:
        cmd.append("--cpu-smoke")
    start = time.perf_counter()
    timed_out = False
    with open(run_dir / "output.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    process_s = round(time.perf_counter() - start, 3)
    if not out.exists():
        tail = (run_dir / "output.log").read_text(errors="replace").strip().splitlines()[-20:]
        error = "timed out" if timed_out else "\n".join(tail) or f"rc {proc.returncode}"
        return [{**base, "error": error, "process_s": process_s}]
    times: dict[str, list[float]] = json.loads(out.read_text())["ms"]
    shutil.rmtree(run_dir, ignore_errors=True)
    medians = {c: statistics.median(ms) if ms else None for c, ms in times.items()}
    reference = "local" if args.cpu_smoke else "stock"
    refs = [r["best"] for r in rows if r["scenario"] == "gemm" and r["mode"] == reference
            and "best" in r]  # fmt: skip
    theirs = medians.get(refs[-1]) if refs else None
    return [
        {**base, "config": config, "chosen_by": chosen[config],
         "ms_median": None if m is None else round(m, 5), "ms": times[config],
         f"vs_{reference}_choice": round(m / theirs, 4) if m is not None and theirs else None,
         "alternations": args.alternations, "process_s": process_s}
        for config, m in medians.items()
    ]  # fmt: skip


def _check_line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"chosen-kernel check FAILED: {row['error'][-400:]}"
    if "skipped" in row:
        return f"chosen-kernel check skipped: {row['skipped']}"
    ratio = next((f", {v:.3f}× {k[3:-7]}'s choice" for k, v in row.items()
                  if k.startswith("vs_") and v is not None), "")  # fmt: skip
    return (f"chosen-kernel check {row['ms_median']:.4f} ms (median of {len(row['ms'])}"
            f"{ratio}) `{row['config']}`, chosen by {', '.join(row['chosen_by'])}")  # fmt: skip


# -- the report ----------------------------------------------------------------------------------


def _row_line(row: dict[str, Any]) -> str:
    head = f"{row['scenario']:9} {row['mode']:8} process {row['process_s']:7.2f}s"
    if "error" in row:
        return f"{head} FAILED: {row['error'][-400:]}"
    if "first_call_s" in row:
        head += f", first call {row['first_call_s']:.2f}s"
    if "autotune_s" in row:
        head += f", autotune {row['autotune_s']:.2f}s"
    per_task = row.get("per_task") or {}
    if per_task.get("per_task_cost") is not None:
        head += f", per-task cost {per_task['per_task_cost']:.2%}"
    return f"{head}, best {row.get('best')}"


def _stock_time(rows: list[dict[str, Any]], config: str) -> tuple[float | None, float | None]:
    """Stock's timing of ``config`` and stock's best timing (the last stock gemm run)."""
    stock = [r for r in rows if r["scenario"] == "gemm" and r["mode"] == "stock" and "best" in r]
    if not stock:
        return None, None
    timings = stock[-1]["timings_ms"]
    finite = [t for t in timings.values() if t < float("inf")]
    return timings.get(config), (min(finite) if finite else None)


def _per_task_text(per_task: dict[str, Any]) -> str:
    cost = per_task.get("per_task_cost")
    if cost is None:
        return "not measured"
    unqueued = per_task.get("per_task_cost_unqueued")
    text = (
        f"as measured {cost:.2%}: {per_task['extra_s']:.2f} s beside {per_task['compile_s']:.2f} s"
        f" of compiling over {per_task['tasks']} tasks (median {per_task['extra_ms_median']} ms, "
        f"max {per_task['extra_ms_max']} ms a task); summed over {per_task['split_tasks']} "
        f"tasks: dispatch to the node's start {per_task['to_node_s']} s"
    )
    if unqueued is not None:
        text += f" (of which waiting for a free slot on the node {per_task['queued_s']} s)"
    text += (
        f", on the node beside the compile {per_task['on_node_s']} s, back here and installed "
        f"{per_task['back_s']} s"
    )
    if per_task.get("running_at_dispatch") is not None:
        text += (
            f"; compiles running on the host at a dispatch: {per_task['running_at_dispatch']} on "
            f"average of {per_task['slots']} slots; median dispatch to the node's start "
            f"{per_task['to_node_ms_median_light']} ms sent while under half the slots ran, "
            f"{per_task['to_node_ms_median_heavy']} ms while more did "
            f"({per_task['tasks_light_heavy']} tasks)"
        )
    return text


def checks(
    rows: list[dict[str, Any]], smoke: bool, checked: list[dict[str, Any]] | None = None
) -> list[str]:
    """One line per acceptance check: MET, MISSED or n/a (``checked``: the chosen-kernel
    check's rows)."""
    lines = []
    checked = checked or []
    medians = {c["config"]: c["ms_median"] for c in checked if c.get("ms_median") is not None}

    def mark(ok: bool | None) -> str:
        return "n/a" if ok is None else ("MET" if ok else "MISSED")

    for r in rows:
        if "error" in r:
            lines.append(
                f"MISSED: {r['scenario']} {r['mode']} (round {r.get('round')}) ran to the end — "
                f"{r['error'][-200:]!r}"
            )
    for c in checked:
        if "error" in c:
            lines.append(f"MISSED: the chosen-kernel check ran to the end — {c['error'][-200:]!r}")
    reference = "local" if smoke else "stock"
    refs = [r for r in rows if r["scenario"] == "gemm" and r["mode"] == reference and "best" in r]
    for r in rows:
        if r["scenario"] not in ("gemm", "node-loss") or r["mode"] == reference or "best" not in r:
            continue
        # The reference run of the same round (rounds interleave), else the last one.
        ref = next(
            (x for x in refs if x.get("round") == r.get("round")), refs[-1] if refs else None
        )
        same = ref is not None and r["best"] == ref["best"]
        ok: bool | None = same if ref is not None else None
        note = "the same config" if same else "another config"
        if ref is not None and not same:
            mine, theirs = medians.get(r["best"]), medians.get(ref["best"])
            ok = None
            if mine is not None and theirs:
                ok = mine <= theirs * (1 + BEST_WITHIN)
                note += (
                    f": chosen-kernel check {mine:.4f} ms vs {theirs:.4f} ms, "
                    f"{mine / theirs:.3f}× {reference}'s choice"
                )
            else:
                note += ": no chosen-kernel check of both"
            if not smoke:  # each process's own timings differ by several %: not judged
                of_it, best = _stock_time(rows, r["best"])
                if of_it is not None and best:
                    note += f" (stock's own tune timed it {of_it / best:.3f}× its best)"
        lines.append(
            f"{mark(ok)}: {r['scenario']} {r['mode']} (round {r.get('round')}) best config as "
            f"fast as {reference}'s (within {BEST_WITHIN:.0%}) — {note}"
        )
        per_task = r.get("per_task") or {}
        # Judged without the queueing (none by the dispatcher's design; see DispatchProbe);
        # a row from before the split was recorded has only the figure as measured.
        cost = per_task.get("per_task_cost_unqueued", per_task.get("per_task_cost"))
        if r["mode"] == "cluster" and r["scenario"] == "gemm":
            # On the smoke's two shared cores the figure means nothing: shown, not judged.
            met = None if cost is None or smoke else cost < PER_TASK_COST_TARGET
            lines.append(
                f"{mark(met)}: gemm cluster per-task cost < {PER_TASK_COST_TARGET:.0%} of the "
                f"compile time moved, waits for a busy node's slot left out — "
                f"{'not measured' if cost is None else f'{cost:.2%}'}; "
                f"{_per_task_text(per_task)}"
            )
        if r["mode"] == "cluster":
            tasks = per_task.get("tasks", 0)
            lines.append(
                f"{mark(tasks > 0 and r.get('node_files_here') == tasks)}: {r['scenario']} "
                f"cluster: every compile from a node installed in the run's cache — "
                f"{r.get('node_files_here')} of {tasks}"
            )
            twice = r.get("compiled_on_nodes", 0) + r.get("compiled_here", 0)
            lines.append(
                f"{mark(twice <= r['configs'])}: {r['scenario']} cluster: no config compiled "
                f"again here (each launch found its node's files) — {r.get('compiled_on_nodes')} "
                f"on nodes + {r.get('compiled_here')} here of {r['configs']} configs"
            )
            lines.append(
                f"{mark(not r.get('non_loopback_sockets'))}: {r['scenario']} cluster: the run's "
                f"sockets on 127.0.0.1 only — {r.get('non_loopback_sockets') or 'none other'}"
            )
        if r["scenario"] == "node-loss":
            lines.append(
                f"{mark(bool(r.get('killed_pid')) and r.get('nodes_lost') == 1)}: node-loss: "
                f"node 0 killed at {r.get('killed_at_s')} s, nodes lost "
                f"{r.get('nodes_lost')}, compiles sent again {r.get('resends')}"
            )
    helion = {r["mode"]: r for r in rows if r["scenario"] == "helion" and "best" in r}
    for mode in ("local", "cluster"):
        if mode in helion and "native" in helion:
            same = helion[mode]["best"] == helion["native"]["best"]
            mine, native = helion[mode].get("best_ms"), helion["native"].get("best_ms")
            ratio = mine / native if mine and native else None
            lines.append(
                f"{mark(same or (ratio is not None and ratio <= 1 + BEST_WITHIN))}: helion "
                f"{mode} best config as native's — {'the same' if same else 'another'}"
                + ("" if ratio is None else f", its time {ratio:.3f}× native's best")
            )
    return lines


def report(
    rows: list[dict[str, Any]],
    info: dict[str, Any],
    smoke: bool,
    checked: list[dict[str, Any]] | None = None,
) -> str:
    """The Markdown report of every run so far (``checked``: the chosen-kernel check's rows)."""
    lines = [f"Compile on CPU nodes: {info['stamp']}", ""]
    cluster = info.get("cluster", {})
    lines += [
        f"Cluster: scheduler {cluster.get('scheduler')}, nodes {cluster.get('nodes')} "
        f"(CUDA_VISIBLE_DEVICES {cluster.get('cuda_visible_devices')}), sockets off 127.0.0.1: "
        f"{cluster.get('non_loopback_sockets') or 'none'}; node pools warmed in "
        f"{info.get('warm', {}).get('warm_s')} s.",
        "",
    ]

    def process_of(scenario: str, mode: str) -> float | None:
        got = [r["process_s"] for r in rows
               if r["scenario"] == scenario and r["mode"] == mode and "error" not in r]  # fmt: skip
        return sorted(got)[len(got) // 2] if got else None

    lines += [
        "| scenario | mode | process s | first call / autotune s | process vs stock or native "
        "| vs local | on nodes or workers / here | per-task cost | best config |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['scenario']} | {r['mode']} | {r['process_s']:.1f} | failed: "
                         f"{r['error'][-200:]!r} ||||||")  # fmt: skip
            continue
        base = process_of(r["scenario"] if r["scenario"] != "node-loss" else "gemm",
                          "native" if r["scenario"] == "helion" else "stock")  # fmt: skip
        local = process_of(r["scenario"] if r["scenario"] != "node-loss" else "gemm", "local")
        inner = r.get("first_call_s", r.get("autotune_s"))
        where = r.get("compiled_on_nodes", r.get("compiled_in_workers", ""))
        here = r.get("compiled_here", "")
        per_task = r.get("per_task") or {}
        cost = per_task.get("per_task_cost")
        cells = [
            "" if inner is None else f"{inner:.2f}",
            "" if base is None else f"{r['process_s'] / base:.3f}",
            "" if local is None else f"{r['process_s'] / local:.3f}",
            f"{where} / {here}",
            "" if cost is None else f"{cost:.2%}",
        ]
        lines.append(
            f"| {r['scenario']} | {r['mode']} | {r['process_s']:.1f} | {' | '.join(cells)} | "
            f"`{r.get('best')}` |"
        )
    timed = [(r, p) for r in rows if "error" not in r and (p := phases(r)) is not None]
    if timed:
        lines += ["", "Where each process's time goes (s):", "",
                  "| scenario | mode | " + " | ".join(PHASES) + " |",
                  "|---|---|" + "---|" * len(PHASES)]  # fmt: skip
        lines += [f"| {r['scenario']} | {r['mode']} | "
                  + " | ".join(f"{p[name]:.2f}" for name in PHASES) + " |"
                  for r, p in timed]  # fmt: skip
    if checked:
        lines += ["", "Chosen-kernel check (one fresh process, stock Triton's `do_bench`, the "
                  "configs timed one after another, median ms):", ""]  # fmt: skip
        lines += [f"* {_check_line(c)}" for c in checked]
    lines += ["", "Checks:", ""] + [f"* {line}" for line in checks(rows, smoke, checked)]
    return "\n".join(lines) + "\n"


def _stamp(args: argparse.Namespace) -> str:
    import importlib.metadata
    import platform

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        gpu = ""
    return (
        f"{gpu or 'no GPU'}, {os.cpu_count()} cores, Python {platform.python_version()}, torch "
        f"{version('torch')}, Triton {version('triton')}, helion {version('helion')}, dask "
        f"{version('dask')}, distributed {version('distributed')}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"`python -m benchmarks.fleet_bench {' '.join(sys.argv[1:])}`"
    )


def gpu_target() -> str:
    """This machine's GPU as a Triton target (``cuda:90``), from ``nvidia-smi``: the parent opens
    no CUDA context of its own."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    major, minor = out.split()[0].split(".")
    return f"cuda:{major}{minor}"


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM (``timeout``'s) unwinds like Ctrl-C, so the cluster is still torn down."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """Run the plan and write the rows and the report; 0 when every check passed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path("bench-out/fleet"))
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds of the plan")
    parser.add_argument("--only", default="", help="scenarios, comma-separated (default: all)")
    parser.add_argument("--modes", default="", help="modes, comma-separated (default: all)")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="per run, seconds")
    parser.add_argument("--cpu-smoke", action="store_true", help="no GPU: the plumbing only")
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--node-threads", type=int, default=None)
    parser.add_argument("--configs", type=int, default=None, help="gemm configs (at most 48)")
    parser.add_argument("--helion-configs", type=int, default=HELION_CONFIGS)
    parser.add_argument("--alternations", type=int, default=ALTERNATIONS,
                        help="rounds of the chosen-kernel check (0: no check)")  # fmt: skip
    parser.add_argument("--target", default=None, help="default: this GPU's (cuda:90 smoke)")
    parser.add_argument("--scheduler", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=2, metavar=("SCENARIO", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--check", type=Path, metavar="CHOICES", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.configs is None:
        args.configs = SMOKE_CONFIGS if args.cpu_smoke else GEMM_CONFIGS
    if args.check:
        choices = json.loads(args.check.read_text())
        result = check_run(choices, args.alternations, args.configs, args.cpu_smoke)
        args.json.write_text(json.dumps(result))
        return 0
    if args.child:
        row = child_main(args.child[0], args.child[1], args)
        args.json.write_text(json.dumps(row))
        return 0
    if args.target is None:
        args.target = "cuda:90" if args.cpu_smoke else gpu_target()
    threads = args.node_threads or (SMOKE_NODE_THREADS if args.cpu_smoke else NODE_THREADS)
    plan = [
        (s, m)
        for s, m in (SMOKE_PLAN if args.cpu_smoke else PLAN)
        if (not args.only or s in args.only.split(","))
        and (not args.modes or m in args.modes.split(","))
    ]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    runs_path = args.out_dir / "fleet-runs.jsonl"
    report_path = args.out_dir / "fleet-bench.md"
    subreaper = become_subreaper()
    info: dict[str, Any] = {"stamp": _stamp(args), "subreaper": subreaper}
    rows: list[dict[str, Any]] = []
    checked: list[dict[str, Any]] = []
    scratch = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    started = time.perf_counter()
    needs_cluster = any(m == "cluster" for _, m in plan)
    cluster = LoopbackCluster(scratch, args.nodes, threads) if needs_cluster else None
    interrupted = False
    try:
        with _sigterm_exits():
            if cluster is not None:
                cluster.start()
                info["warm"] = cluster.warm(args.target)
                info["cluster"] = cluster.describe()
                stamp = f"[{time.perf_counter() - started:6.1f}s]"
                print(f"{stamp} cluster {json.dumps(info['cluster'])}; warm {info['warm']}")
            for round_ in range(args.rounds):  # interleaved: a drifting machine moves all alike
                for i, (scenario, mode) in enumerate(plan):
                    more = round_ + 1 < args.rounds or i + 1 < len(plan)
                    row = run_one(scenario, mode, args, cluster, scratch, more)
                    row["round"] = round_ + 1
                    rows.append(row)
                    with open(runs_path, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    report_path.write_text(report(rows, info, args.cpu_smoke))
                    print(f"[{time.perf_counter() - started:6.1f}s] round {round_ + 1} "
                          f"{_row_line(row)}", flush=True)  # fmt: skip
            if args.alternations > 0:
                for row in chosen_check(rows, args, scratch):
                    checked.append(row)
                    with open(runs_path, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    report_path.write_text(report(rows, info, args.cpu_smoke, checked))
                    print(f"[{time.perf_counter() - started:6.1f}s] {_check_line(row)}",
                          flush=True)  # fmt: skip
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: tearing the cluster down", flush=True)
    finally:
        if cluster is not None:
            if "cluster" in info:  # sockets once more, after every run
                with contextlib.suppress(Exception):
                    info["cluster_after"] = cluster.describe()
            cluster.close()
        info["left_behind"] = leftovers(TEARDOWN_S)
        info["cluster_logs"] = {  # their ends, for a reader of a failed run
            log.name: log.read_text(errors="replace").splitlines()[-30:]
            for log in sorted(scratch.glob("*.log"))
        }
        shutil.rmtree(scratch, ignore_errors=True)
    text = report(rows, info, args.cpu_smoke, checked)
    after = info.get("cluster_after", {})
    on_gpu = after.get("cluster_pids_on_the_gpu")
    lines = [
        f"* {'n/a' if on_gpu is None else 'MISSED' if on_gpu else 'MET'}: no cluster process "
        f"holds a CUDA context after the runs (nvidia-smi) — {on_gpu if on_gpu else 'none'}",
        f"* {'MET' if not after.get('non_loopback_sockets') else 'MISSED'}: every cluster "
        f"socket on 127.0.0.1 after the runs — {after.get('non_loopback_sockets') or 'none other'}",
        f"* {'MET' if not info['left_behind'] else 'MISSED'}: no process left after the teardown "
        f"— {info['left_behind'] or 'none'} (subreaper: {subreaper})",
    ]
    text += "\n".join(lines) + "\n"
    report_path.write_text(text)
    (args.out_dir / "fleet-info.json").write_text(json.dumps(info, indent=1))
    print(text)
    print(f"whole run: {time.perf_counter() - started:.0f} s")
    failed = interrupted or any("MISSED" in line for line in text.splitlines())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
