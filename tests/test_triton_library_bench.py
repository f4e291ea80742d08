"""The plumbing of ``benchmarks/triton_library_bench.py`` on a CPU (the runs themselves need a GPU).

Its observer, on a dry-run sm_90 GPU (``tests/dry_run_gpu.py``), sees a stock tune and a tune
inside ``use()``: one tune each, its choice, and the ``do_bench`` time within it; the tuning key
it records is the one the chosen-kernel check computes; the report renders every table. Never a
timing.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from dry_run_gpu import DryRunGPU, FakeTensor, installed  # noqa: E402
from triton import testing as triton_testing  # noqa: E402

from benchmarks import triton_library_bench as bench  # noqa: E402
from precompile_executor.triton import autotune as pe_autotune  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(180)


@triton.jit
def scale_jit(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0, mask=mask)


CONFIGS = [triton.Config({"BLOCK": b}, num_warps=4) for b in (128, 256, 512)]
TIMES_MS = {128: 3.0, 256: 1.0, 512: 2.0}


@pytest.fixture
def gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DryRunGPU]:
    """A dry-run GPU whose benchmarker is ``triton.testing.do_bench`` (as a real driver's is),
    here one that launches once and returns the timing of the config's BLOCK."""
    stand_in = DryRunGPU()

    def fake_do_bench(kernel_call: Any, quantiles: Any = None, **_: Any) -> list[float]:
        kernel_call()
        return [TIMES_MS[stand_in.launches[-1]["BLOCK"]]] * 3

    monkeypatch.setattr(triton_testing, "do_bench", fake_do_bench)
    stand_in.get_benchmarker = lambda: triton_testing.do_bench  # type: ignore[attr-defined]
    with installed(stand_in, tmp_path / "cache", (scale_jit,)):
        yield stand_in


def test_the_observer_sees_each_tune_its_choice_key_and_floor(gpu: DryRunGPU) -> None:
    observer = bench.Observer()
    observer.install()
    try:
        args = (FakeTensor(tl.float32), FakeTensor(tl.float32), 4096)
        stock = triton.autotune(configs=CONFIGS, key=["n"])(scale_jit)
        stock[(1,)](*args)
        ours = triton.autotune(configs=[*CONFIGS], key=["n"])(scale_jit)
        with ThreadPoolExecutor(2) as pool, pe_autotune.use(pool):
            ours[(1,)](*args)
            ours[(1,)](*args)  # a known key: no tune
    finally:
        observer.uninstall()
    rows = observer.summary(0.0)
    assert [r["kernel"] for r in rows] == [f"{__name__}.scale_jit"] * 2
    for row, autotuner in zip(rows, (stock, ours), strict=True):
        assert row["configs"] == 3 and row["benches"] >= 3
        assert row["chosen"] == str(autotuner.best_config) and "BLOCK: 256" in row["chosen"]
        assert 0 < row["floor_s"] <= row["tune_s"]
        assert 0 < row["longest_compile_s"] <= row["tune_s"] - row["floor_s"] + 1e-9
        # The chosen-kernel check finds the runs' choices under the key it computes itself.
        autotuner.nargs = dict(zip(autotuner.arg_names, args, strict=False))
        assert row["key"] == str(bench._tuning_key(autotuner, {}))


def test_the_report_renders_runs_kernels_and_the_check() -> None:
    def run(mode: str, step: float) -> dict[str, Any]:
        tune = {"kernel": "m.k", "configs": 4, "tune_s": step / 2, "floor_s": 0.5, "key": "(1,)"}
        return {
            "step_s": step,
            "forward_s": step / 2,
            "process_s": step + 5,
            "tune_s": step / 2,
            "floor_s": 0.5,
            "tunes": [{**tune, "chosen": f"BLOCK: {mode}"}],
            "executor": {} if mode == "stock" else {"completed": 3, "cancelled": 1},
        }

    results = {
        ("fla", "stock"): [run("stock", 10.0), run("stock", 12.0)],
        ("fla", "use"): [run("use", 5.0), {"error": "Traceback\nRuntimeError: boom"}],
    }
    assert bench.choices_of(results[("fla", "use")]) == {"m.k": {"(1,)": "BLOCK: use"}}
    checks = {
        "fla": {
            "keys": 1,
            "matched": 1,
            "checks": [{"kernel": "m.k", "key": "(1,)", "ms": {"stock": 1.0, "use": 1.1}}],
        }
    }
    text = bench.report(results, checks, "machine")
    assert (
        "| stock | 16.00 | 5.50 | 11.00 | 5.50 | 0.50 | 1.00× | 1.00× | all | 10.00, 12.00 |"
        in text
    )
    assert (
        "| use | 10.00 | 2.50 | 5.00 | 2.50 | 0.50 | 0.45× | 0.62× | 1 "
        "| 5.00 (1 failed: RuntimeError: boom) |"
    ) in text
    assert "| `k` | 4 | 5.50 [0.50] | 2.50 [0.50] | 0.45× |" in text
    assert "| `k` | (1,) | 1.0000 | 1.1000 | 1.10× |" in text
    # no compile times recorded: the floor is the do_bench time alone
    assert "| `k` | – | 2.50 [0.50] | 5.00× |" in text
    assert "| all kernels | | 2.50 [0.50] | 5.00× |" in text


def test_the_floor_of_a_tune_is_its_benchmarks_or_stocks_longest_compile() -> None:
    def run(mode: str, tunes: list[tuple[str, float, float, float]]) -> dict[str, Any]:
        rows = [
            {
                "kernel": f"m.{k}",
                "key": key,
                "configs": 4,
                "tune_s": t,
                "floor_s": f,
                "longest_compile_s": c,
                "chosen": "BLOCK: 1",
            }
            for (k, t, f, c), key in zip(tunes, ["(1,)", "(2,)"] * 2, strict=False)
        ]
        return {
            "step_s": 1.0,
            "forward_s": 0.5,
            "process_s": 2.0,
            "tune_s": 1.0,
            "floor_s": 1.0,
            "tunes": rows,
            "executor": {},
        }

    # k: bench-bound (2.0 s of do_bench, compiles under 1 s); c: compile-bound (a 6 s compile)
    stock = [run("stock", [("k", 9.0, 2.0, 0.9), ("c", 12.0, 0.5, 6.0)])]
    use = [run("use", [("k", 2.2, 2.0, 0.1), ("c", 6.6, 0.5, 6.1)])]
    lines = bench.against_floor(
        {("x", "stock"): stock, ("x", "use"): use}, "x", ["use"], ["m.k", "m.c"]
    )
    assert "| `k` | 0.90 | 2.20 [2.00] | 1.10× |" in lines
    assert "| `c` | 6.00 | 6.60 [6.00] | 1.10× |" in lines
    assert "| all kernels | | 8.80 [8.00] | 1.10× |" in lines


def test_runs_saved_by_an_earlier_call_are_loaded_for_the_libraries_and_modes_asked(
    tmp_path: Path,
) -> None:
    import json

    saved = tmp_path / "runs.jsonl"
    runs = [
        {"library": "fla", "mode": "stock", "step_s": 1.0},
        {"library": "fla", "mode": "use", "step_s": 0.5},
        {"library": "liger", "mode": "stock", "step_s": 2.0},
    ]
    saved.write_text("".join(json.dumps(r) + "\n" for r in runs))
    loaded = bench.load_results(saved, ["fla"], ["stock", "use"])
    assert loaded == {("fla", "stock"): [runs[0]], ("fla", "use"): [runs[1]]}
    assert bench.load_results(tmp_path / "none.jsonl", ["fla"], ["stock"]) == {}


def test_help_and_plan_run_without_a_gpu() -> None:
    for argv in (["--help"], ["--plan", "--rounds", "2", "--libraries", "fla"]):
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.triton_library_bench", *argv],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        "round 1: fla stock",
        "round 1: fla use",
        "round 1: fla install",
    ]


