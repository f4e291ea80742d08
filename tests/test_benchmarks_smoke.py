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
RUN_TIMEOUT_S = 440
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


def _run_quick(out: Path) -> subprocess.CompletedProcess[str]:
    # Its own session, so a run that overstays can be stopped with everything it started.
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(out)],
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


@pytest.mark.slow
@pytest.mark.timeout(460)
def test_quick_run_writes_every_scenario(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench"
    result = _run_quick(out)
    assert result.returncode == 0, result.stdout[-4000:]

    png = out / "benchmarks.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "benchmarks.md").read_text()
    assert "FAILED" not in md, md
    for title in SCENARIOS:
        assert f"## {title}" in md, f"no section {title!r}"
        section = md.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
        assert "\n|---" in section, f"section {title!r} has no table"
    assert "## Targets" in md
    assert "none was left after any of the 9 scenarios" in md
    assert "cleanup check: 0 process(es)" in result.stdout
