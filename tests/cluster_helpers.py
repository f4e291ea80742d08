"""The cases both cluster backends run (``test_dask.py``, ``test_ray.py``), each on the real
nodes of its own local cluster.

A backend's test passes ``make``: its executor class with the backend's own arguments bound
(``functools.partial(DaskPrecompileExecutor, client)``), called here with the settings the case
needs; and, where a case checks that no node process died, ``node_pids``: the pids of the
processes a node's pools live in (the dask workers, the Ray node actors), node → pid.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import BrokenExecutor
from pathlib import Path
from typing import Any

import crashers
import pytest
from kernel_helpers import ADD_GELU_OPTIONS, add_gelu_signature
from test_faults import _assert_gone, submit_fault

from precompile_executor import WorkerCrashedError, kill_running_futures

WAIT_S = 60.0
"""Longest any single wait in these tests may take."""

Make = Callable[..., Any]
"""A backend's executor class, its own arguments bound: ``make(**settings)`` → an executor."""

NodePids = Callable[[], dict[str, int]]

BAD_SETTINGS: list[tuple[dict[str, Any], type, str]] = [
    # (settings, error, match): what every cluster backend refuses at construction
    ({"max_workers_per_node": 0}, ValueError, "max_workers_per_node must be >= 1"),
    ({"max_workers_per_node": 1.5}, TypeError, "max_workers_per_node must be an int"),
    ({"timeout": 0}, ValueError, "timeout must be > 0"),
    ({"initializer": 3}, TypeError, "initializer must be callable"),
    ({"initargs": [1]}, TypeError, "initargs must be a tuple"),
    ({"classify": "warn"}, TypeError, "classify must be callable"),
    ({"memory_limit": 0}, ValueError, "memory_limit must be >= 1 byte"),
]


def runs(log: Path) -> list[int]:
    """The numbers ``crashers.square_and_log`` wrote to ``log``: one line per run."""
    return sorted(int(line) for line in log.read_text().split()) if log.exists() else []


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert condition()


def a_slow_done_callback_does_not_hold_back_other_outcomes(make: Make, tmp_path: Path) -> None:
    """A cluster client runs every done-callback on one thread; the executor resolves finished
    tasks on resolver threads of its own (``_cluster_state.RESOLVERS``), so one slow callback (a
    compile's files being installed, a user's callback) does not make every later future wait."""
    release = tmp_path / "release-first"
    other_done = threading.Event()
    slow_returned = threading.Event()
    waited: list[bool] = []

    def slow(_: object) -> None:
        waited.append(other_done.wait(10))
        slow_returned.set()

    with make() as ex:
        # The first task finishes only once its callback is attached: a callback attached to a
        # done future runs at once on this thread, which would then wait for a task not sent yet.
        first = ex.submit(crashers.wait_for_file, str(release), WAIT_S)
        first.add_done_callback(slow)
        release.touch()
        assert first.result(timeout=WAIT_S) is True
        second = ex.submit(time.sleep, 0)
        second.add_done_callback(lambda _: other_done.set())
        assert second.result(timeout=WAIT_S) is None
        assert other_done.wait(WAIT_S)
    # shutdown() does not wait for the resolver threads (``ClusterState.run``: a done-callback
    # may itself shut the executor down), so the slow callback may still be between its wait
    # and its append here.
    assert slow_returned.wait(WAIT_S)
    assert waited == [True]


def fault_fails_alone(
    make: Make,
    node_pids: NodePids,
    fault: tuple[str, Callable[..., Any], Callable[[BaseException], None], bool],
    tmp_path: Path,
) -> None:
    """One fault of ``test_faults.FAULTS`` fails alone on a node, as on one machine: the eight
    innocent tasks around it run once each, and no node process dies."""
    name, task, check, needs_timeout = fault
    log = tmp_path / "runs.log"
    with make(max_workers_per_node=2) as executor:
        pids = node_pids()
        assert len(pids) == 2
        before = [executor.submit(crashers.square_and_log, i, str(log), 0.3) for i in range(3)]
        bad, pid_file = submit_fault(executor, task, needs_timeout, tmp_path)
        after = [executor.submit(crashers.square_and_log, i, str(log), 0.1) for i in range(3, 8)]

        error = bad.exception(timeout=WAIT_S)
        assert error is not None, f"{name} should have failed"
        check(error)  # the same proxy as on one machine
        assert [f.result(timeout=WAIT_S) for f in before + after] == [i * i for i in range(8)]
        stats = executor.statistics()
        assert (stats.failed, stats.completed, stats.nodes_lost) == (1, 8, 0)
    assert runs(log) == list(range(8))  # every innocent task ran, and ran once
    assert node_pids() == pids  # no node process died or was replaced
    if task is crashers.hang_with_grandchild:
        _assert_gone(int(pid_file.read_text()))


