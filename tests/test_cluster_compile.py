"""Compile on CPU nodes: Triton compiles for the caller's target on a dask cluster, a node with
another Triton refused, ``precompile-executor warm --scheduler``, a node lost mid-batch.

The cluster (``cpu_nodes``) is a ``SpecCluster`` of three dask workers on 127.0.0.1: ``node-0``
and ``node-1`` have this process's Triton; ``node-2`` reports another version — a preload puts a
``triton-0.0.0.dist-info`` first on its ``sys.path``, so its ``importlib.metadata`` sees that
distribution while ``import triton`` still finds the real package (docs/dask.md, "Compile on CPU
nodes").
"""

from __future__ import annotations

import json
import logging
import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cluster_helpers as cases
import loopback
import pytest
from cluster_helpers import WAIT_S, wait_until
from conftest import NODE_THREADS, dask_spec_cluster
from kernel_helpers import ADD_GELU_OPTIONS, DOUBLE_KERNEL_FILE, add_gelu_signature

pytest.importorskip("distributed")
pytest.importorskip("triton")

from precompile_executor import cli  # noqa: E402
from precompile_executor._node_pool import triton_version  # noqa: E402
from precompile_executor.cli import EXIT_BAD_INPUT, EXIT_OK, main  # noqa: E402
from precompile_executor.dask import (  # noqa: E402
    DaskPrecompileExecutor,
    NodesRefusedError,
)

OTHER_TRITON = "0.0.0"
"""The Triton version ``node-2`` of the test cluster reports."""


@pytest.fixture(scope="module")
def cpu_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Yields ``(cluster, client, node_caches, other)``: ``other`` is ``node-2``'s address."""
    base = tmp_path_factory.mktemp("cpu-nodes")
    shadow = base / "other-triton"
    info = shadow / f"triton-{OTHER_TRITON}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: triton\nVersion: {OTHER_TRITON}\n"
    )
    # dask runs a preload's text as a module in the worker process at its start.
    preload = f"import sys; sys.path.insert(0, {str(shadow)!r})"

    def options(i: int) -> dict[str, Any]:
        return {"preload": [preload]} if i == 2 else {}

    with dask_spec_cluster(base, 3, options) as (cluster, client, caches):
        versions = client.run(triton_version)
        other = [a for a, v in versions.items() if v == OTHER_TRITON]
        assert len(other) == 1 and sorted(versions.values()).count(triton_version()) == 2
        yield cluster, client, caches, other[0]


def _on_loopback_only(cluster: Any) -> None:
    """Every socket of the scheduler (this process) and of the dask workers is on 127.0.0.1."""
    workers = [n.pid for n in cluster.workers.values() if getattr(n, "pid", None)]
    assert len(workers) == 3
    assert loopback.non_loopback_sockets([os.getpid(), *workers]) == []


