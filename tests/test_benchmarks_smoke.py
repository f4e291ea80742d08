"""The benchmarks as a product: ``python -m benchmarks SUITE`` (its suites, plans, skips and
runs) and ``python -m benchmarks.run --quick``, which runs every core scenario.

They assert that the outputs exist and hold each benchmark's table — never a timing: the
figures of a quick run on a shared test machine mean nothing.
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

    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    short = extract("HEAD", tmp_path)
    assert short == head.stdout.strip()
    assert (tmp_path / "precompile_executor" / "__init__.py").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precompile_executor"]


def _entry_point(*argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks ARGV`` in the repository, stderr into stdout."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def test_every_benchmark_of_every_suite_is_a_module_here() -> None:
    import importlib.util

    from benchmarks.suites import SUITES

    assert set(SUITES) == {"core", "triton", "helion", "inductor", "cluster"}
    for suite, (_, benchmarks) in SUITES.items():
        assert benchmarks, suite
        for b in benchmarks:
            assert importlib.util.find_spec(b.module) is not None, (suite, b.module)
            assert b.compares and b.read, (suite, b.name)


@pytest.mark.timeout(60)
def test_the_entry_point_lists_the_suites_and_prints_each_plan_without_running_it(
    tmp_path: Path,
) -> None:
    from benchmarks.suites import SUITES

    listing = _entry_point(timeout=50)
    assert listing.returncode == 0, listing.stdout
    for suite in SUITES:
        assert f"\n{suite}: " in listing.stdout, listing.stdout
    for suite, (_, benchmarks) in SUITES.items():
        out = tmp_path / suite
        for quick in ([], ["--quick"]):
            plan = _entry_point(suite, "--plan", *quick, "--out", str(out), timeout=50)
            assert plan.returncode == 0, plan.stdout
            for b in benchmarks:
                assert f"[{b.name}] compares: " in plan.stdout, plan.stdout
                assert f"runs: python -m {b.module}" in plan.stdout, plan.stdout
            assert str(out) in plan.stdout and not out.exists()


@pytest.mark.timeout(60)
def test_the_entry_point_refuses_an_unknown_benchmark_and_names_the_known_ones() -> None:
    done = _entry_point("core", "--only", "nonesuch", timeout=50)
    assert done.returncode == 2, done.stdout
    assert "core has no benchmark nonesuch; it has: scenarios (s1…s9), busy-caller" in done.stdout


@pytest.mark.timeout(60)
def test_a_core_scenario_picked_by_name_and_arguments_after_dashes_are_passed_on() -> None:
    done = _entry_point(
        *("core", "--plan", "--only", "s2,s9", "--against", "HEAD~1", "--", "--workers", "16"),
        timeout=50,
    )
    assert done.returncode == 0, done.stdout
    assert "[busy-caller]" not in done.stdout
    assert "--against HEAD~1 --only s2,s9 --workers 16" in done.stdout.replace("\n    ", " ")


@pytest.mark.timeout(120)
def test_a_gpu_benchmark_is_skipped_with_a_line_where_torch_sees_no_gpu(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the benchmark would run")
    done = _entry_point("helion", "--quick", "--out", str(tmp_path), timeout=110)
    assert done.returncode == 0, done.stdout
    assert "[autotune] skipped: it needs a CUDA GPU and torch sees none" in done.stdout
    assert "suite helion: autotune: skipped, no CUDA device here" in done.stdout
    assert not (tmp_path / "autotune.log").exists()


@pytest.mark.timeout(240)
def test_the_busy_caller_benchmark_measures_each_pool_with_and_without_the_hog(
    tmp_path: Path,
) -> None:
    # --against a directory: the same tree, linked (no git history needed).
    done = _entry_point(
        *("core", "--quick", "--only", "busy-caller", "--against", str(REPO)),
        *("--out", str(tmp_path)),
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "suite core: busy-caller: ok in " in done.stdout
    log = (tmp_path / "busy-caller.log").read_text()
    runs = [line for line in log.splitlines() if line.startswith("round 1 ")]
    assert len(runs) == 6 and not any("error" in line for line in runs), log
    rows = [line for line in log.splitlines() if line.startswith("| ") and "/" in line]
    assert [row.split(" | ")[0] for row in rows] == [
        "| pool",
        "| this tree",
        "| stdlib ProcessPoolExecutor (fork)",
        f"| against {REPO}",
    ]
    ratios = [line for line in log.splitlines() if line.startswith("ratio, this tree ÷ ")]
    assert [r.split(", with")[0] for r in ratios] == [
        "ratio, this tree ÷ stdlib ProcessPoolExecutor (fork)",
        f"ratio, this tree ÷ against {REPO}",
    ]
