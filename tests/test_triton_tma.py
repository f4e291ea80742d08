"""TMA-descriptor kernels whose configs' ``pre_hook`` sets the block shapes, compiled in workers.

The pattern of Triton's persistent-matmul tutorial and of Liger-Kernel's fused MLPs: the launch
passes host ``triton.tools.tensor_descriptor.TensorDescriptor`` objects built with a dummy block
shape, and each config's ``pre_hook`` sets the real one before the config's launch, so the
launch's signature (``tensordesc<bf16[64, 32]>``) is the hook's. Every compile is real (Triton
for sm_90, no GPU); the autotunes run on a dry-run sm_90 GPU (``tests/dry_run_gpu.py``) whose
loads record each kernel's signature. The test kernel reshapes its tile to ``BLOCK_M *
BLOCK_N`` elements, so a compile for the dummy ``[1, 1]`` block fails as it does in the wild
(``reshape() cannot change total number of elements``).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
tensor_descriptor = pytest.importorskip("triton.tools.tensor_descriptor")

from dry_run_gpu import DryRunGPU, FakeTensor, installed  # noqa: E402
from triton import knobs  # noqa: E402

from precompile_executor import PrecompileExecutor  # noqa: E402
from precompile_executor.triton import (  # noqa: E402
    TensorSpec,
    classify,
    launch,
    warm,
)
from precompile_executor.triton import autotune as pe_autotune  # noqa: E402
from precompile_executor.triton._worker import compile_request  # noqa: E402

TensorDescriptor = tensor_descriptor.TensorDescriptor
TASK_TIMEOUT_S = 120.0
LOGGER = "precompile_executor.triton.autotune"
REPO_ROOT = Path(__file__).resolve().parent.parent
GRID = (1, 1)
SIZE = 256

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.usefixtures("release_idle_workers", "triton_compiles_in_workers_only"),
]


@triton.jit
def tma_scale(x_desc, y_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    om = tl.program_id(0) * BLOCK_M
    on = tl.program_id(1) * BLOCK_N
    tile = tl.reshape(x_desc.load([om, on]), (BLOCK_M * BLOCK_N,))
    y_desc.store([om, on], tl.reshape(tile * 2, (BLOCK_M, BLOCK_N)))


BLOCKS = [(64, 32), (32, 64), (64, 64)]
TIMES_MS = {(64, 32): 2.0, (32, 64): 1.0, (64, 64): 3.0}
"""The timing the fake benchmark gives each config: (32, 64) wins."""


class HookLog:
    """A config ``pre_hook`` that sets both descriptors' block shapes from the config, and
    records on which objects it ran."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, tuple[int, ...]]] = []

    def __call__(self, nargs: dict[str, Any]) -> None:
        shape = [nargs["BLOCK_M"], nargs["BLOCK_N"]]
        for name in ("x_desc", "y_desc"):
            nargs[name].block_shape = list(shape)
        self.calls.append((id(nargs["x_desc"]), tuple(shape)))


class SignatureGPU(DryRunGPU):
    """A dry-run sm_90 GPU whose launches also record the kernel's signature."""

    def _launcher(self, src: Any, metadata: Any) -> Any:
        inner = super()._launcher(src, metadata)
        signature = dict(src.signature)

        def launch(*args: Any) -> None:
            inner(*args)
            self.launches[-1]["signature"] = signature

        return launch


class RecordingPool(PrecompileExecutor):
    """A ``PrecompileExecutor`` that keeps every compile request it is given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[Any] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if fn is compile_request:
            self.requests.append(args[0])
        return super().submit(fn, *args, **kwargs)


class Bench:
    """A ``do_bench=``: one launch through Triton's path, a timing chosen by the test."""

    def __init__(self, gpu: DryRunGPU) -> None:
        self.gpu = gpu

    def __call__(self, kernel_call: Any, quantiles: Any = None) -> list[float]:
        kernel_call()
        launched = self.gpu.launches[-1]
        return [TIMES_MS.get((launched["BLOCK_M"], launched["BLOCK_N"]), 5.0)] * 3


class CallerCompiles:
    """Every ``triton.compile`` this process ran itself (not a cache hit): its signature."""

    def __init__(self) -> None:
        self.signatures: list[dict[str, str]] = []

    def __call__(
        self, *, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool
    ) -> None:
        if not cache_hit:
            self.signatures.append(dict(src.signature))


@pytest.fixture(scope="module")
def pool() -> Iterator[RecordingPool]:
    with RecordingPool(2, timeout=TASK_TIMEOUT_S, classify=classify) as executor:
        yield executor


@pytest.fixture
def gpu(tmp_path: Path) -> Iterator[SignatureGPU]:
    with installed(SignatureGPU(), tmp_path / "caller-cache", (tma_scale, tma_scale_sized)) as g:
        yield g


@pytest.fixture
def caller_compiles() -> Iterator[CallerCompiles]:
    log = CallerCompiles()
    with knobs.compilation.scope():
        knobs.compilation.listener = log
        yield log


