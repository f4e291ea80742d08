"""``benchmarks/fleet_probe.py --quick``: its loopback cluster and its per-task split, end to end.

Each run starts a real dask ``LocalCluster`` (2 worker processes × 8 threads) and sends real
tasks through ``DaskPrecompileExecutor`` returning a real sm_90 compile's files. The checks are
the probe's plumbing, never a timing: every server on 127.0.0.1, every task split, both callers
reported, and no process left (the tag every process of the run inherits).
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
QUICK_TIMEOUT_S = 240


@pytest.mark.slow
@pytest.mark.timeout(QUICK_TIMEOUT_S + 40)
def test_quick_run_splits_every_task_on_loopback_and_leaves_no_process() -> None:
    pytest.importorskip("distributed")
    pytest.importorskip("triton")
    from benchmarks._common import RUN_TAG_ENV, describe, tagged_processes

    tag = uuid.uuid4().hex
    env = dict(os.environ, **{RUN_TAG_ENV: tag})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.fleet_probe", "--quick"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        output, errors = proc.communicate(timeout=QUICK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, errors = proc.communicate(timeout=30)
        pytest.fail(f"the quick run took over {QUICK_TIMEOUT_S} s:\n{errors[-4000:]}")
    left = [describe(p) for p in tagged_processes(tag)]
    for p in tagged_processes(tag):  # never leave them to the next test
        p.kill()
    assert left == []
    assert proc.returncode == 0, errors[-4000:]

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
