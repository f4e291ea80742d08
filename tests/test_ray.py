"""``RayPrecompileExecutor`` on a 2-node local Ray cluster: loopback, faults, cancel, node loss,
Triton.

The cluster (``ray_cluster`` in ``conftest.py``) is a ``ray.cluster_utils.Cluster`` of two nodes
with 2 CPUs, its own ``TRITON_CACHE_DIR`` and a custom resource each, inside a network namespace
with only loopback. The contract tests in ``test_contract.py`` run against this executor too.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import crashers
import loopback
import pytest
from conftest import assert_on_loopback_only, ray_node_resource

pytest.importorskip("ray")

import ray  # noqa: E402

from precompile_executor.ray import RayPrecompileExecutor, node_actors  # noqa: E402

WAIT_S = 60.0
"""Longest any single wait in these tests may take."""


@pytest.mark.timeout(60)
def test_every_ray_process_is_on_loopback_only(ray_cluster: Any) -> None:
    assert [name for _, name in socket.if_nameindex()] == ["lo"]
    assert_on_loopback_only()
    with RayPrecompileExecutor() as executor:  # the node actors and their pools too
        assert executor.submit(crashers.square, 3).result(timeout=WAIT_S) == 9
        assert len(executor.nodes()) == 2
        assert_on_loopback_only()
    assert {p.name() for p in loopback.ray_processes()} >= {"ray::NodeActor"}


@pytest.mark.timeout(60)
def test_tasks_reach_both_nodes_and_each_nodes_environment(ray_cluster: Any) -> None:
    _, cache_dirs = ray_cluster
    with RayPrecompileExecutor() as executor:
        executor.warm_up(timeout=WAIT_S)
        on = {}
        for i in range(2):
            view = executor.options(resources={ray_node_resource(i): 1})
            # a lambda: os.environ.get would carry this process's environment along
            on[i] = view.submit(lambda: os.environ.get("TRITON_CACHE_DIR")).result(timeout=WAIT_S)
        assert on == {0: str(cache_dirs[0]), 1: str(cache_dirs[1])}
        pids = {ray.get(h.describe.remote())["pid"] for h in node_actors().values()}
        assert len(pids) == 2