def cancel_after_dispatch_frees_the_slot(make_on_one_node: Make, tmp_path: Path) -> None:
    """A task dispatched to a node whose pool is still starting is PENDING there: cancel()
    works, the task never runs and its slot takes the next one."""
    log = tmp_path / "runs.log"

    def slow_start() -> None:
        time.sleep(3.0)  # the node's pool is still starting: a dispatched task waits there

    with make_on_one_node(initializer=slow_start, max_workers_per_node=1) as executor:
        doomed = executor.submit(crashers.square_and_log, 1, str(log))
        wait_until(lambda: executor.statistics().dispatched == 1)
        assert not doomed.running()  # on its node, not started: PENDING, so cancel() works
        assert doomed.cancel()
        survivor = executor.submit(crashers.square_and_log, 2, str(log))
        assert survivor.result(timeout=WAIT_S) == 4  # the slot was freed
        stats = executor.statistics()
        assert (stats.cancelled, stats.completed, stats.failed) == (1, 1, 0)
    assert runs(log) == [2]  # the cancelled task never ran


def running_means_running_on_a_node(make_on_one_node: Make, tmp_path: Path) -> None:
    """``running()`` only once the node's pool started the task; a queued one still cancels."""
    log = tmp_path / "runs.log"
    with make_on_one_node(max_workers_per_node=1) as executor:
        executor.warm_up(timeout=WAIT_S)
        busy = executor.submit(crashers.square_and_log, 1, str(log), 1.0)
        queued = executor.submit(crashers.square_and_log, 2, str(log))
        pending = executor.submit(crashers.square_and_log, 3, str(log))
        wait_until(busy.running)
        assert not queued.running() and not pending.running()
        assert not busy.cancel()  # running: too late, as with the stdlib
        stats = executor.statistics()
        assert (stats.running, stats.queued) == (1, 2)
        assert pending.cancel()  # still in the caller's queue
        assert queued.result(timeout=WAIT_S) == 4
        assert busy.result(timeout=WAIT_S) == 1
        assert executor.statistics().cancelled == 1
    assert runs(log) == [1, 2]


def interrupt_kills_running_tasks(make: Make, node_pids: NodePids, tmp_path: Path) -> None:
    """``interrupt()`` kills what runs on the nodes (a grandchild too) and cancels the rest."""
    pid_file = tmp_path / "grandchild.pid"
    with make() as executor:
        pids = node_pids()
        hung = executor.submit(crashers.hang_with_grandchild, str(pid_file))
        queued = [executor.options(priority=-1).submit(time.sleep, 30) for _ in range(8)]
        wait_until(lambda: hung.running() and pid_file.exists())
        start = time.monotonic()
        executor.interrupt()
        error = hung.exception(timeout=WAIT_S)
        assert isinstance(error, WorkerCrashedError)
        assert "interrupted" in str(error)
        assert time.monotonic() - start < 10
        for f in queued:  # the started ones are killed, the others cancelled
            assert f.cancelled() or isinstance(f.exception(timeout=WAIT_S), WorkerCrashedError)
    _assert_gone(int(pid_file.read_text()))
    assert node_pids() == pids


def ctrl_c_in_wait_for_all_kills_tasks_on_nodes(make: Make, node_pids: NodePids) -> None:
    """``wait_for_all`` kills what still runs through ``kill_running_futures``, which reaches
    every backend of the process (docs/design.md, "A backend"): here a task looping on a node."""
    with make(max_workers_per_node=1) as executor:
        pids = node_pids()
        looping = executor.submit(crashers.python_loop)
        wait_until(looping.running)
        kill_running_futures([looping])
        assert isinstance(looping.exception(timeout=WAIT_S), WorkerCrashedError)
        assert executor.submit(abs, -3).result(timeout=WAIT_S) == 3
    assert node_pids() == pids


