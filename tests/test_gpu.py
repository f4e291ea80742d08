"""Run-once GPU tasks (``precompile_executor.gpu``): shared arguments, launches, faults, devices.

Tests marked ``gpu`` need CUDA and are skipped without it (the two-GPU ones need two devices);
the others exercise the same machinery on the CPU (arguments load onto the CPU where no GPU is
visible) and run everywhere.

The GPU tests initialise CUDA in this process (the ``AsyncCompileMode`` test launches here), so
fork-path tests must not run after them in the same session; pytest's file order (``test_fork``
before ``test_gpu``) keeps it so.
"""

# Triton's decorators and kernels are untyped.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call,name-defined"
from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from gpu_helpers import (
    import_torch_asking_for_cuda,
    import_torch_counting_with_the_runtime,
    import_torch_tagged,
    tag,
)

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from precompile_executor import (  # noqa: E402
    PrecompileExecutor,
    RemoteError,
    TaskTimeoutError,
    stop_idle_workers,
)
from precompile_executor._worker import STICKY_CUDA_ERROR  # noqa: E402
from precompile_executor.examples import kernels as examples  # noqa: E402
from precompile_executor.gpu import (  # noqa: E402
    RunOnce,
    RunReport,
    SharedArgs,
    cuda_initialized,
    run_once,
    share_args,
)
from precompile_executor.triton import classify  # noqa: E402

RESULT_TIMEOUT_S = 120.0
"""Longest a test waits for one task (a cold worker imports torch, then compiles)."""


def _gpu_count() -> int:
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver: no GPU
        return 0


GPUS = _gpu_count()


def needs_gpus(count: int = 1) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a test ``gpu`` and skip it unless ``count`` CUDA devices are visible."""

    def mark(test: Callable[..., Any]) -> Callable[..., Any]:
        test = pytest.mark.gpu(test)
        reason = f"needs {count} CUDA device(s), found {GPUS}"
        skipped: Callable[..., Any] = pytest.mark.skipif(count > GPUS, reason=reason)(test)
        return skipped

    return mark


@pytest.fixture(scope="module", autouse=True)
def _release_workers() -> Iterator[None]:
    yield
    stop_idle_workers()


# -- kernels and worker-side helpers (module level: workers import them by reference) ---------


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def far_store_kernel(out_ptr, far):
    """Stores ``far`` elements past ``out_ptr``: an illegal memory access."""
    offs = tl.arange(0, 32)
    tl.store(out_ptr + far + offs, offs.to(tl.float32))


@triton.jit
def misaligned_kernel(x_ptr):
    """Loads an int64 from one byte past a 16-byte aligned address: a misaligned address."""
    p = (x_ptr + 1).to(tl.pointer_type(tl.int64))
    tl.store(p, tl.load(p) + 1)


@triton.jit
def trap_kernel(x_ptr):
    """Executes PTX ``trap``: the launch fails (unspecified launch failure)."""
    offs = tl.arange(0, 32)
    x = tl.load(x_ptr + offs)
    y = tl.inline_asm_elementwise(
        "trap; mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1
    )
    tl.store(x_ptr + offs, y)


@triton.jit
def assert_kernel(x_ptr):
    """Fails ``tl.device_assert`` (compiled with ``debug=True``): a device-side assert."""
    offs = tl.arange(0, 32)
    x = tl.load(x_ptr + offs)
    tl.device_assert(x < 0, "x must be negative")
    tl.store(x_ptr + offs, x)


@triton.jit
def spin_kernel(flag_ptr):
    """Waits for a flag that nobody sets: never finishes."""
    while tl.load(flag_ptr, volatile=True) == 0:
        pass


matmul_kernel = examples.matmul_kernel.fn  # the package's kernel, without its autotune configs


def _axpy(x: Any, out: Any, alpha: float) -> None:
    out.copy_(x * alpha)


def _sum_of_out(args: tuple[Any, ...]) -> tuple[float, int, int]:
    """Check: the output's sum, and the identity of the tensors (the same object when reused)."""
    return float(args[1].sum()), id(args[0]), os.getpid()


def _add_error(args: tuple[Any, ...]) -> float:
    x, y, out = args[:3]
    error = float((out - (x + y)).abs().max())
    out.fill_(float("nan"))  # the next task on this worker must write it again
    return error


def _matmul_error(args: tuple[Any, ...]) -> float:
    a, b, c = args[:3]
    error = float((c.float() - (a.float() @ b.float())).abs().max())
    c.fill_(float("nan"))
    return error


