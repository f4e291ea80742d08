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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