@pytest.mark.timeout(120)
def test_a_node_with_another_triton_is_refused_and_told_why(
    cpu_nodes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cluster, client, caches, other = cpu_nodes
    here = triton_version()
    _on_loopback_only(cluster)
    with caplog.at_level(logging.WARNING, logger="precompile_executor"):
        with DaskPrecompileExecutor(client) as executor:
            assert len(executor.nodes()) == 2 and other not in executor.nodes()
            why = executor.refused_nodes()
            assert list(why) == [other]
            assert f"Triton {OTHER_TRITON}" in why[other] and f"Triton {here}" in why[other]
            assert other in why[other] and "require_same_triton=False" in why[other]
            assert executor.statistics().nodes_refused == 1
            # every task runs on the two nodes that have this Triton (a node's cache names it;
            # a lambda: os.environ.get would carry this process's environment along)
            seen = [executor.submit(lambda: os.environ["TRITON_CACHE_DIR"]) for _ in range(8)]
            assert {f.result(timeout=WAIT_S) for f in seen} <= {str(c) for c in caches[:2]}
    assert any(other in r.getMessage() and OTHER_TRITON in r.getMessage() for r in caplog.records)

    # Only the refused node: the task fails at once with the reason, rather than wait.
    with DaskPrecompileExecutor(client, workers=[other]) as stranded:
        error = stranded.submit(abs, -1).exception(timeout=WAIT_S)
        assert isinstance(error, NodesRefusedError)
        assert f"Triton {OTHER_TRITON}" in str(error) and f"Triton {here}" in str(error)
        assert error.refusals == {other: stranded.refused_nodes()[other]}
        stats = stranded.statistics()
        assert (stats.failed, stats.nodes, stats.nodes_refused) == (1, 0, 1)
    # The opt-out, for work that compiles no Triton kernel.
    with DaskPrecompileExecutor(client, workers=[other], require_same_triton=False) as anyway:
        assert anyway.nodes() == {other: NODE_THREADS} and anyway.refused_nodes() == {}
        assert anyway.submit(abs, -1).result(timeout=WAIT_S) == 1
    with pytest.raises(TypeError, match="require_same_triton must be a bool"):
        DaskPrecompileExecutor(client, require_same_triton="yes")


@pytest.mark.timeout(240)
def test_warm_with_scheduler_fills_this_machines_cache_for_the_given_target(
    cpu_nodes: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``precompile-executor warm --scheduler`` compiles on the nodes for the caller's
    ``--target`` (sm_80 here, which no node could pick for itself: none has a GPU) and the
    files land in ``--cache-dir`` on this machine, not in the nodes' caches."""
    cluster, _, node_caches, other = cpu_nodes
    module = tmp_path / "cluster_kernels.py"
    module.write_text(textwrap.dedent(DOUBLE_KERNEL_FILE))
    cache = tmp_path / "cache"
    argv = ["warm", str(module), "--target", "cuda:80", "--cache-dir", str(cache)]
    with caplog.at_level(logging.WARNING, logger="precompile_executor"):
        status = main([*argv, "--scheduler", cluster.scheduler_address, "--jobs", "1"])
    assert status == EXIT_OK
    assert any(other in r.getMessage() for r in caplog.records)  # node-2 refused, and said so
    metadata = [json.loads(p.read_text()) for p in cache.rglob("double_kernel.json")]
    assert len(metadata) == 3
    assert {(m["target"]["backend"], m["target"]["arch"]) for m in metadata} == {("cuda", 80)}
    hashes = {m["hash"] for m in metadata}
    node_files = [str(p) for c in node_caches if c.exists() for p in c.rglob("*")]
    assert not [f for f in node_files for h in hashes if h in f]
    # the same command again: everything is in this machine's cache now
    assert main([*argv, "--scheduler", cluster.scheduler_address]) == EXIT_OK
    assert len(list(cache.rglob("__grp__double_kernel.json"))) == 3


@pytest.mark.timeout(60)
def test_warm_with_an_unreachable_scheduler_is_bad_input_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "SCHEDULER_CONNECT_TIMEOUT_S", 2.0)  # nothing listens: no wait
    argv = ["warm", "precompile_executor.examples.kernels", "--target", "cuda:90"]
    assert main([*argv, "--scheduler", "tcp://127.0.0.1:9"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not reach the dask scheduler tcp://127.0.0.1:9" in err[0]


# -- @triton.autotune with a cluster executor -------------------------------------------------


def _good_nodes(client: Any, other: str) -> list[str]:
    """The nodes with this process's Triton, once all three are up (the nanny restarts a killed
    one under a new address)."""
    wait_until(lambda: len(client.nthreads()) == 3)
    return sorted(a for a in client.nthreads() if a != other)


def _autotune_double(executor: Any, caller_cache: Path) -> tuple[Any, Any, Any]:
    """Autotune ``test_triton_autotune.double_jit``'s five configs on a dry-run sm_90 GPU through
    ``pe_autotune.use(executor)``, with ``caller_cache`` as this process's Triton cache. Returns
    ``(kernel, gpu, log)``: the autotuner, the dry-run GPU (its launches) and every compile this
    process ran itself (``log.compiled_blocks``)."""
    import test_triton_autotune as at
    import triton
    from triton import knobs
    from triton.runtime.driver import driver

    from precompile_executor.triton import autotune as pe_autotune

    gpu = at.DryRunGPU()
    log = at.CompileLog()
    bench = at.Bench(gpu, lambda launched: at.DOUBLE_TIMES_MS[launched["BLOCK"]])
    kernel = triton.autotune(configs=at.DOUBLE_CONFIGS, key=["n"], do_bench=bench)(at.double_jit)
    previous = driver.__dict__.get("_active")
    with knobs.cache.scope(), knobs.compilation.scope():
        knobs.cache.dir = str(caller_cache)
        knobs.compilation.listener = log
        driver.set_active(gpu)
        try:
            with pe_autotune.use(executor):
                kernel[at.GRID](*at._double_args())
        finally:
            driver.set_active(previous)
            at.double_jit.device_caches.pop(gpu.device, None)
    assert {c["BLOCK"] for c in bench.calls} == {c.kwargs["BLOCK"] for c in at.DOUBLE_CONFIGS}
    return kernel, gpu, log


def _installed_for_sm90(caller_cache: Path, node_caches: list[Path]) -> set[str]:
    """The hashes of ``double_jit``'s kernels in the caller's cache, each checked to be for the
    caller's target (sm_90: no node has a GPU to pick it) and absent from every node's cache (the
    files came back by value). Returns the hashes."""
    metadata = [json.loads(p.read_text()) for p in caller_cache.rglob("double_jit.json")]
    assert {(m["target"]["backend"], m["target"]["arch"]) for m in metadata} == {("cuda", 90)}
    hashes = {m["hash"] for m in metadata}
    node_files = [str(p) for c in node_caches if c.exists() for p in c.rglob("*")]
    assert not [f for f in node_files for h in hashes if h in f]
    return hashes


@pytest.mark.timeout(240)
def test_triton_autotune_compiles_every_config_on_the_nodes_for_the_callers_target(
    cpu_nodes: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pe_autotune.use(dask_executor)`` on warm nodes, the tune's own thread kept out
    (``STEALS = False``): every config compiles on a node for the target of the caller's
    (dry-run sm_90) device, comes back into the caller's cache, and each benchmark launch finds
    it there; the winner is the one the local executor picks
    (``test_triton_autotune.test_a_new_key_compiles_each_pruned_config_in_workers_and_...``)."""
    import test_triton_autotune as at

    from precompile_executor.triton import _autotune_tune, classify

    monkeypatch.setattr(_autotune_tune, "STEALS", False)
    _, client, node_caches, other = cpu_nodes
    caller_cache = tmp_path / "caller-cache"
    with DaskPrecompileExecutor(
        client, timeout=120, classify=classify, workers=_good_nodes(client, other)
    ) as executor:
        executor.warm_up(timeout=WAIT_S)
        kernel, gpu, log = _autotune_double(executor, caller_cache)
        stats = executor.statistics()
    assert stats.completed == len(at.DOUBLE_CONFIGS) and stats.failed == 0  # all on the nodes
    assert log.events == []  # nothing compiled here: every launch hit the caller's cache
    assert len(_installed_for_sm90(caller_cache, node_caches)) == len(at.DOUBLE_CONFIGS)
    assert kernel.best_config is at.DOUBLE_CONFIGS[2]  # BLOCK=256, as with the local executor
    assert gpu.launches[-1]["BLOCK"] == 256


@pytest.mark.timeout(240)
def test_triton_autotune_on_cold_nodes_compiles_each_config_once_here_or_on_a_node(
    cpu_nodes: Any, tmp_path: Path
) -> None:
    """The defaults on nodes whose pools have not started: the tune's thread may take back a
    config still PENDING on a node (``cancel()`` of a dispatched task, as with a local pool) and
    compile it here, as stock Triton would; every other config compiles on a node. No config is
    compiled twice, and no module-import task is sent (pre-imports target a local pool's
    workers: docs/triton.md, "On a cluster")."""
    import test_triton_autotune as at

    from precompile_executor.triton import _autotune_tune, _preimport, classify

    assert _autotune_tune.STEALS and _preimport.PREIMPORTS
    _, client, node_caches, other = cpu_nodes
    caller_cache = tmp_path / "caller-cache"
    with DaskPrecompileExecutor(
        client, timeout=120, classify=classify, workers=_good_nodes(client, other)
    ) as executor:
        kernel, gpu, log = _autotune_double(executor, caller_cache)
        stats = executor.statistics()
    here = log.compiled_blocks
    assert len(here) == len(set(here))
    assert stats.completed + len(here) == len(at.DOUBLE_CONFIGS)  # each compiled exactly once
    assert stats.cancelled == len(here) and stats.failed == 0  # no other task was sent
    assert len(_installed_for_sm90(caller_cache, node_caches)) == len(at.DOUBLE_CONFIGS)
    assert kernel.best_config is at.DOUBLE_CONFIGS[2]
    assert gpu.launches[-1]["BLOCK"] == 256


# -- Helion ----------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_helion_fork_mode_compiles_each_config_on_the_nodes_for_the_callers_target(
    cpu_nodes: Any, tmp_path: Path
) -> None:
    """``helion.use(dask_executor)`` in fork mode: each config's compile is taken from Helion's
    precompiler in this process (the call's specialization, the target of this process's
    compile-only sm_90 device) and runs on a node; the files come back into this process's
    ``TRITON_CACHE_DIR``, where Helion's own precompiler then finds each one (docs/helion.md,
    "On a cluster"). Spawn mode, which runs configs on a GPU, is refused saying what to do."""
    _, client, node_caches, other = cpu_nodes
    with DaskPrecompileExecutor(
        client, timeout=120, workers=_good_nodes(client, other)
    ) as executor:
        cases.helion_fork_mode_compiles_on_the_nodes(executor, node_caches, tmp_path)


@pytest.mark.timeout(240)
def test_helion_fork_mode_on_a_cluster_a_compile_past_its_timeout_is_a_timeout(
    cpu_nodes: Any, tmp_path: Path
) -> None:
    """``autotune_compile_timeout`` is each node task's timeout, counted from its start there: a
    compile that outlives it is killed on its node and reported to Helion as a timeout, as in
    fork mode; the nodes go on compiling."""
    pytest.importorskip("helion")
    import test_helion as th
    from helion.autotuner.precompile_future import PrecompileFuture

    import precompile_executor.helion as peh

    _, client, _, other = cpu_nodes
    with DaskPrecompileExecutor(
        client, timeout=120, workers=_good_nodes(client, other)
    ) as executor:
        executor.warm_up(timeout=WAIT_S)
        # no Triton compile of a kernel finishes in 10 ms
        with th._fork_batch(tmp_path, autotune_compile_timeout=0.01) as (bound, args, ctx):
            with peh.use(executor):
                configs = th._configs(bound, 2)
                futures = [th._create(ctx, bound, c, args) for c in configs]
                assert PrecompileFuture.wait_for_all(futures) == [False, False]
        assert [f.failure_reason for f in futures] == ["timeout", "timeout"]
        assert all(f.started and f.elapsed >= 0.01 for f in futures)
        assert executor.statistics().timed_out == 2
        assert executor.submit(abs, -1).result(timeout=WAIT_S) == 1  # the nodes go on


# -- a node lost mid-batch (last: the nanny replaces the killed worker) ---------------------------


@pytest.mark.timeout(300)
def test_a_node_lost_mid_batch_has_its_compiles_done_elsewhere(
    cpu_nodes: Any, tmp_path: Path
) -> None:
    """A dask worker killed while it compiles: its compile is sent again and compiled on the
    other node, and every config of the batch ends as a cache hit here, with the key the caller
    computed for it."""
    from triton import knobs

    from precompile_executor.examples import kernels as examples
    from precompile_executor.triton import classify, precompile

    _, client, _, other = cpu_nodes
    good = sorted(a for a in client.nthreads() if a != other)
    blocks = [128, 256, 512, 1024, 2048, 4096]
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path / "caller-cache")
        with DaskPrecompileExecutor(
            client, timeout=120, classify=classify, max_workers_per_node=1, workers=good
        ) as executor:
            executor.warm_up(timeout=WAIT_S)
            jobs = [
                precompile(
                    examples.add_gelu_kernel,
                    add_gelu_signature("fp16"),
                    {"BLOCK_SIZE": b},
                    target="cuda:90",
                    options=ADD_GELU_OPTIONS,
                    executor=executor,
                )
                for b in blocks
            ]
            wait_until(lambda: executor.statistics().running == 2)  # one compile on each node
            victim = good[0]
            os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)

            kernels = [job.result(timeout=240) for job in jobs]
            stats = executor.statistics()
        assert stats.nodes_lost == 1 and stats.crashed == 1  # the one compile the node held
        assert [job.resends for job in jobs].count(1) == 1 and sum(j.resends for j in jobs) == 1
        assert stats.completed == len(blocks)
        for job, kernel in zip(jobs, kernels, strict=True):
            assert kernel.hash == job.request.expected_hash  # the key a launch here looks up
            assert all(Path(p).exists() for p in kernel.metadata_group.values())


@pytest.mark.timeout(300)
def test_a_node_lost_mid_autotune_has_its_configs_compiled_elsewhere(
    cpu_nodes: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dask worker killed while it holds a config of a ``@triton.autotune`` tune: the compile
    is sent again (``_submit.NODE_LOST_RESENDS``), lands on the other node, and the tune ends as
    without the loss: every config from a node, the same winner."""
    import threading

    import test_triton_autotune as at

    from precompile_executor.triton import _autotune_tune, classify

    monkeypatch.setattr(_autotune_tune, "STEALS", False)  # nothing taken back by this thread
    _, client, node_caches, other = cpu_nodes
    good = _good_nodes(client, other)
    caller_cache = tmp_path / "caller-cache"

    def slow_start() -> None:
        time.sleep(4.0)  # each node's pool is still starting: its one config waits there

    outcome: dict[str, Any] = {}

    def tune() -> None:
        try:
            outcome["tuned"] = _autotune_double(executor, caller_cache)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test's thread
            outcome["error"] = exc

    with DaskPrecompileExecutor(
        client,
        timeout=120,
        classify=classify,
        initializer=slow_start,
        max_workers_per_node=1,
        workers=good,
    ) as executor:
        tuning = threading.Thread(target=tune, daemon=True)
        tuning.start()
        # a window of one task per node: each node holds one config of the tune
        wait_until(lambda: executor.statistics().dispatched == 2)
        victim = good[0]
        os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        tuning.join(timeout=240)
        assert not tuning.is_alive()
        stats = executor.statistics()
    if "error" in outcome:
        raise outcome["error"]
    kernel, gpu, log = outcome["tuned"]
    assert stats.nodes_lost == 1 and stats.crashed == 1  # the one config the node held
    assert stats.completed == len(at.DOUBLE_CONFIGS)  # each config, once, on a node
    assert log.events == []  # nothing compiled here
    assert len(_installed_for_sm90(caller_cache, node_caches)) == len(at.DOUBLE_CONFIGS)
    assert kernel.best_config is at.DOUBLE_CONFIGS[2]
    assert gpu.launches[-1]["BLOCK"] == 256