def _pid_and_cuda_state(*_: Any) -> tuple[int, bool, bool]:
    """CPU work (torch on the CPU, a Triton compile for an explicit target), then report."""
    import torch as worker_torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    worker_torch.ones(64, 64) @ worker_torch.ones(64, 64)
    src = ASTSource(
        add_kernel,
        {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        {"BLOCK": 256},
    )
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return os.getpid(), worker_torch.cuda.is_initialized(), cuda_initialized()


def _touch_gpu() -> int:
    import torch as worker_torch

    worker_torch.ones(1, device="cuda").sum().item()
    return os.getpid()


def _set_device(index: int) -> None:
    import torch as worker_torch

    worker_torch.cuda.set_device(index)
    worker_torch.ones(1, device="cuda").item()


def _gpu_pids() -> set[int] | None:
    """Pids with a CUDA context according to ``nvidia-smi``, or ``None`` if it can't tell."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {int(line) for line in out.split() if line.strip().isdigit()}


# -- shared arguments (CPU) ---------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_shared_args_load_once_per_worker_and_are_reused() -> None:
    x = torch.arange(1000, dtype=torch.float32)
    with (
        PrecompileExecutor(2, initializer=tag, initargs=("shared",)) as pool,
        share_args((x, torch.zeros(1000), 3.0)) as shared,
    ):
        pool.warm_up(timeout=RESULT_TIMEOUT_S)
        futures = [pool.submit(run_once(_axpy, shared, check=_sum_of_out)) for _ in range(12)]
        reports: list[RunReport] = [f.result(timeout=RESULT_TIMEOUT_S) for f in futures]
        # The GPU tests must exercise warm templates, not a silent fallback to interpreters
        # (an initializer whose module probes CUDA at import would cause one on a GPU machine).
        assert pool.statistics().start == "template"
    expected = float(x.sum()) * 3.0
    loads = collections.Counter(r.worker_pid for r in reports if r.args_loaded)
    assert all(r.checked[0] == expected for r in reports)
    assert all(n == 1 for n in loads.values())  # one load per worker, whatever ran there
    assert set(loads) == {r.worker_pid for r in reports}
    identities = collections.defaultdict(set)
    for r in reports:
        identities[r.checked[2]].add(r.checked[1])
    assert all(len(ids) == 1 for ids in identities.values())  # the same tensor object each time
    assert not os.path.exists(shared.path)  # released with the block
    assert reports[0].device.kind in ("cpu", "cuda")


@pytest.mark.timeout(120)
def test_a_released_batch_is_dropped_by_the_worker_on_its_next_load() -> None:
    with PrecompileExecutor(1, initializer=tag, initargs=("release",)) as pool:
        with share_args((torch.ones(10), torch.zeros(10), 1.0)) as first:
            report = pool.submit(run_once(_axpy, first)).result(timeout=RESULT_TIMEOUT_S)
            assert report.args_loaded
        assert not os.path.exists(os.path.dirname(first.path))
        with share_args((torch.ones(10), torch.zeros(10), 2.0)) as second:
            task = run_once(_axpy, second, check=lambda args: first.loaded_here())
            again = pool.submit(task).result(timeout=RESULT_TIMEOUT_S)
        assert again.worker_pid == report.worker_pid
        assert again.checked is False


@pytest.mark.timeout(120)
def test_a_task_after_release_fails_with_a_clear_error() -> None:
    shared = share_args((torch.ones(4), torch.zeros(4), 1.0))
    shared.release()
    with PrecompileExecutor(1, initializer=tag, initargs=("gone",)) as pool:
        error = pool.submit(run_once(_axpy, shared)).exception(timeout=RESULT_TIMEOUT_S)
    assert isinstance(error, FileNotFoundError) and isinstance(error, RemoteError)
    assert "released before worker pid" in str(error)


def test_the_handle_is_small_and_only_its_owner_deletes_the_file(tmp_path: Path) -> None:
    big = torch.zeros(1 << 20)  # 4 MiB
    with share_args((big, 1), dir=str(tmp_path)) as shared:
        assert len(cloudpickle.dumps(run_once(_axpy, shared))) < 4096
        assert shared.nbytes > big.numel() * 4 and len(shared) == 2
        assert Path(shared.path).is_relative_to(tmp_path)
        assert oct(os.stat(os.path.dirname(shared.path)).st_mode & 0o777) == "0o700"
        stranger = SharedArgs(shared.token, shared.path, 2, shared.nbytes, owner_pid=-1)
        stranger.release()
        assert os.path.exists(shared.path)
    assert not os.path.exists(shared.path)


@pytest.mark.timeout(120)
def test_arguments_sent_with_each_task_load_every_time() -> None:
    with PrecompileExecutor(1, initializer=tag, initargs=("pickled",)) as pool:
        args = (torch.ones(8), torch.zeros(8), 5.0)
        reports = [
            pool.submit(run_once(_axpy, args, check=_sum_of_out)).result(timeout=RESULT_TIMEOUT_S)
            for _ in range(3)
        ]
    assert all(r.args_loaded and r.checked[0] == 40.0 for r in reports)


def test_run_once_validates_its_arguments() -> None:
    with pytest.raises(TypeError, match="grid"):
        run_once(add_kernel, (1, 2))
    with pytest.raises(TypeError, match="callable"):
        run_once(42, (1, 2))
    with pytest.raises(TypeError, match=r"grid= launches a Triton kernel; _axpy is a function"):
        run_once(_axpy, (1, 2), grid=(1,))  # it would fail on the worker, not here
    with pytest.raises(TypeError, match="sequence"):
        run_once(_axpy, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence"):
        share_args(torch.ones(3))
    task = run_once(add_kernel, (1, 2, 3, 4), grid=(1,), BLOCK=128)
    assert isinstance(task, RunOnce) and task.label == "add_kernel[BLOCK=128]"


def test_importing_gpu_imports_neither_torch_nor_triton() -> None:
    code = (
        "import sys, precompile_executor, precompile_executor.gpu; "
        "print('torch' in sys.modules, 'triton' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: an illegal memory access was encountered",
        "CUDA error: misaligned address",
        "CUDA error: unspecified launch failure",
        "CUDA error: an illegal instruction was encountered",
        "CUDA error: device-side assert triggered",
    ],
)
def test_sticky_cuda_errors_classify_as_warn(message: str) -> None:
    hint = "\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    assert classify(RuntimeError(message + hint)) == "warn"


def test_other_cuda_errors_are_not_read_as_device_side_asserts() -> None:
    hint = "\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    assert classify(RuntimeError("CUDA error: invalid device ordinal" + hint)) == "raise"


def _non_sticky_cuda_error() -> None:
    raise RuntimeError(
        "CUDA error: invalid argument\nCUDA kernel errors might be asynchronously reported at "
        "some other API call, so the stacktrace below might be incorrect.\nFor debugging "
        "consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable "
        "device-side assertions.\n"
    )


@pytest.mark.timeout(120)
def test_a_non_sticky_cuda_error_keeps_its_worker() -> None:
    """The hint text is torch 2.11's, as printed on the H200 machine (docs/gpu-runs.md)."""
    with PrecompileExecutor(1, initializer=tag, initargs=("non-sticky",)) as pool:
        error = pool.submit(_non_sticky_cuda_error).exception(timeout=RESULT_TIMEOUT_S)
        assert isinstance(error, RuntimeError)
        pool.warm_up(timeout=RESULT_TIMEOUT_S)
        assert pool.statistics().worker_restarts == 0


# -- on the GPU ---------------------------------------------------------------------------------


@needs_gpus(1)
@pytest.mark.timeout(240)
def test_run_once_launches_a_triton_kernel_with_a_correct_result() -> None:
    n = 100_000
    args = (torch.randn(n), torch.randn(n), torch.empty(n), n)
    with (
        PrecompileExecutor(2, timeout=RESULT_TIMEOUT_S, classify=classify) as pool,
        share_args(args) as shared,
    ):
        futures = [
            pool.submit(
                run_once(
                    add_kernel,
                    shared,
                    grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
                    check=_add_error,
                    BLOCK=block,
                    num_warps=warps,
                )
            )
            for block in (128, 256, 512, 1024)
            for warps in (2, 4)
        ]
        reports: list[RunReport] = [f.result(timeout=RESULT_TIMEOUT_S) for f in futures]
    assert [r.checked for r in reports] == [0.0] * 8
    assert all(r.device.kind == "cuda" and r.device.uuid.startswith("GPU-") for r in reports)
    loads = collections.Counter(r.worker_pid for r in reports if r.args_loaded)
    assert set(loads.values()) == {1}


@needs_gpus(1)
@pytest.mark.timeout(240)
def test_workers_that_run_no_gpu_task_never_initialise_cuda() -> None:
    with (
        PrecompileExecutor(2, initializer=tag, initargs=("cpu-only",)) as cpu_pool,
        PrecompileExecutor(1, initializer=tag, initargs=("gpu",)) as gpu_pool,
    ):
        gpu_pid = gpu_pool.submit(_touch_gpu).result(timeout=RESULT_TIMEOUT_S)
        states = [
            f.result(timeout=RESULT_TIMEOUT_S)
            for f in [cpu_pool.submit(_pid_and_cuda_state) for _ in range(4)]
        ]
        listed = _gpu_pids()
        print(f"nvidia-smi compute-app pids: {listed}; gpu worker {gpu_pid}; cpu {states}")
    cpu_pids = {pid for pid, _, _ in states}
    assert gpu_pid not in cpu_pids
    assert all(not torch_says and not ours for _, torch_says, ours in states)
    if listed:  # nvidia-smi lists processes here: the GPU worker is there, CPU workers are not
        assert gpu_pid in listed
        assert not cpu_pids & listed


def _cuda_initialized_and_pid() -> tuple[bool, int, str | None]:
    import torch as worker_torch

    return worker_torch.cuda.is_initialized(), os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")


@needs_gpus(1)
@pytest.mark.timeout(240)
def test_pinned_workers_create_their_cuda_context_as_they_start() -> None:
    """A worker pinned to a GPU opens its context before hello (so warm_up() pays it, not the
    first task); an unpinned one never touches CUDA; a template still forks (one import)."""
    with (
        PrecompileExecutor(
            2, devices=[0], initializer=import_torch_tagged, initargs=("pinned",)
        ) as pinned,
        PrecompileExecutor(2, initializer=import_torch_tagged, initargs=("unpinned",)) as plain,
    ):
        pinned.warm_up(timeout=RESULT_TIMEOUT_S)
        plain.warm_up(timeout=RESULT_TIMEOUT_S)
        first = [pinned.submit(_cuda_initialized_and_pid) for _ in range(2)]
        states = [f.result(timeout=RESULT_TIMEOUT_S) for f in first]
        unpinned = plain.submit(_cuda_initialized_and_pid).result(timeout=RESULT_TIMEOUT_S)
        start = pinned.statistics().start
    print(f"pinned: {states} start={start}; unpinned: {unpinned}")
    assert start == "template"
    assert all(initialized for initialized, _, _ in states), states
    assert {visible for _, _, visible in states} == {"0"}, states
    assert unpinned[0] is False, unpinned


def _add_on_gpu_in_worker(n: int) -> tuple[float, int, bool]:
    """A Triton kernel launched in this worker: its error, pid, whether CUDA was initialized."""
    import torch as worker_torch

    was_initialized = worker_torch.cuda.is_initialized()
    x = worker_torch.arange(n, device="cuda", dtype=worker_torch.float32)
    out = worker_torch.empty_like(x)
    add_kernel[(triton.cdiv(n, 256),)](x, x, out, n, BLOCK=256)
    return float((out - 2 * x).abs().max()), os.getpid(), was_initialized


@needs_gpus(1)
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("initializer", "start"),
    [
        (import_torch_asking_for_cuda, "template"),
        (import_torch_counting_with_the_runtime, "interpreter"),
    ],
    ids=["nvml-check", "runtime-count"],
)
def test_an_initializer_that_asks_if_cuda_is_available(initializer: Any, start: str) -> None:
    """``torch.cuda.is_available()`` in the initializer (what ``import helion`` does) leaves the
    CUDA driver's thread. With the NVML check (set in templates) the template still forks and
    its pinned workers open their contexts and launch kernels (docs/gpu-runs.md, "Workers
    forked after CUDA's driver thread");
    after a runtime device count torch refuses CUDA in forked children, so the template refuses
    and the workers start as interpreters — either way the kernels run."""
    with PrecompileExecutor(2, devices=[0], initializer=initializer, initargs=(start,)) as executor:
        executor.warm_up(timeout=RESULT_TIMEOUT_S)
        stats = executor.statistics()
        results = [
            executor.submit(_add_on_gpu_in_worker, n).result(timeout=RESULT_TIMEOUT_S)
            for n in (1000, 5000, 1000, 5000)
        ]
    print(f"start={stats.start} note={stats.start_note!r} results={results}")
    assert stats.start == start, stats.start_note
    assert (stats.start_note is None) == (start == "template"), stats.start_note
    if start == "interpreter":
        assert "CUDA runtime" in str(stats.start_note)
    assert all(error == 0.0 for error, _, _ in results), results
    assert all(initialized for _, _, initialized in results), results  # opened before hello
    assert os.getpid() not in {pid for _, pid, _ in results}, results