def _descriptors(size: int = SIZE) -> tuple[Any, Any]:
    """The launch's descriptors, with the dummy block shape the hooks replace."""
    return tuple(  # type: ignore[return-value]
        TensorDescriptor(FakeTensor(tl.bfloat16), [size, size], [size, 1], [1, 1]) for _ in range(2)
    )


def _autotuned(gpu: DryRunGPU, hook: HookLog) -> Any:
    configs = [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4, pre_hook=hook) for m, n in BLOCKS
    ]
    return triton.autotune(configs=configs, key=[], do_bench=Bench(gpu))(tma_scale)


def _desc_type(block: tuple[int, int]) -> str:
    return f"tensordesc<bf16[{block[0]}, {block[1]}]>"


@pytest.mark.parametrize("how", ["use", "install"])
def test_tma_configs_whose_pre_hooks_set_block_shapes_compile_in_workers(
    how: str,
    pool: RecordingPool,
    gpu: SignatureGPU,
    caller_compiles: CallerCompiles,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hook = HookLog()
    kernel = _autotuned(gpu, hook)
    x_desc, y_desc = _descriptors()
    sent_before = len(pool.requests)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        if how == "use":
            with pe_autotune.use(pool):
                kernel[GRID](x_desc, y_desc)
        else:
            pe_autotune.install(pool)
            try:
                kernel[GRID](x_desc, y_desc)
            finally:
                pe_autotune.uninstall()
    # Nothing compiled here; each request's signature is its launch's, the hook's block shape.
    assert caller_compiles.signatures == []
    requests = pool.requests[sent_before:]
    assert sorted(r.signature["x_desc"] for r in requests) == sorted(map(_desc_type, BLOCKS))
    launched = {(c["BLOCK_M"], c["BLOCK_N"]): c["signature"] for c in gpu.launches}
    assert sorted(map(str, (dict(r.signature) for r in requests))) == sorted(
        map(str, launched.values())
    )
    assert kernel.best_config.kwargs == {"BLOCK_M": 32, "BLOCK_N": 64}
    # The hook ran once per config on copies, and on the caller's descriptors only when Triton
    # ran it: before each benchmark launch and the final one.
    on_copies = [shape for obj, shape in hook.calls if obj != id(x_desc)]
    on_callers = [shape for obj, shape in hook.calls if obj == id(x_desc)]
    assert sorted(on_copies) == sorted(BLOCKS)
    assert len(on_callers) == len(gpu.launches)
    stats = pe_autotune.statistics()[f"{__name__}.tma_scale"]
    assert (stats.tunes, stats.workers, stats.caller, stats.failed) == (1, 3, 0, 0)
    assert stats.stock_reason is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_warm_compiles_tma_configs_for_the_block_shapes_their_hooks_set(
    pool: RecordingPool, tmp_path: Path
) -> None:
    hook = HookLog()
    configs = [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4, pre_hook=hook) for m, n in BLOCKS
    ]
    kernel = triton.autotune(configs=configs, key=[])(tma_scale)
    spec = TensorSpec("bf16", (SIZE, SIZE))
    x_desc, y_desc = spec.descriptor(), spec.descriptor()
    sent_before = len(pool.requests)
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path / "cache")
        report = warm({kernel: [launch(x_desc, y_desc)]}, target="cuda:90", executor=pool)
    assert [r.status for r in report.results] == ["ok"] * 3, [r.error for r in report.results]
    requests = pool.requests[sent_before:]
    assert sorted(r.signature["y_desc"] for r in requests) == sorted(map(_desc_type, BLOCKS))
    assert x_desc.block_shape == [1, 1] and y_desc.block_shape == [1, 1]  # the caller's, as given
    assert sorted(shape for _, shape in hook.calls) == sorted(BLOCKS)


_CLI_MODULE = """
import triton
import triton.language as tl
from precompile_executor.triton import TensorSpec, launch


def set_blocks(nargs):
    for name in ("x_desc", "y_desc"):
        nargs[name].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_N"]]


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, pre_hook=set_blocks)
        for m, n in ((64, 32), (32, 64), (64, 64))
    ],
    key=[],
)
@triton.jit
def tma_scale(x_desc, y_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    om = tl.program_id(0) * BLOCK_M
    on = tl.program_id(1) * BLOCK_N
    tile = tl.reshape(x_desc.load([om, on]), (BLOCK_M * BLOCK_N,))
    y_desc.store([om, on], tl.reshape(tile * 2, (BLOCK_M, BLOCK_N)))


x = TensorSpec("bf16", (256, 256))
PRECOMPILE_SPECS = {"tma_scale": [launch(x.descriptor(), x.descriptor())]}
"""