# -- the small ops (--libraries small) ----------------------------------------------------------


def test_the_small_ops_are_the_examples_ops() -> None:
    from precompile_executor.examples import library_kernels

    assert bench.SMALL == library_kernels.OPS == tuple(library_kernels.KERNELS)
    for forward, backward in library_kernels.KERNELS.values():
        assert len(forward.configs) >= 18 and len(backward.configs) >= 18
    # use() and install() screen by default; the opt-out is a mode of its own, run when asked.
    assert "use" in bench.DEFAULT_MODES and "unscreened" not in bench.DEFAULT_MODES


_INTERPRETED_OPS = """
import torch
from precompile_executor.examples import library_kernels as lk

for forward, backward in lk.KERNELS.values():
    for kernel in (forward, backward):
        kernel.configs = kernel.configs[:1]  # one config: no benchmark in the interpreter
torch.manual_seed(0)
M, N = 37, 96  # neither a power of two: the masks are exercised
x, dy, w, b, a2 = torch.randn(M, N), torch.randn(M, N), torch.randn(N), torch.randn(N), torch.randn(M, N)
alpha = torch.tensor([0.5])

def empty(shape, like, dtype=None):
    return torch.empty(shape, dtype=like.dtype if dtype is None else getattr(torch, dtype))

def reference(fn, *inputs):
    inputs = [t.clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    out.backward(dy)
    return [out.detach()] + [t.grad.reshape(-1) if t.dim() == 1 else t.grad for t in inputs]

def ours(op, *inputs):
    y, backward = op(*inputs, empty)
    grads = backward(dy)
    grads = grads if isinstance(grads, tuple) else (grads,)
    return [y] + [g.reshape(-1) if g.dim() <= 1 else g for g in grads]

cases = {
    "rmsnorm": (lk.rmsnorm, (x, w),
                lambda x, w: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w),
    "layernorm": (lk.layernorm, (x, w, b),
                  lambda x, w, b: torch.nn.functional.layer_norm(x, (N,), w, b, 1e-5)),
    "softmax": (lk.softmax, (x,), lambda x: torch.softmax(x, -1)),
    "scan": (lk.scan, (x,), lambda x: torch.cumsum(x, -1)),
    "swiglu": (lk.swiglu, (x, a2), lambda a, b: torch.nn.functional.silu(a) * b),
    "dyt": (lk.dyt, (x, alpha, w, b), lambda x, a, g, bt: g * torch.tanh(a * x) + bt),
}
assert sorted(cases) == sorted(lk.OPS)
for name, (op, inputs, fn) in cases.items():
    for i, (got, want) in enumerate(zip(ours(op, *inputs), reference(fn, *inputs), strict=True)):
        err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))
        assert err < 1e-4, (name, i, err)
    print(name, "ok")
"""


