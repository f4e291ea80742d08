"""Triton integration: compile in worker processes, install in the caller's cache, use it here.

Every compile is real (Triton for an explicit ``cuda:90`` target works without a GPU). The caller's
cache is a fresh directory per test, so "cache hit" assertions can only pass if the artifacts the
workers sent were installed under the key this process computes.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from kernel_helpers import ADD_GELU_OPTIONS, add_gelu_signature

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from triton import knobs  # noqa: E402
from triton.compiler import ASTSource, CompiledKernel  # noqa: E402
from triton.runtime import _async_compile  # noqa: E402
from triton.runtime._async_compile import AsyncCompileMode  # noqa: E402
from triton.runtime.errors import OutOfResources, PTXASError  # noqa: E402

from precompile_executor import (  # noqa: E402
    PrecompileExecutor,
    RemoteError,
)
from precompile_executor.examples import kernels as examples  # noqa: E402
from precompile_executor.triton import (  # noqa: E402
    CacheKeyMismatchError,
    CompiledArtifacts,
    KernelTransferError,
    TensorSpec,
    UnsupportedTritonError,
    async_compile_executor,
    classify,
    compile_only_driver,
    install,
    kernel_ref,
    launch,
    parse_target,
    precompile,
    unwrap_jit_function,
    warm,
)

TARGET = "cuda:90"
RESULT_TIMEOUT_S = 90.0
"""Longest a test waits for one compile (a warm one takes well under 3 s)."""
TASK_TIMEOUT_S = 60.0
"""Per-task timeout of the test executors, so a hung compiler cannot hang a test."""


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 128}, num_warps=4),
        triton.Config({"BLOCK": 256}, num_warps=4),
        triton.Config({"BLOCK": 512}, num_warps=8, num_stages=2),
    ],
    key=["n"],
)
@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


@triton.autotune(
    configs=[
        triton.Config({"ASM": "mov.b32 $0, $1;", "BLOCK": 128}),  # compiles
        triton.Config({"ASM": "bogus.op $0, $1;", "BLOCK": 128}),  # ptxas rejects it
        triton.Config({"ASM": "mov.b32 $0, $1;", "BLOCK": 96}),  # tl.arange needs a power of 2
    ],
    key=[],
)
@triton.jit
def asm_kernel(x_ptr, n, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    y = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(x_ptr + offs, y, mask=offs < n)


@triton.autotune(configs=[triton.Config({"B": 128}, num_warps=4, maxnreg=16)], key=[])
@triton.jit
def starved_dot_kernel(a_ptr, c_ptr, B: tl.constexpr):
    r = tl.arange(0, B)
    a = tl.load(a_ptr + r[:, None] * B + r[None, :])
    tl.store(c_ptr + r[:, None] * B + r[None, :], tl.dot(a, a))


# -- fixtures -----------------------------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("release_idle_workers")


@pytest.fixture
def executor() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(2, timeout=TASK_TIMEOUT_S, classify=classify) as pool:
        yield pool


@pytest.fixture
def caller_cache(tmp_path: Path) -> Iterator[Path]:
    """Point this process's Triton cache at an empty directory for the test."""
    cache_dir = tmp_path / "caller-cache"
    with knobs.cache.scope():
        knobs.cache.dir = str(cache_dir)
        yield cache_dir


class CompileLog:
    """Records every ``triton.compile`` in this process: (kernel name, hash, cache hit)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []

    def __call__(
        self, *, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool
    ) -> None:
        self.events.append((src.name, metadata["hash"], cache_hit))

    @property
    def misses(self) -> list[tuple[str, str, bool]]:
        return [e for e in self.events if not e[2]]


@pytest.fixture
def compile_log() -> Iterator[CompileLog]:
    log = CompileLog()
    with knobs.compilation.scope():
        knobs.compilation.listener = log
        yield log


def _worker_pids() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


@contextmanager
def _stand_in_driver(kernel: Any) -> Iterator[Any]:
    """The compile-only driver for TARGET; forget ``kernel``'s caches for it afterwards."""
    with compile_only_driver(parse_target(TARGET)) as stand_in:
        try:
            yield stand_in
        finally:
            unwrap_jit_function(kernel).device_caches.pop(stand_in.device, None)


