"""benchmarks/helion_bench.py without a GPU: its ``--cpu-check`` (the softmax and bmm scenarios'
kernels bound to their shapes on the compile-only sm_90 driver, configs drawn and precompiled by
Helion's provider and ours) and its report of timed-out configs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("helion")

from benchmarks import helion_bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_the_cpu_check_runs_the_bmm_scenario_through_native_and_ours() -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.helion_bench", "--cpu-check", "1", "--quick"]
        + ["--only", "bmm"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| bmm | native-fork | 1 |" in done.stdout
    assert "| bmm | ours-fork | 1 |" in done.stdout


def test_the_report_names_the_timed_out_config_and_who_cut_it() -> None:
    def row(mode: str, elapsed: float, cut: str | None) -> dict[str, object]:
        failed = {"reason": "timeout", "elapsed_s": elapsed, "cut": cut, "config": "Config(x=1)"}
        return {
            "scenario": "softmax",
            "mode": mode,
            "process_s": 90.0 if mode == "native-fork" else 45.0,
            "best_config": "Config(x=2)",
            "failed": [failed],
        }

    text = helion_bench.report(
        [row("native-fork", 60.1, None), row("ours-fork", 30.2, "30.0s = min(...)")], {}
    )
    assert "| softmax | native-fork | 1 | 60.1 | compile timeout | `Config(x=1)` |" in text
    assert "| softmax | ours-fork | 1 | 30.2 | adaptive timeout: 30.0s = min(...) |" in text
    assert "0.500 (target ≤ 0.55)" in text
    assert set(helion_bench.SCENARIOS["bmm"]) == {"native-fork", "ours-fork", "install-fork"}


def test_the_report_shows_what_was_measured_here_and_how_it_compares() -> None:
    """Per mode: how many configs ours measured in the autotuning process while Helion's
    benchmark subprocess started, and each config's latency against native's, by where."""

    def row(mode: str, measures: list[list[object]], here: int | None) -> dict[str, object]:
        return {
            "scenario": "bmm",
            "mode": mode,
            "process_s": 10.0,
            "best_config": "Config(x=1)",
            "measures": measures,
            "measured_here": here,
            "bench_workers": [{"how": "provider", "warm_s": 17.5}] if here else [],
        }

    native = [[0.0, 1.0, "a", 2.0, "helion"], [0.1, 0.5, "b", 4.0, "helion"]]
    ours = [[0.0, 0.1, "a", 2.2, "here"], [0.1, 0.5, "b", 4.0, "helion"]]
    text = helion_bench.report([row("native-fork", native, 0), row("ours-fork", ours, 1)], {})
    assert "| 1, subprocess warm after 17.5 s |" in text
    assert "| bmm | ours-fork | here | 1 | 1.100 (1.100–1.100) |" in text
    assert "| bmm | ours-fork | helion | 1 | 1.000 (1.000–1.000) |" in text
