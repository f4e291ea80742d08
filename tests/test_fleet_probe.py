"""``benchmarks/fleet_probe.py --quick``: its loopback cluster and its per-task split, end to end.

Each run starts a real dask ``LocalCluster`` (2 worker processes × 8 threads) and sends real
tasks through ``DaskPrecompileExecutor`` returning a real sm_90 compile's files. The checks are
the probe's plumbing, never a timing: every server on 127.0.0.1, every task split, both callers
reported, and no process left (the tag every process of the run inherits).
"""

from __future__ import annotations

import json

import pytest
from bench_helpers import run_tagged

QUICK_TIMEOUT_S = 240


@pytest.mark.slow
@pytest.mark.timeout(QUICK_TIMEOUT_S + 40)
def test_quick_run_splits_every_task_on_loopback_and_leaves_no_process() -> None:
    pytest.importorskip("distributed")
    pytest.importorskip("triton")
    code, output, errors, left = run_tagged(["benchmarks.fleet_probe", "--quick"], QUICK_TIMEOUT_S)
    assert left == []
    assert code == 0, errors[-4000:]

    runs = [json.loads(line.split(": ", 1)[1]) for line in errors.splitlines()
            if line.startswith("round ")]  # fmt: skip
    assert len(runs) == 2  # one quiet caller, one busy
    for run in runs:
        assert run["addresses"] and all(
            a.startswith("tcp://127.0.0.1:") for a in run["addresses"]
        ), run["addresses"]
        assert run["tasks"] == run["split_tasks"] == 12
        assert run["per_task_cost"] > 0  # time outside the compiles: never free
        assert run["to_node_s"] > 0 and run["back_s"] > 0
    rows = [line for line in output.splitlines() if line.startswith("| this tree |")]
    assert [r.split(" | ")[1] for r in rows] == ["quiet", "busy in Python"]
