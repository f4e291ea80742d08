"""``benchmarks/fleet_bench.py --cpu-smoke``: its loopback dask cluster and runs, end to end.

The smoke run starts the benchmark's real cluster (a dask scheduler and two dask workers, each a
process, CUDA hidden) and its real runs (fresh interpreters compiling matmul configs for sm_90 on
the nodes, one node SIGKILLed mid-tune). The checks are the benchmark's plumbing, never a timing:
every socket of the cluster on 127.0.0.1, every compile from a node installed in the run's cache,
the killed node's compile sent again, and no process left — including any orphan, found by the
tag every process of the run inherits (``benchmarks._common.RUN_TAG_ENV``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SMOKE_TIMEOUT_S = 150


@pytest.mark.slow
@pytest.mark.timeout(SMOKE_TIMEOUT_S + 30)
def test_cpu_smoke_runs_on_loopback_and_leaves_no_process(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    pytest.importorskip("triton")
    from benchmarks._common import RUN_TAG_ENV, describe, tagged_processes

    tag = uuid.uuid4().hex
    out = tmp_path / "fleet"
    env = dict(os.environ, **{RUN_TAG_ENV: tag})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.fleet_bench", "--cpu-smoke", "--out-dir", str(out)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the benchmark tears its cluster down on SIGTERM
        output, _ = proc.communicate(timeout=30)
        pytest.fail(f"the smoke run took over {SMOKE_TIMEOUT_S} s:\n{output[-4000:]}")
    left = [describe(p) for p in tagged_processes(tag)]
    for p in tagged_processes(tag):  # never leave them to the next test
        p.kill()
    assert left == []
    assert proc.returncode == 0, output[-4000:]

    info = json.loads((out / "fleet-info.json").read_text())
    for seen in (info["cluster"], info["cluster_after"]):
        assert seen["scheduler"].startswith("tcp://127.0.0.1:")
        assert seen["non_loopback_sockets"] == []
        assert seen["listening"] and all(" 127.0.0.1:" in a for a in seen["listening"])
        assert set(seen["cuda_visible_devices"].values()) == {""}
        assert len(seen["nodes"]) == 2
    assert info["left_behind"] == [] and info["subreaper"]

    rows = [json.loads(line) for line in (out / "fleet-runs.jsonl").read_text().splitlines()]
    assert [(r["scenario"], r["mode"]) for r in rows] == [
        ("gemm", "local"),
        ("gemm", "cluster"),
        ("node-loss", "cluster"),
    ]
    assert all("error" not in r for r in rows), rows
    assert len({r["best"] for r in rows}) == 1  # the fixed timings have one winner
    for r in rows[1:]:
        per_task = r["per_task"]
        assert per_task["tasks"] >= 1 and r["node_files_here"] == per_task["tasks"]
        assert r["compiled_on_nodes"] + r["compiled_here"] == r["configs"]
        assert r["non_loopback_sockets"] == []
        assert per_task["compile_s"] > 0 and per_task["split_tasks"] == per_task["tasks"]
    loss = rows[2]
    assert loss["killed_pid"] and loss["nodes_lost"] == 1 and loss["resends"] >= 1
    report = (out / "fleet-bench.md").read_text()
    assert "MISSED" not in report, report