def test_the_command_line_warms_tma_configs_for_their_hooks_block_shapes(tmp_path: Path) -> None:
    module = tmp_path / "tma_specs.py"
    module.write_text(textwrap.dedent(_CLI_MODULE))
    cache_dir = tmp_path / "cache"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    )
    result = subprocess.run(
        [sys.executable, "-m", "precompile_executor", "warm", str(module), "--target", "cuda:90",
         "--jobs", "2", "--cache-dir", str(cache_dir)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if "tma_scale" in line)
    assert [cell.strip() for cell in row.strip("│ ").split("│")][1:6] == ["3", "3", "0", "0", "0"]
    # Each compiled kernel's IR holds the descriptors' block type its hook set (3.6 writes
    # tensordesc<tensor<64x32xbf16>>, 3.9 tensordesc<64x32xbf16>).
    pattern = r"tensordesc<(?:tensor<)?(\d+)x(\d+)xbf16"
    blocks = sorted(
        sorted({(int(m), int(n)) for m, n in re.findall(pattern, p.read_text())})
        for p in cache_dir.rglob("tma_scale.ttir")
    )
    assert blocks == sorted([block] for block in BLOCKS)


def test_a_specialisation_no_hook_reproduces_warns_once_and_the_kernel_is_tuned_as_stock(
    pool: RecordingPool,
    gpu: SignatureGPU,
    caller_compiles: CallerCompiles,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An autotune-level pre_hook= (it replaces Triton's reset_to_zero/restore_value hook, so the
    # integration never runs it ahead of Triton) sets the block shapes: the compiles sent to the
    # workers keep the dummy [1, 1] and every launch misses them.
    def set_blocks(nargs: dict[str, Any], reset_only: bool = False) -> None:
        for name in ("x_desc", "y_desc"):
            nargs[name].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_N"]]

    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4) for m, n in BLOCKS]
    kernel = triton.autotune(
        configs=configs, key=["size"], pre_hook=set_blocks, do_bench=Bench(gpu)
    )(tma_scale_sized)
    sent_before = len(pool.requests)
    with caplog.at_level(logging.WARNING, logger=LOGGER), pe_autotune.use(pool):
        kernel[GRID](*_descriptors(), SIZE)
        sent_first = len(pool.requests) - sent_before
        # a new tuning key, and a new specialisation (not a multiple of 16): compiles again
        kernel[GRID](*_descriptors(2 * SIZE), 2 * SIZE + 1)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "tma_scale_sized" in message and "'x_desc'" in message
    assert _desc_type((1, 1)) in message
    # Each tune compiled each config here once; the second sent nothing to the workers.
    assert sent_first == len(BLOCKS) and len(pool.requests) - sent_before == sent_first
    blocks = sorted(s["x_desc"] for s in caller_compiles.signatures)
    assert blocks == sorted([*map(_desc_type, BLOCKS)] * 2)
    stats = pe_autotune.statistics()[f"{__name__}.tma_scale_sized"]
    assert stats.caller == len(BLOCKS) and stats.workers == 0
    assert stats.stock_tunes == 1 and stats.stock_reason == message
    assert kernel.best_config.kwargs == {"BLOCK_M": 32, "BLOCK_N": 64}


def test_a_screened_tune_that_falls_back_to_stock_times_every_config_in_full(
    pool: RecordingPool, gpu: SignatureGPU, caplog: pytest.LogCaptureFixture
) -> None:
    # The same miss, with screening asked for and Triton's default benchmarker (scripted): the
    # tune turns to stock after the first screen, and that screen is not left to compete with
    # Triton's full timings of the others (docs/triton.md, "Screening").
    def set_blocks(nargs: dict[str, Any], reset_only: bool = False) -> None:
        for name in ("x_desc", "y_desc"):
            nargs[name].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_N"]]

    timed = Bench(gpu)
    budgets: list[tuple[tuple[int, int], float]] = []

    def benchmarker(fn: Any, warmup: float = 25, rep: float = 100, **kwargs: Any) -> list[float]:
        result = timed(fn)
        budgets.append(((gpu.launches[-1]["BLOCK_M"], gpu.launches[-1]["BLOCK_N"]), rep))
        return result

    gpu.get_benchmarker = lambda: benchmarker  # type: ignore[attr-defined]
    blocks = [*BLOCKS, (32, 32)]  # more configs than could all be finalists: screened
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=4) for m, n in blocks]
    kernel = triton.autotune(configs=configs, key=["size"], pre_hook=set_blocks)(tma_scale_sized)
    with caplog.at_level(logging.WARNING, logger=LOGGER), pe_autotune.use(pool, screening=True):
        kernel[GRID](*_descriptors(), SIZE)
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    assert any(rep < 100 for _, rep in budgets)  # it did screen before the miss
    last = {block: rep for block, rep in budgets}
    assert sorted(last) == sorted(blocks) and set(last.values()) == {100}
    assert kernel.best_config.kwargs == {"BLOCK_M": 32, "BLOCK_N": 64}


@triton.jit
def tma_scale_sized(x_desc, y_desc, size, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    om = tl.program_id(0) * BLOCK_M
    on = tl.program_id(1) * BLOCK_N
    tile = tl.reshape(x_desc.load([om, on]), (BLOCK_M * BLOCK_N,))
    y_desc.store([om, on], tl.reshape(tile * 2, (BLOCK_M, BLOCK_N)))