def initializer_and_window_reach_every_node(make: Make) -> None:
    def init(value: str) -> None:
        os.environ["PRECOMPILE_CLUSTER_INIT"] = value

    with make(initializer=init, initargs=("yes",), max_workers_per_node=1) as executor:
        assert sorted(executor.nodes().values()) == [1, 1]
        pids = executor.warm_up(timeout=WAIT_S)
        assert sorted(len(p) for p in pids.values()) == [1, 1]
        # a lambda: os.environ.get would carry this process's environment along
        got = executor.submit(lambda: os.environ.get("PRECOMPILE_CLUSTER_INIT")).result(WAIT_S)
        assert got == "yes"
        assert executor.statistics().slots == 2


def a_lost_nodes_in_flight_tasks_fail_alone(
    executor: Any, futures: list[Any], log: Path, node: str, error_type: type
) -> list[int]:
    """``node`` was lost holding two of ``futures`` (``crashers.square_and_log`` of 0..n-1 into
    ``log``): those two fail with ``error_type`` (a crash naming the node, not a broken
    executor), every other task ran exactly once, and the counters say so. Returns the
    indexes of the two lost tasks (whether they ran is the backend's to say)."""
    errors = [f.exception(timeout=WAIT_S) for f in futures]
    lost = [i for i, e in enumerate(errors) if e is not None]
    assert len(lost) == 2  # the node's two in-flight tasks, nothing else
    for i in lost:
        assert isinstance(errors[i], error_type)
        assert isinstance(errors[i], WorkerCrashedError)
        # One task failed; the executor goes on (see docs/design.md, Errors).
        assert not isinstance(errors[i], BrokenExecutor)
        assert node in str(errors[i])
    done = [i for i in range(len(futures)) if i not in lost]
    assert [futures[i].result() for i in done] == [i * i for i in done]
    ran = runs(log)
    assert [i for i in done if ran.count(i) != 1] == []  # the others ran exactly once
    stats = executor.statistics()
    assert (stats.completed, stats.failed, stats.nodes_lost) == (len(done), 2, 1)
    return lost


def options_refuse_the_fork_path(executor: Any) -> None:
    with pytest.raises(ValueError, match="cannot fork"):
        executor.options(path="fork")
    assert executor.options(path="spawn").submit(abs, -2).result(timeout=WAIT_S) == 2


def triton_compiles_on_two_nodes_are_cache_hits_here(
    make: Make, tmp_path: Path
) -> tuple[list[Any], Path]:
    """Four configs of a kernel compiled on the nodes (both of them), installed in the caller's
    cache (under ``tmp_path``): each identical to a compile here, and a cache hit when loaded
    here. Returns the compiled kernels and the caller's cache."""
    caller_cache = tmp_path / "caller-cache"
    triton = pytest.importorskip("triton")
    from triton import knobs
    from triton.compiler import ASTSource, CompiledKernel

    from precompile_executor.examples import kernels as examples
    from precompile_executor.triton import classify, parse_target, precompile

    kernel = examples.add_gelu_kernel.fn
    signature = add_gelu_signature("fp16")
    blocks = [256, 512, 1024, 2048]
    options = ADD_GELU_OPTIONS
    hits: list[tuple[str, bool]] = []

    def listener(
        *, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool
    ) -> None:
        hits.append((metadata["hash"], cache_hit))

    with knobs.cache.scope(), knobs.compilation.scope():
        knobs.cache.dir = str(caller_cache)
        knobs.compilation.listener = listener
        with make(timeout=120, classify=classify, max_workers_per_node=1) as executor:
            pool_pids = executor.warm_up(timeout=WAIT_S)
            jobs = [
                precompile(
                    kernel,
                    signature,
                    {"BLOCK_SIZE": b},
                    target="cuda:90",
                    options=options,
                    executor=executor,
                )
                for b in blocks
            ]
            compiled = [job.result(timeout=180) for job in jobs]
        assert all(isinstance(k, CompiledKernel) for k in compiled)
        by_node = {
            node: {j.artifacts.worker_pid for j in jobs if j.artifacts} & set(pids)
            for node, pids in pool_pids.items()
        }
        assert all(by_node.values()), f"both nodes should have compiled: {by_node}"
        assert hits == []  # nothing compiled in this process
        for b, kernel_b in zip(blocks, compiled, strict=True):
            assert all(
                Path(p).is_relative_to(caller_cache) for p in kernel_b.metadata_group.values()
            )
            again = triton.compile(
                ASTSource(kernel, signature, {"BLOCK_SIZE": b}),
                target=parse_target("cuda:90"),
                options=options,
            )
            assert again.asm["cubin"] == kernel_b.asm["cubin"]
    assert hits == [(k.hash, True) for k in compiled]  # every one a cache hit here
    return compiled, caller_cache