STICKY_KERNELS: dict[str, tuple[Any, Callable[[], tuple[Any, ...]], dict[str, Any]]] = {
    "illegal address": (far_store_kernel, lambda: (torch.zeros(32), 1 << 40), {}),
    "misaligned address": (misaligned_kernel, lambda: (torch.zeros(64, dtype=torch.uint8),), {}),
    "trap": (trap_kernel, lambda: (torch.zeros(32, dtype=torch.int32),), {}),
    "device assert": (
        assert_kernel,
        lambda: (torch.zeros(32, dtype=torch.int32),),
        {"debug": True},
    ),
}


@needs_gpus(1)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", sorted(STICKY_KERNELS))
def test_a_sticky_cuda_error_fails_its_task_alone_and_replaces_its_worker(fault: str) -> None:
    kernel, make_args, kwargs = STICKY_KERNELS[fault]
    n = 4096
    good_args = (torch.randn(n), torch.randn(n), torch.empty(n), n)
    with (
        PrecompileExecutor(3, timeout=RESULT_TIMEOUT_S, classify=classify) as pool,
        share_args(good_args) as shared,
    ):
        before = set(pool.warm_up(timeout=RESULT_TIMEOUT_S))
        good = [
            pool.submit(run_once(add_kernel, shared, grid=(4,), check=_add_error, BLOCK=1024))
            for _ in range(6)
        ]
        bad = pool.submit(run_once(kernel, make_args(), grid=(1,), **kwargs))
        good += [
            pool.submit(run_once(add_kernel, shared, grid=(4,), check=_add_error, BLOCK=1024))
            for _ in range(6)
        ]
        error = bad.exception(timeout=RESULT_TIMEOUT_S)
        reports = [f.result(timeout=RESULT_TIMEOUT_S) for f in good]
        after = set(pool.warm_up(timeout=RESULT_TIMEOUT_S))
        stats = pool.statistics()
    print(f"{fault}: {type(error).__name__}: {str(error).splitlines()[0] if error else None}")
    assert isinstance(error, RemoteError)
    assert STICKY_CUDA_ERROR.search(str(error)), str(error)
    assert error.classification == "warn"
    assert all(r.checked == 0.0 for r in reports)
    assert error.worker_pid in before and error.worker_pid not in after
    assert len(before & after) == 2  # the other workers were untouched
    assert stats.worker_restarts == 1 and stats.crashed == 0 and stats.failed == 1


