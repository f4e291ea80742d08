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
import signal
from pathlib import Path

import pytest
from bench_helpers import run_tagged

SMOKE_TIMEOUT_S = 150


@pytest.mark.slow
@pytest.mark.timeout(SMOKE_TIMEOUT_S + 30)
def test_cpu_smoke_runs_on_loopback_and_leaves_no_process(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    pytest.importorskip("triton")
    out = tmp_path / "fleet"
    # SIGTERM past its time: the benchmark tears its cluster down on it.
    code, output, _, left = run_tagged(
        ["benchmarks.fleet_bench", "--cpu-smoke", "--out-dir", str(out)],
        SMOKE_TIMEOUT_S,
        stop=signal.SIGTERM,
        merge=True,
    )
    assert left == []
    assert code == 0, output[-4000:]

    info = json.loads((out / "fleet-info.json").read_text())
    for seen in (info["cluster"], info["cluster_after"]):
        assert seen["scheduler"].startswith("tcp://127.0.0.1:")
        assert seen["non_loopback_sockets"] == []
        assert seen["listening"] and all(" 127.0.0.1:" in a for a in seen["listening"])
        assert set(seen["cuda_visible_devices"].values()) == {""}
        assert len(seen["nodes"]) == 2
    assert info["left_behind"] == [] and info["subreaper"]

    lines = (out / "fleet-runs.jsonl").read_text().splitlines()
    rows = [r for r in map(json.loads, lines) if r["scenario"] != "check"]
    checked = [r for r in map(json.loads, lines) if r["scenario"] == "check"]
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
        assert len(per_task["records"]) == per_task["split_tasks"]
        assert 0 <= per_task["queued_s"] <= per_task["to_node_s"]
    # The chosen-kernel check ran its plumbing on the dry-run driver: the one config chosen,
    # timed by the autotuner's (fixed) benchmark once per alternation.
    assert [(c["config"], c["chosen_by"]) for c in checked] == [
        (rows[0]["best"], [f"{r['scenario']} {r['mode']} (round 1)" for r in rows])
    ]
    assert len(checked[0]["ms"]) == 10 and checked[0]["vs_local_choice"] == 1.0
    loss = rows[2]
    assert loss["killed_pid"] and loss["nodes_lost"] == 1 and loss["resends"] >= 1
    report = (out / "fleet-bench.md").read_text()
    assert "MISSED" not in report, report
    # Each process's time in its phases: all of it, in order (a local run has nothing to tear
    # down after its tune).
    from benchmarks.fleet_bench import PHASES, phases

    for r in rows:
        spans = phases(r)
        assert spans is not None and list(spans) == list(PHASES), r
        assert all(s >= 0 for s in spans.values()) and spans["tune"] > 0, spans
        assert sum(spans.values()) == pytest.approx(r["exited_at"] - r["spawned_at"], abs=0.01)
        assert spans["tune"] >= r["first_call_s"]
    assert "Where each process's time goes" in report


# -- the report's arithmetic (pure functions of recorded rows) ------------------------------------

STOCK, OTHER = "BLOCK_M: 256 (stock's)", "BLOCK_M: 128 (another)"


def _gemm_rows(best_of_local: str) -> list[dict[str, object]]:
    return [
        {"scenario": "gemm", "mode": "stock", "round": 1, "best": STOCK,
         "timings_ms": {STOCK: 0.20, OTHER: 0.23}},
        {"scenario": "gemm", "mode": "local", "round": 1, "best": best_of_local},
    ]  # fmt: skip


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("medians", "verdict"),
    [({STOCK: 0.200, OTHER: 0.2039}, "MET"), ({STOCK: 0.200, OTHER: 0.2041}, "MISSED")],
)
def test_another_config_is_judged_by_the_chosen_kernel_check(
    medians: dict[str, float], verdict: str
) -> None:
    from benchmarks.fleet_bench import checks

    checked = [{"scenario": "check", "config": c, "ms_median": ms} for c, ms in medians.items()]
    (line,) = [x for x in checks(_gemm_rows(OTHER), False, checked) if "best config" in x]
    # Stock's own tune timed the other config 1.15x its best: shown, not judged.
    assert line.startswith(f"{verdict}:") and "1.150" in line, line


@pytest.mark.timeout(30)
def test_another_config_without_a_check_is_not_judged() -> None:
    from benchmarks.fleet_bench import checks

    (line,) = [x for x in checks(_gemm_rows(OTHER), False, []) if "best config" in x]
    assert line.startswith("n/a:"), line
    (same,) = [x for x in checks(_gemm_rows(STOCK), False, []) if "best config" in x]
    assert same.startswith("MET:"), same


@pytest.mark.timeout(30)
def test_queueing_is_the_wait_for_the_nodes_earliest_free_slot() -> None:
    from benchmarks.fleet_bench import replay_queueing

    sent = [
        ("a", 0.0, "n0", 1),
        ("b", 0.1, "n0", 1),  # n0's one slot is a's until 1.0
        ("c", 0.1, "n1", 2),
        ("d", 0.2, "n1", 2),  # n1 has two slots: no wait
        ("lost", 0.3, "n1", 2),  # never ran: no slot, no wait
    ]
    ran = {"a": (0.05, 1.0), "b": (1.02, 2.0), "c": (0.2, 0.5), "d": (0.25, 0.6)}
    assert replay_queueing(sent, ran) == pytest.approx({"a": 0.0, "b": 0.9, "c": 0.0, "d": 0.0})