def warm_compiles_on_the_nodes_then_finds_them_cached(executor: Any) -> int:
    """``warm()`` compiles every config of a kernel on the nodes and installs them here (the
    caller's cache scope); a second ``warm()`` finds them all cached. Returns the count."""
    from precompile_executor.examples import kernels as examples
    from precompile_executor.triton import TensorSpec, launch, warm

    rows, cols = 64, 1000
    sx, sy = TensorSpec("fp16", (rows, cols)), TensorSpec("fp16", (rows, cols))
    specs = {examples.softmax_kernel: [launch(sy, sx, sx.stride(0), sy.stride(0), rows, cols)]}
    n_configs = len(examples.softmax_kernel.configs)
    report = warm(specs, target="cuda:90", executor=executor)
    assert [r.status for r in report.results] == ["ok"] * n_configs
    again = warm(specs, target="cuda:90", executor=executor)
    assert {r.status for r in again.results} == {"cached"}  # installed here
    assert executor.statistics().completed == n_configs
    return n_configs


def helion_fork_mode_compiles_on_the_nodes(
    executor: Any, node_caches: list[Path], tmp_path: Path
) -> None:
    """``helion.use(cluster_executor)`` in fork mode: each config's compile is taken from
    Helion's precompiler in this process (the call's specialization, the target of this
    process's compile-only sm_90 device) and runs on a node; the files come back into this
    process's ``TRITON_CACHE_DIR`` (not the nodes' caches), where Helion's own precompiler then
    finds each one (docs/helion.md, "On a cluster"). Spawn mode, which runs configs on a GPU, is
    refused saying what to do."""
    pytest.importorskip("helion")
    import test_helion as th
    from helion import exc as helion_exc
    from helion.autotuner.precompile_future import PrecompileFuture, _prepare_precompiler_for_fork
    from triton import knobs

    import precompile_executor.helion as peh
    from precompile_executor.helion._future import HelionFuture

    caller_cache = tmp_path / "triton"  # th._fork_batch's TRITON_CACHE_DIR
    hits: list[bool] = []

    def listener(
        *, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool
    ) -> None:
        hits.append(cache_hit)

    pool_pids = {p for pids in executor.warm_up(timeout=WAIT_S).values() for p in pids}
    with th._fork_batch(tmp_path) as (bound, args, ctx), peh.use(executor):
        configs = th._configs(bound, 4)
        futures = [th._create(ctx, bound, c, args) for c in configs]
        assert all(isinstance(f, HelionFuture) and f.path == "cluster" for f in futures)
        assert PrecompileFuture.wait_for_all(futures) == [True] * 4
        assert executor.statistics().completed == 4  # each on a node
        for f in futures:
            assert f.ok and f.failure_reason == "ok" and f.started
            assert f.process is not None and f.process.pid in pool_pids
        # Again, this process's memory forgotten: each is in its cache now, nothing is sent.
        for config in configs:
            th._jit(bound, config).device_caches.clear()
        again = [th._create(ctx, bound, c, args) for c in configs]
        assert all(isinstance(f, HelionFuture) and f.path == "cluster" for f in again)
        assert PrecompileFuture.wait_for_all(again) == [True] * 4
        assert all(f.job.cached and f.process is None and f.started for f in again)
        assert executor.statistics().completed == 4
        with knobs.compilation.scope():
            knobs.compilation.listener = listener
            for config in configs:
                decorator = bound.format_kernel_decorator(config, ctx.settings)
                finish_it = _prepare_precompiler_for_fork(
                    bound.compile_config(config), args, config, bound, decorator, ctx.log
                )
                assert finish_it is not None and finish_it() is True
        assert hits == [True] * 4  # Helion's own compile of each: a hit in this cache

        spawn = th._context(bound, args, autotune_precompile="spawn")
        with pytest.raises(helion_exc.AutotuneError) as refused:
            th._create(spawn, bound, configs[0], args)
    message = str(refused.value)
    assert "runs each config once on a GPU" in message and "autotune_precompile='fork'" in message
    metadata = [json.loads(p.read_text()) for p in caller_cache.rglob("*.json")]
    kernels = [m for m in metadata if "target" in m]
    assert len(kernels) == 4
    assert {(m["target"]["backend"], m["target"]["arch"]) for m in kernels} == {("cuda", 90)}
    node_files = [str(p) for c in node_caches if c.exists() for p in c.rglob("*")]
    assert not [f for f in node_files for m in kernels if m["hash"] in f]