@needs_gpus(1)
@pytest.mark.timeout(300)
def test_a_kernel_that_never_finishes_times_out_and_the_gpu_stays_usable() -> None:
    n = 4096
    with (
        PrecompileExecutor(1, timeout=RESULT_TIMEOUT_S, classify=classify) as pool,
        share_args((torch.randn(n), torch.randn(n), torch.empty(n), n)) as shared,
    ):
        first = pool.submit(run_once(add_kernel, shared, grid=(4,), check=_add_error, BLOCK=1024))
        first_report = first.result(timeout=RESULT_TIMEOUT_S)
        spin = run_once(spin_kernel, (torch.zeros(1, dtype=torch.int32),), grid=(1,))
        started = time.monotonic()
        error = pool.options(timeout=10).submit(spin).exception(timeout=RESULT_TIMEOUT_S)
        killed_after = time.monotonic() - started
        after = pool.submit(run_once(add_kernel, shared, grid=(4,), check=_add_error, BLOCK=1024))
        report = after.result(timeout=RESULT_TIMEOUT_S)
        stats = pool.statistics()
    print(f"spin: {type(error).__name__} after {killed_after:.1f}s; next task ok: {report}")
    assert isinstance(error, TaskTimeoutError) and error.classification == "warn"
    assert report.checked == 0.0 and report.worker_pid != first_report.worker_pid
    assert report.device.uuid == first_report.device.uuid  # the same GPU, usable again
    assert stats.timed_out == 1 and stats.worker_restarts == 1