def _replay_configs(kernel: Any, *args: Any) -> None:
    """Run the JIT's launch path (up to the compile) for every config, in this process."""
    with _stand_in_driver(kernel):
        for config in kernel.configs:
            kernel.fn.warmup(*args, grid=(1,), **config.all_kwargs())


# -- targets ------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("cuda:90", ("cuda", 90, 32)),
        ("cuda:90:32", ("cuda", 90, 32)),
        ("CUDA:sm_80", ("cuda", 80, 32)),
        ("hip:gfx942", ("hip", "gfx942", 64)),
        ("hip:gfx1100", ("hip", "gfx1100", 32)),
    ],
)
def test_parse_target_accepts_the_documented_forms(spec: str, expected: tuple[Any, ...]) -> None:
    target = parse_target(spec)
    assert (target.backend, target.arch, target.warp_size) == expected


@pytest.mark.timeout(30)
@pytest.mark.parametrize("spec", ["cuda", "cuda:", "sm_90", "cuda:ninety", "metal:3", 90])
def test_parse_target_rejects_others_naming_the_accepted_forms(spec: Any) -> None:
    with pytest.raises(ValueError, match="cuda:90"):
        parse_target(spec)


# -- precompile: one kernel, artifacts to the caller's cache ------------------------------------


@pytest.mark.timeout(120)
def test_precompile_in_a_worker_makes_the_callers_compile_a_cache_hit(
    executor: PrecompileExecutor, caller_cache: Path, compile_log: CompileLog
) -> None:
    kernel = examples.add_gelu_kernel.fn
    signature = add_gelu_signature("fp16")
    options = ADD_GELU_OPTIONS
    job = precompile(
        kernel, signature, {"BLOCK_SIZE": 1024}, target=TARGET, options=options, executor=executor
    )
    compiled = job.result(timeout=RESULT_TIMEOUT_S)

    assert isinstance(compiled, CompiledKernel)
    assert job.artifacts is not None and not job.cached
    assert job.artifacts.worker_pid != os.getpid()
    assert job.artifacts.loaded_by == "reference"
    assert compiled.hash == job.request.expected_hash
    assert compiled.asm["cubin"] and "ptx" in compiled.asm
    # The caller's cache holds the group (the worker wrote only to its private directory).
    assert all(Path(p).is_relative_to(caller_cache) for p in compiled.metadata_group.values())
    assert compile_log.events == []  # nothing compiled in this process so far

    again = triton.compile(
        ASTSource(kernel, signature, {"BLOCK_SIZE": 1024}),
        target=parse_target(TARGET),
        options=options,
    )
    assert compile_log.events == [(kernel.__name__, compiled.hash, True)]
    assert again.asm["cubin"] == compiled.asm["cubin"]


@pytest.mark.timeout(120)
def test_a_cached_compile_submits_no_task(executor: PrecompileExecutor, caller_cache: Path) -> None:
    kernel = examples.add_gelu_kernel.fn
    signature = add_gelu_signature("fp32")
    first = precompile(kernel, signature, {"BLOCK_SIZE": 256}, target=TARGET, executor=executor)
    first.result(timeout=RESULT_TIMEOUT_S)
    second = precompile(kernel, signature, {"BLOCK_SIZE": 256}, target=TARGET, executor=executor)
    forced = precompile(
        kernel, signature, {"BLOCK_SIZE": 256}, target=TARGET, executor=executor, force=True
    )
    assert second.done() and second.cached and second.artifacts is None
    assert second.result(timeout=1).hash == first.result(timeout=1).hash
    assert forced.result(timeout=RESULT_TIMEOUT_S).hash == first.result(timeout=1).hash
    assert not forced.cached and forced.artifacts is not None


@pytest.mark.timeout(120)
def test_a_kernel_defined_in_a_function_travels_by_source(
    executor: PrecompileExecutor, caller_cache: Path, compile_log: CompileLog
) -> None:
    @triton.jit
    def local_fill(out_ptr, value, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.full((BLOCK,), value, tl.float32))

    assert "<locals>" in local_fill.fn.__qualname__
    signature = {"out_ptr": "*fp32", "value": "fp32", "BLOCK": "constexpr"}
    job = precompile(local_fill, signature, {"BLOCK": 64}, target=TARGET, executor=executor)
    compiled = job.result(timeout=RESULT_TIMEOUT_S)
    assert job.artifacts is not None and job.artifacts.loaded_by == "source"
    assert job.artifacts.worker_pid != os.getpid()
    triton.compile(ASTSource(local_fill, signature, {"BLOCK": 64}), target=parse_target(TARGET))
    assert compile_log.events == [("local_fill", compiled.hash, True)]