@pytest.mark.timeout(300)
def test_the_small_ops_match_torch_forward_and_backward_in_tritons_interpreter() -> None:
    import os

    done = subprocess.run(
        [sys.executable, "-c", _INTERPRETED_OPS],
        cwd=REPO,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [word for op in bench.SMALL for word in (op, "ok")]


def test_worse_choices_are_counted_per_run_against_stocks_choice() -> None:
    row = {
        "kernel": "m.scan_fwd_kernel",
        "key": "(8192, 4096)",
        "ms": {"stock": 1.0, "use": 1.005},
        "rounds_ms": {"stock": [1.0, 1.02, 1.0], "use": [1.005, 1.0, 1.03]},
    }
    assert bench.worse_runs(row) == {"stock": 1, "use": 1}
    run = {"forward_s": 1.0, "tune_s": 1.0, "floor_s": 0.5, "tunes": [], "executor": {}}
    results = {
        ("scan", "stock"): [{**run, "step_s": 9.0, "process_s": 12.0}] * 3,
        ("scan", "use"): [{**run, "step_s": 3.0, "process_s": 7.0}] * 3,
    }
    checks = {"scan": {"keys": 2, "matched": 2, "checks": [row]}}
    (line,) = bench.acceptance(results, checks)
    assert line.startswith("MISSED: scan use") and "1.71×" in line and "1 runs" in line
    row["rounds_ms"]["use"] = [1.005] * 3
    (line,) = bench.acceptance(results, checks)
    assert line.startswith("MET: scan use")
    text = bench.report(results, checks, "machine")
    assert "## Acceptance (the small ops)" in text
    assert "| `scan_fwd_kernel` | (8192, 4096) | 1.0000 | 1.0050 | 1.00× | 1, 0 |" in text


@pytest.mark.timeout(600)
def test_the_small_ops_benchmark_runs_end_to_end_in_a_dry_run(tmp_path: Path) -> None:
    """``--dry-run --libraries softmax --modes stock,use,unscreened``: stock, ``use()`` (screening)
    and ``use(screening=False)`` on a dry-run sm_90 (every compile real, two configs per kernel),
    the check, the acceptance lines."""
    out = tmp_path / "report.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.triton_library_bench",
            "--dry-run",
            "--libraries",
            "softmax",
            "--modes",
            "stock,use,unscreened",
            "--rounds",
            "1",
            "--alternations",
            "1",
            "--out",
            str(out),
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    assert "FAILED" not in done.stdout and "failed:" not in text
    assert "| stock |" in text and "| use |" in text and "| unscreened |" in text
    assert "Chosen-kernel check" in text and "not run" not in text
    assert "## Acceptance (the small ops)" in text
    assert ": softmax use" in text and ": softmax unscreened" in text
    assert "**DRY RUN**" in text


def test_the_tma_layer_runs_end_to_end_compile_only_in_a_dry_run() -> None:
    """``--dry-run``: the TMA GEMM layer's first step under ``use()`` on a dry-run sm_90 (every
    compile real, two configs per kernel): the three kernels tune, no launch missed the
    workers' compiles, and the report renders where each config compiled."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.triton_library_bench", "--libraries", "tma-gemm",
         "--modes", "use", "--rounds", "1", "--no-check", "--dry-run", "--timeout", "150"],
        cwd=REPO, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "FAILED" not in done.stdout, done.stdout[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| `_linear_silu")]
    compiled = {r.split("|")[1].strip(" `"): r for r in rows if "| use | 1 |" in r}
    assert set(compiled) == {"_linear_silu_fwd", "_linear_silu_bwd_dx", "_linear_silu_bwd_dw"}
    for row in compiled.values():
        cells = [c.strip() for c in row.strip("|").split("|")]
        # workers + caller lanes + the tune's thread: each of the 2 configs compiled once
        assert sum(int(c) for c in cells[3:6]) == 2, row
        # none failed, none identical (TMA configs with a pre_hook are never merged), none
        # screened (two configs: every one could be a finalist), none stock
        assert cells[6:] == ["0", "0", "0", "0", "0", "0", "0 of 1"], row