def _sleepy_add(args: tuple[Any, ...]) -> float:
    time.sleep(0.2)  # keeps every worker busy, so the batch must use all of them
    return _add_error(args)


@needs_gpus(2)
@pytest.mark.timeout(300)
def test_a_batch_spreads_over_every_gpu_and_a_sticky_error_replaces_one_worker() -> None:
    devices = list(range(GPUS))
    n = 4096
    with (
        PrecompileExecutor(2 * len(devices), devices=devices, classify=classify) as pool,
        share_args((torch.randn(n), torch.randn(n), torch.empty(n), n)) as shared,
    ):
        before = set(pool.warm_up(timeout=RESULT_TIMEOUT_S))
        futures = [
            pool.submit(run_once(add_kernel, shared, grid=(4,), check=_sleepy_add, BLOCK=1024))
            for _ in range(4 * len(devices))
        ]
        reports: list[RunReport] = [f.result(timeout=RESULT_TIMEOUT_S) for f in futures]
        bad = pool.submit(run_once(far_store_kernel, (torch.zeros(32), 1 << 40), grid=(1,)))
        error = bad.exception(timeout=RESULT_TIMEOUT_S)
        after = set(pool.warm_up(timeout=RESULT_TIMEOUT_S))
        stats = pool.statistics()
    uuid_of = collections.defaultdict(set)
    for r in reports:
        uuid_of[r.device.pinned].add(r.device.uuid)
    print({pinned: sorted(uuids) for pinned, uuids in uuid_of.items()})
    assert set(uuid_of) == {str(d) for d in devices}  # every device ran tasks of the batch
    assert all(len(uuids) == 1 for uuids in uuid_of.values())  # each pin is one physical GPU
    assert len({u for uuids in uuid_of.values() for u in uuids}) == len(devices)
    assert all(r.checked == 0.0 for r in reports)
    assert isinstance(error, RemoteError) and STICKY_CUDA_ERROR.search(str(error))
    assert before - after == {error.worker_pid} and len(after) == len(before)
    assert stats.worker_restarts == 1 and stats.crashed == 0