_FILE_MODULE = """
import triton
import triton.language as tl

FACTOR = tl.constexpr(3)


@triton.jit
def helper(x):
    return x * FACTOR


@triton.jit
def tripled(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, helper(tl.load(x_ptr + offs)))
"""


@pytest.mark.timeout(120)
def test_a_kernel_from_a_file_workers_cannot_import_travels_with_its_dependencies(
    executor: PrecompileExecutor, caller_cache: Path, tmp_path: Path, compile_log: CompileLog
) -> None:
    path = tmp_path / "file_kernels.py"
    path.write_text(textwrap.dedent(_FILE_MODULE))
    name = f"pe_test_file_kernels_{uuid.uuid4().hex}"  # importable here only
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "BLOCK": "constexpr"}
        job = precompile(module.tripled, signature, {"BLOCK": 32}, target=TARGET, executor=executor)
        compiled = job.result(timeout=RESULT_TIMEOUT_S)
        assert job.artifacts is not None and job.artifacts.loaded_by == "source"
        triton.compile(
            ASTSource(module.tripled, signature, {"BLOCK": 32}), target=parse_target(TARGET)
        )
        assert compile_log.events == [("tripled", compiled.hash, True)]
    finally:
        sys.modules.pop(name, None)


class _Unpicklable:
    """Deep-copies (Triton copies global values it hashes) but refuses to pickle."""

    def __deepcopy__(self, memo: Any) -> _Unpicklable:
        return self

    def __reduce__(self) -> Any:
        raise TypeError("this object refuses to be pickled")


@pytest.mark.timeout(30)
def test_a_kernel_that_cannot_travel_is_refused_in_the_caller_with_the_reason() -> None:
    blob = _Unpicklable()

    @triton.jit
    def uses_blob(x_ptr):
        if blob is None:
            tl.store(x_ptr, 1)

    with pytest.raises(KernelTransferError, match=r"'blob'.*does not pickle"):
        kernel_ref(uses_blob)


@pytest.mark.timeout(60)
def test_a_thread_pool_compiles_straight_into_the_callers_cache(caller_cache: Path) -> None:
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    with ThreadPoolExecutor(2) as threads:
        job = precompile(scale_kernel, signature, {"BLOCK": 128}, target=TARGET, executor=threads)
        compiled = job.result(timeout=RESULT_TIMEOUT_S)
    assert job.artifacts is not None and job.artifacts.worker_pid == os.getpid()
    assert all(Path(p).is_relative_to(caller_cache) for p in compiled.metadata_group.values())


@pytest.mark.timeout(120)
def test_a_queued_compile_rerouted_to_threads_compiles_once_there_and_finishes_its_job(
    caller_cache: Path, compile_log: CompileLog
) -> None:
    # Workers that stay in their initializer: the tasks stay queued until rerouted.
    pool = PrecompileExecutor(1, initializer=time.sleep, initargs=(600.0,), timeout=60)
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    try:
        with ThreadPoolExecutor(1) as threads:
            job = precompile(scale_kernel, signature, {"BLOCK": 128}, target=TARGET, executor=pool)
            queued = job.task_future
            moved = job.reroute(threads)
            assert moved is not None and job.task_future is moved and job.rerouted
            assert queued is not None and queued.cancelled() and not job.future.cancelled()
            compiled = job.result(timeout=RESULT_TIMEOUT_S)
            assert job.reroute(threads) is None  # done: nothing left to move

            dropped = precompile(
                scale_kernel, signature, {"BLOCK": 256}, target=TARGET, executor=pool
            )
            assert dropped.future.cancel()
            assert dropped.reroute(threads) is None and not dropped.rerouted
        stats = pool.statistics()
    finally:
        pool.terminate_workers()
    assert isinstance(compiled, CompiledKernel) and compiled.hash == job.request.expected_hash
    assert job.artifacts is not None and job.artifacts.worker_pid == os.getpid()
    assert [hash_ for _, hash_, _ in compile_log.misses] == [compiled.hash]  # once, in the thread
    assert (stats.completed, stats.cancelled) == (0, 2)


