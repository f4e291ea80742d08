"""Smoke test of the benchmarks: ``python -m benchmarks.run --quick`` runs every scenario.

It asserts that the outputs exist and hold each scenario's table — never a timing: the figures
of a quick run on a shared test machine mean nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 540
SCENARIOS = [
    "1. Per-task overhead",
    "2. A real batch",
    "3. Faults",
    "4. Timeout kill latency",
    "5. Memory",
    "6. Scaling",
    "7. Ordering",
    "8. Worker starts",
    "9. Per-task overhead against",
]


def _run_quick(out: Path, only: list[str]) -> subprocess.CompletedProcess[str]:
    # Its own session, so a run that overstays can be stopped with everything it started.
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(out)]
        + ["--only", ",".join(only)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate(timeout=10)
        pytest.fail(f"the quick benchmark run took over {RUN_TIMEOUT_S}s:\n{output[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, output, "")


# Two runs, each with its own time limit: s9 alone starts three pools in three interpreters.
QUICK_RUNS = {
    "s1-s8": ([f"s{i}" for i in range(1, 9)], SCENARIOS[:8]),
    "s9": (["s9"], SCENARIOS[8:]),
}


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 20)
@pytest.mark.parametrize("run", list(QUICK_RUNS))
def test_quick_run_writes_every_scenario(tmp_path: Path, run: str) -> None:
    pytest.importorskip("triton")
    pytest.importorskip("matplotlib")
    only, titles = QUICK_RUNS[run]
    out = tmp_path / "bench"
    result = _run_quick(out, only)
    assert result.returncode == 0, result.stdout[-4000:]

    png = out / "benchmarks.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "benchmarks.md").read_text()
    assert "FAILED" not in md, md
    for title in titles:
        assert f"## {title}" in md, f"no section {title!r}"
        section = md.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
        assert "\n|---" in section, f"section {title!r} has no table"
    assert "## Targets" in md
    assert f"none was left after any of the {len(only)} scenarios" in md
    assert "cleanup check: 0 process(es)" in result.stdout


def test_rows_render_as_one_table_with_dashes_for_missing_values() -> None:
    from benchmarks._report import Section, Table, markdown

    table = Table.of(
        "t",
        [
            {"pool": "a", "wall (s)": 1.234, "note": None},
            {"pool": "b", "wall (s)": float("nan"), "note": "x"},
        ],
    )
    assert table.columns == ["pool", "wall (s)", "note"]
    assert table.rows == [["a", "1.23", "—"], ["b", "—", "x"]]
    info = dict.fromkeys(
        ["machine", "python", "torch", "triton", "loky", "pebble", "cloudpickle", "psutil"], "?"
    )
    info |= {"precompile_executor": "?", "date": "?", "command": "?"}
    md = markdown([Section("s0", "0. Title", "intro", [table])], info, None, quick=True)
    assert "| a | 1.23 | — |" in md and "## 0. Title" in md


def test_scenario_9_extracts_only_the_package_of_the_revision(tmp_path: Path) -> None:
    from benchmarks.s9_versus import extract

    known = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", "333c6ad^{commit}"], capture_output=True
    )
    if known.returncode != 0:
        pytest.skip("this checkout does not have 333c6ad, e.g. a shallow clone")
    short = extract("333c6ad", tmp_path)
    assert short.startswith("333c6ad")
    assert (tmp_path / "precompile_executor" / "__init__.py").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precompile_executor"]


def _run_benchmark(module: str, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.MODULE ARGV`` in the repository; fails the test unless it exits
    0 within ``timeout`` seconds."""
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.timeout(180)
def test_fork_cow_probe_writes_a_row_per_fork_and_reaps_its_children() -> None:
    done = _run_benchmark("fork_cow_probe", "--forks", "2", timeout=150)
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "×" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| 1", "| 2"]


@pytest.mark.timeout(240)
def test_gil_probe_measures_each_pool_with_and_without_the_hog(tmp_path: Path) -> None:
    # --against a directory: the same tree, linked (no git history needed).
    done = _run_benchmark(
        "gil_probe",
        *("--rounds", "1", "--workers", "1", "--tasks", "3", "--task-ms", "1", "--hog-ms", "2"),
        *("--against", str(REPO)),
        timeout=200,
    )
    runs = [line for line in done.stdout.splitlines() if line.startswith("round 1 ")]
    assert len(runs) == 6 and not any("error" in line for line in runs), done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "/" in line]
    assert [row.split(" | ")[0] for row in rows] == [
        "| pool",
        "| this tree",
        "| stdlib ProcessPoolExecutor (fork)",
        f"| against {REPO}",
    ]


@pytest.mark.timeout(300)
def test_exit_probe_times_each_program_to_its_exit(tmp_path: Path) -> None:
    # --against a directory: the same tree, linked (no git history needed).
    done = _run_benchmark(
        "exit_probe", "--rounds", "1", "--modes", "triton", "--against", str(REPO), timeout=280
    )
    runs = [line for line in done.stdout.splitlines() if line.startswith("round 1 ")]
    assert len(runs) == 3 and all("'exit_s'" in line for line in runs), done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| triton ")]
    assert len(rows) == 1 and "failed" not in rows[0], done.stdout