@needs_gpus(1)
@pytest.mark.timeout(240)
def test_async_compile_mode_end_to_end_with_a_launch_here(tmp_path: Path) -> None:
    from triton import knobs
    from triton.runtime._async_compile import AsyncCompileMode

    from precompile_executor.triton import async_compile_executor

    n = 10_000
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    blocks = (128, 256, 512)
    with (
        knobs.cache.scope(),
        PrecompileExecutor(2, timeout=RESULT_TIMEOUT_S, classify=classify) as pool,
    ):
        knobs.cache.dir = str(tmp_path / "cache")
        adapter = async_compile_executor(pool)
        with AsyncCompileMode(adapter):
            for block in blocks:
                add_kernel.warmup(x, y, torch.empty_like(x), n, grid=(1,), BLOCK=block)
        pids = {job.artifacts.worker_pid for job in adapter.jobs if job.artifacts is not None}
        for block in blocks:
            out = torch.empty_like(x)
            add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)
            torch.cuda.synchronize()
            assert torch.equal(out, x + y)
    assert len(adapter.jobs) == len(blocks) and os.getpid() not in pids and pids


MATMUL_CONFIGS: list[dict[str, Any]] = [
    {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_stages": stages, "num_warps": warps}
    for bm in (32, 64, 128)
    for bn in (32, 64, 128)
    for bk in (32, 64)
    for stages in (2, 3)
    for warps in (4, 8)
][:64]


@needs_gpus(1)
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_autotune_batch_of_64_matmul_configs_compiles_and_runs_once_correctly() -> None:
    m, n, k = 512, 384, 320
    a = torch.randn(m, k, dtype=torch.float16)
    b = torch.randn(k, n, dtype=torch.float16)
    c = torch.empty(m, n, dtype=torch.float16)
    args = (a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())

    def grid(meta: Any) -> tuple[int]:
        return (triton.cdiv(meta["M"], meta["BLOCK_M"]) * triton.cdiv(meta["N"], meta["BLOCK_N"]),)

    devices = list(range(GPUS))
    with (
        PrecompileExecutor(16, devices=devices, timeout=300, classify=classify) as pool,
        share_args(args) as shared,
    ):
        futures = [
            pool.submit(run_once(matmul_kernel, shared, grid=grid, check=_matmul_error, **cfg))
            for cfg in MATMUL_CONFIGS
        ]
        reports: list[RunReport] = [f.result(timeout=300) for f in futures]
    errors = {r.label: r.checked for r in reports}
    assert len(reports) == 64
    assert all(error < 0.1 for error in errors.values()), errors
    assert {r.device.pinned for r in reports} == {str(d) for d in devices}
    print(
        f"64 configs: compile {sum(r.compile_s for r in reports):.1f}s in total, "
        f"{len({r.worker_pid for r in reports})} workers, "
        f"{len({r.device.uuid for r in reports})} GPUs"
    )