@pytest.mark.timeout(30)
def test_install_refuses_artifacts_hashed_differently(caller_cache: Path) -> None:
    artifacts = CompiledArtifacts(
        hash="a" * 64,
        metadata_filename="k.json",
        files={"k.json": b"{}"},
        compile_time_s=0.1,
        worker_pid=1,
        loaded_by="reference",
    )
    with pytest.raises(CacheKeyMismatchError, match="same installation"):
        install(artifacts, expected="b" * 64)
    assert not caller_cache.exists() or not any(caller_cache.rglob("k.json"))


# -- AsyncCompileMode ---------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_async_compile_mode_with_a_process_pool_fails_without_the_adapter(
    executor: PrecompileExecutor, caller_cache: Path
) -> None:
    """The problem the adapter solves: Triton's compile closure does not pickle."""
    x = TensorSpec("fp32", (1024,))
    mode = AsyncCompileMode(executor)
    try:
        with pytest.raises(TypeError, match="RLock"), _stand_in_driver(scale_kernel), mode:
            scale_kernel.fn.warmup(x, x, 1024, grid=(1,), BLOCK=64)
    finally:
        if _async_compile.active_mode.get() is mode:  # Triton 3.6 leaves it set when exit raises
            _async_compile.active_mode.set(None)


@pytest.mark.timeout(120)
def test_async_compile_mode_compiles_in_worker_processes_and_returns_compiled_kernels(
    executor: PrecompileExecutor, caller_cache: Path, compile_log: CompileLog
) -> None:
    adapter = async_compile_executor(executor)
    x, out = TensorSpec("fp32", (4096,)), TensorSpec("fp32", (4096,))
    with _stand_in_driver(scale_kernel) as stand_in:
        with AsyncCompileMode(adapter):
            pending = [
                scale_kernel.fn.warmup(x, out, 4096, grid=(1,), **c.all_kwargs())
                for c in scale_kernel.configs
            ]
        cached = list(scale_kernel.fn.device_caches[stand_in.device][0].values())

    kernels = [p.result() for p in pending]
    assert all(isinstance(k, CompiledKernel) for k in kernels)
    assert {k.hash for k in kernels} == {j.request.expected_hash for j in adapter.jobs}
    assert len(adapter.jobs) == len(scale_kernel.configs) == 3
    # Compiled in worker processes (children of this one), not in threads of this process.
    pids = {job.artifacts.worker_pid for job in adapter.jobs if job.artifacts is not None}
    assert len(pids) >= 1 and os.getpid() not in pids
    assert pids <= _worker_pids()
    assert compile_log.events == []  # this process compiled nothing...
    assert sorted(k.hash for k in cached) == sorted(k.hash for k in kernels)  # ...but has them
    assert all(k.asm["cubin"] for k in kernels)


@pytest.mark.timeout(30)
def test_the_adapter_refuses_anything_but_tritons_compile_closure(
    executor: PrecompileExecutor,
) -> None:
    adapter = async_compile_executor(executor)
    with pytest.raises(TypeError, match="only runs the compile closures"):
        adapter.submit(len, [])

    def make_closure() -> Any:
        src = "not an ASTSource"

        def async_compile() -> str:
            return src

        async_compile.__module__ = "triton.runtime.jit"
        return async_compile

    with pytest.raises(UnsupportedTritonError, match="src: str"):
        adapter.submit(make_closure())
    assert adapter.jobs == ()


# -- warm: every autotune config, with the keys the launch computes -----------------------------


