"""Smoke test of ``benchmarks/inductor_bench.py``: ``--smoke --only llama:default`` compiles a
tiny Llama-style decoder's training step (forward and backward) on the CPU in fresh processes:
stock, inside ``precompile_executor.inductor.use()`` and under ``install()`` — what the GPU
stage ``inductor-train`` runs at full size.

It asserts what the run recorded — every process finished, its loss and gradients equal eager's,
and every C++ build of the ``ours`` processes is accounted for (on the executor, or in the
caller while no worker had answered yet) — never a timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from benchmarks import inductor_bench  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 840

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def test_the_smoke_run_compiles_stock_and_on_the_executor_equal_to_eager(tmp_path: Path) -> None:
    out, runs = tmp_path / "records.json", tmp_path / "runs.jsonl"
    command = [sys.executable, "-m", "benchmarks.inductor_bench", "--smoke", "--out", str(out)]
    command += ["--only", "llama:default", "--variants", "stock,ours,ours-install"]
    command += ["--no-instruments"]
    proc = subprocess.Popen(
        [*command, "--results", str(runs)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a run that overstays is stopped with everything it started
    )
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=30)
        pytest.fail(f"the smoke run took over {RUN_TIMEOUT_S} s:\n{output[-3000:]}")
    assert proc.returncode == 0, output[-3000:]
    assert "## llama, mode=default" in output
    assert "stock" in output and "ours-install/stock" in output
    records = json.loads(out.read_text())["records"]
    variants = ["ours", "ours-install", "stock"]
    assert sorted(r["spec"]["variant"] for r in records) == variants
    for record in records:
        assert record["ok"] and record["equal"], record
        assert record["spec"]["model"] == "llama" and record["rel_error"] < 1e-2
    for ours in [r for r in records if r["spec"]["variant"] != "stock"]:
        compiles = ours["ours"]["compiles"]
        assert compiles["cpp"] + compiles["caller_cpp"] > 0, compiles
        assert compiles["failed"] == 0

    # Each run was appended to --results as it ended: a later call reports them with its own.
    saved = [json.loads(line) for line in runs.read_text().splitlines()]
    assert sorted(r["spec"]["variant"] for r in saved) == variants
    sizes = saved[0]["spec"]
    assert len(inductor_bench.load_results(runs, sizes)) == 3
    assert inductor_bench.load_results(runs, sizes | {"layers": sizes["layers"] + 1}) == []


def test_only_names_model_mode_cells_and_refuses_anything_else() -> None:
    assert inductor_bench.parse_only("gpt2:max-autotune, convnet:default") == [
        ("gpt2", "max-autotune"),
        ("convnet", "default"),
    ]
    for bad in ("gpt2", "gpt2:fast", "bert:default", ","):
        with pytest.raises(ValueError, match="--only"):
            inductor_bench.parse_only(bad)