@pytest.mark.timeout(180)
def test_warm_compiles_every_config_under_the_keys_the_launch_looks_up(
    executor: PrecompileExecutor, caller_cache: Path, compile_log: CompileLog
) -> None:
    x, out = TensorSpec("fp32", (4096,)), TensorSpec("fp32", (4096,))
    rows, cols = 64, 1000  # softmax: heuristics derive BLOCK_SIZE from n_cols
    sx, sy = TensorSpec("fp16", (rows, cols)), TensorSpec("fp16", (rows, cols))
    specs = {
        scale_kernel: [launch(x, out, 4096)],
        examples.softmax_kernel: [launch(sy, sx, sx.stride(0), sy.stride(0), rows, cols)],
    }
    seen: list[str] = []
    report = warm(
        specs, target=TARGET, executor=executor, on_result=lambda r: seen.append(r.kernel)
    )

    expected = len(scale_kernel.configs) + len(examples.softmax_kernel.configs)
    assert [r.status for r in report.results] == ["ok"] * expected
    assert len(seen) == expected and report.target == "cuda:90:32"
    assert report.compile_time_s > 0 and report.wall_time_s > 0
    assert all(r.worker_pid not in (None, os.getpid()) for r in report.results)
    assert compile_log.events == []

    # Replaying the JIT's own launch path finds every config compiled: hits only.
    _replay_configs(scale_kernel, x, out, 4096)
    _replay_configs(examples.softmax_kernel, sy, sx, sx.stride(0), sy.stride(0), rows, cols)
    assert len(compile_log.events) == expected and compile_log.misses == []

    # Specialisation is part of the key: a misaligned pointer and n % 16 != 0 are new compiles.
    _replay_configs(scale_kernel, TensorSpec("fp32", (4095,), aligned=False), out, 4095)
    assert len(compile_log.misses) == len(scale_kernel.configs)

    again = warm(specs, target=TARGET, executor=executor)
    assert [r.status for r in again.results] == ["cached"] * expected


@pytest.mark.timeout(120)
def test_warm_reports_real_compile_failures_with_their_classification(
    executor: PrecompileExecutor, caller_cache: Path
) -> None:
    x = TensorSpec("i32", (128,))
    a, c = TensorSpec("fp16", (128, 128)), TensorSpec("fp32", (128, 128))
    report = warm(
        {asm_kernel: [launch(x, 128)], starved_dot_kernel: [launch(a, c)]},
        target=TARGET,
        executor=executor,
    )

    statuses = [(r.status, r.classification) for r in report.results]
    assert statuses == [("ok", None), ("failed", "warn"), ("failed", "raise"), ("failed", "debug")]
    bad_asm, bad_block, starved = (r.error for r in report.results[1:])
    # The executor's proxies keep the original class where it imports, and its name regardless.
    assert isinstance(bad_asm, PTXASError) and isinstance(bad_asm, RemoteError)
    assert "bogus" in str(bad_asm)
    assert getattr(bad_block, "exc_type", None) == "CompilationError"
    assert "power of 2" in str(bad_block)
    assert isinstance(starved, PTXASError) and "Insufficient registers" in str(starved)
    assert [r.config for r in report.unexpected_failures] == [report.results[2].config]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_warm_reports_a_compile_over_its_timeout_as_timed_out(
    executor: PrecompileExecutor, caller_cache: Path
) -> None:
    a = TensorSpec("fp16", (1024, 1024))
    config = examples.matmul_kernel.configs[0].all_kwargs()  # a ~1 s compile
    matmul = examples.matmul_kernel.fn  # a plain JITFunction: one "config", from the kwargs
    report = warm(
        {matmul: [launch(a, a, a, 1024, 1024, 1024, 1024, 1, 1024, 1, 1024, 1, **config)]},
        target=TARGET,
        executor=executor.options(timeout=0.05),
    )
    assert [(r.status, r.classification) for r in report.results] == [("timed out", "warn")]
    assert isinstance(report.results[0].error, TimeoutError)


@pytest.mark.timeout(30)
def test_tensor_spec_mirrors_what_specialisation_reads() -> None:
    spec = TensorSpec("bf16", (4, 6, 8))
    assert spec.stride() == (48, 8, 1) and spec.stride(1) == 8 and spec.size(0) == 4
    assert str(spec.dtype) == "bf16" and spec.element_size() == 2 and spec.numel() == 192
    assert spec.data_ptr() % 16 == 0
    assert TensorSpec("float16", (8,), aligned=False).data_ptr() % 16 != 0
    assert str(TensorSpec("i32", (2,)).dtype) == "int32"
    assert TensorSpec(tl.float8e4nv, (2, 2), (1, 2)).stride() == (1, 2)
    with pytest.raises(ValueError, match="unknown dtype"):
        TensorSpec("float17", (2,))
    with pytest.raises(ValueError, match="strides"):
        TensorSpec("fp32", (2, 2), (1,))
    for shape in ("16", 16, (2.5, 4), (-1, 4)):  # "16" is not (1, 6), nor 2.5 a size
        with pytest.raises((TypeError, ValueError), match="shape must be a sequence of sizes"):
            TensorSpec("fp32", shape)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", ["pool", 42])
def test_warm_and_the_adapter_refuse_what_is_not_an_executor_or_a_mapping(bad: Any) -> None:
    with pytest.raises(TypeError, match=r"concurrent\.futures\.Executor"):
        async_compile_executor(bad)
    with pytest.raises(TypeError, match=r"concurrent\.futures\.Executor"):
        warm({}, target=TARGET, executor=bad)
    with pytest.raises(TypeError, match=r"specs must be a mapping of kernel to launches"):
        warm([bad], target=TARGET)  # type: ignore[arg-type]


# -- classify -----------------------------------------------------------------------------------


def _proxy_named(name: str, message: str) -> RemoteError:
    """A proxy whose original class could not be imported in the parent."""
    exc = RemoteError(message)
    exc.exc_type = name
    exc.exc_module = "some.missing.module"
    return exc


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (OutOfResources(262144, 232448, "shared memory"), "debug"),
        (PTXASError("(C7602) Insufficient registers (24) to compile instruction"), "debug"),
        (RuntimeError("CUDA error: out of memory"), "debug"),
        (_proxy_named("OutOfResources", "resource exhausted"), "debug"),
        (PTXASError("ptxas fatal: Unknown modifier"), "warn"),
        (RuntimeError("PassManager::run failed"), "warn"),
        (_proxy_named("PTXASError", "Internal Triton PTX codegen error"), "warn"),
        (TimeoutError("compile took too long"), "warn"),
        (KeyError("BLOCK"), "raise"),
        (ValueError("arange's range must be a power of 2"), "raise"),
        (_proxy_named("CompilationError", "at 2:11: bad"), "raise"),
    ],
)
def test_classify(exc: BaseException, expected: str) -> None:
    assert classify(exc) == expected


# -- GPU (run on a CUDA machine; skipped elsewhere) ---------------------------------------------


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and torch")
@pytest.mark.timeout(300)
def test_gpu_autotuner_first_call_compiles_nothing_after_warm(
    executor: PrecompileExecutor, caller_cache: Path, compile_log: CompileLog
) -> None:
    import torch

    m = n = k = 512
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    kernel = examples.matmul_kernel
    # Warm for this GPU's target through the compile-only driver: disk cache only.
    gpu_target = triton.runtime.driver.active.get_current_target()
    report = warm(
        {kernel: [launch(a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())]},
        target=gpu_target,
        executor=executor,
    )
    assert report.count("ok") == len(kernel.configs), [str(r.error) for r in report.results]

    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    kernel[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())
    torch.cuda.synchronize()
    assert len(compile_log.events) == len(kernel.configs)
    assert compile_log.misses == []
    torch.testing.assert_close(c, a @ b, atol=1e-1, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and torch")
@pytest.mark.timeout(300)
def test_gpu_async_compile_mode_kernels_launch_correctly(
    executor: PrecompileExecutor, caller_cache: Path
) -> None:
    import torch

    x = torch.randn(4096, device="cuda")
    out = torch.empty_like(x)
    adapter = async_compile_executor(executor)
    with AsyncCompileMode(adapter):
        futures = [
            scale_kernel.fn.warmup(x, out, 4096, grid=(1,), **cfg.all_kwargs())
            for cfg in scale_kernel.configs
        ]
    assert all(isinstance(f.result(), CompiledKernel) for f in futures)
    assert os.getpid() not in {j.artifacts.worker_pid for j in adapter.jobs if j.artifacts}
    for config in scale_kernel.configs:  # launches hit the JIT's in-memory cache
        out.zero_()
        block = config.kwargs["BLOCK"]
        scale_kernel.fn[(triton.cdiv(4096, block),)](x, out, 4096, **config.all_kwargs())
        torch.testing.assert_close(out, x * 2)
