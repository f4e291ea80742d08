"""``precompile_executor.inductor``: ``torch.compile``'s compiles as tasks on the executor.

On CPU, Inductor builds each pointwise kernel as a C++ library; these tests compile small
models whose one kernel carries a constant of their choice, so a test can tell that kernel's
build apart (and make it crash or hang through the compiler, ``crashers.write_faulty_compiler``).
Each test gets fresh Inductor caches (``fresh_inductor_cache`` in its tmp dir) and a reset
Dynamo; the executor is shared by the module (its warm template imports torch once).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import crashers
import pytest

from precompile_executor import (
    PrecompileExecutor,
    RemoteError,
    TaskMemoryError,
    TaskTimeoutError,
    WorkerCrashedError,
)

torch = pytest.importorskip("torch")

import precompile_executor.inductor as inductor  # noqa: E402
from precompile_executor._policy import AHEAD_BATCH_S  # noqa: E402
from precompile_executor.inductor import _seam  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

WAIT_S = 300.0
"""Longest a test waits for a thread that compiles (a C++ build on a busy 2-core machine)."""

HANG_TIMEOUT_S = 5.0
"""The executor's timeout for the compile that hangs (the only compile under it)."""

TINY_MEMORY_LIMIT_BYTES = 16 << 20
"""Far below what the C++ compiler needs for any kernel."""


class Scaled(torch.nn.Module):
    """A linear layer, then one pointwise kernel holding ``scale`` as a literal."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 8)
        self.scale = scale

    def forward(self, x: Any) -> Any:
        return torch.relu(self.linear(x)) * self.scale


def _inputs() -> Any:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def _compile_and_check(model: torch.nn.Module) -> None:
    x = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model)(x), model(x))


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {WAIT_S} s"
        time.sleep(0.05)


def _pool_ready() -> bool:
    from torch._inductor.async_compile import AsyncCompile

    return bool(AsyncCompile.use_process_pool())


@contextlib.contextmanager
def use_ready(executor: Any) -> Iterator[Any]:
    """``inductor.use(executor)``, entered once a worker has answered Inductor's readiness
    probe: until then Inductor compiles in the caller (test_..._in_the_caller_until_...)."""
    with inductor.use(executor) as used:
        _wait_until(_pool_ready, "ready")
        yield used


def _chain(error: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in found:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


@pytest.fixture(scope="module")
def executor() -> Iterator[PrecompileExecutor]:
    ex = PrecompileExecutor(2, initializer=inductor.import_inductor)
    try:
        yield ex
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(autouse=True)
def fresh_inductor(tmp_path: Path) -> Iterator[None]:
    from torch._inductor.utils import fresh_inductor_cache

    torch._dynamo.reset()
    try:
        with fresh_inductor_cache(dir=str(tmp_path)):
            yield
    finally:
        inductor.state.reset()
        torch._dynamo.reset()


def _inductor_originals() -> dict[str, Any]:
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    return {
        "process_pool": AsyncCompile.__dict__["process_pool"],
        "use_process_pool": AsyncCompile.__dict__["use_process_pool"],
        "submit": AsyncCompile.__dict__["submit"],
        "make_precompile_fn": AlgorithmSelectorCache.__dict__["make_precompile_fn"],
    }


def test_a_use_block_compiles_on_the_executor_with_results_equal_to_eager(
    executor: PrecompileExecutor,
) -> None:
    originals = _inductor_originals()
    before = inductor.statistics()
    completed_before = executor.statistics().completed
    assert not inductor.installed()
    with use_ready(executor) as used:
        assert used is executor
        assert inductor.installed()
        _compile_and_check(Scaled(1.5))
    after = inductor.statistics()
    assert after.cpp > before.cpp
    assert after.failed == before.failed
    probe = 1  # the readiness probe, sent once per executor (state.reset() forgets it)
    assert executor.statistics().completed - completed_before == after.total - before.total + probe
    assert not inductor.installed()
    assert _inductor_originals() == originals


def _gated_import_inductor(gate: str) -> None:
    """A worker initializer that holds the worker's start until ``gate`` exists (at most
    ``GATE_WAIT_S``), then imports Inductor as the default executor's template does."""
    import os
    import time

    from precompile_executor.inductor import import_inductor

    deadline = time.monotonic() + GATE_WAIT_S
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    import_inductor()


def _train_and_check(model: torch.nn.Module) -> None:
    """One training step's forward and backward, compiled, against eager's gradients."""
    import copy

    twin = copy.deepcopy(model)
    x = _inputs()
    torch.compile(model)(x).square().sum().backward()
    twin(x).square().sum().backward()
    for (name, compiled), (_, eager) in zip(
        model.named_parameters(), twin.named_parameters(), strict=True
    ):
        assert compiled.grad is not None, name
        torch.testing.assert_close(compiled.grad, eager.grad, msg=name)


def test_compiles_run_in_the_caller_counted_until_a_worker_answers_then_on_the_workers(
    tmp_path: Path,
) -> None:
    # Stock Inductor compiles in the caller until its pool has answered a no-op; so must use():
    # a compile sent to workers that are still starting would wait for them. The one worker's
    # start is held by a gate; until it opens, nothing runs on the executor, every build is
    # counted as the caller's, and the pending probe leaves the switch interval alone.
    from torch._inductor.async_compile import AsyncCompile

    gate = tmp_path / "gate"
    interval = sys.getswitchinterval()
    before = inductor.statistics()
    with (
        PrecompileExecutor(1, initializer=_gated_import_inductor, initargs=(str(gate),)) as ex,
        inductor.use(ex),
    ):
        assert not AsyncCompile.use_process_pool()  # the probe is sent; nobody answered yet
        _compile_and_check(Scaled(3.0))
        assert not AsyncCompile.use_process_pool()
        during = inductor.statistics()
        assert during.caller_cpp > before.caller_cpp
        assert during.total == before.total and ex.statistics().completed == 0
        assert sys.getswitchinterval() == interval

        gate.touch()
        _wait_until(_pool_ready, "ready")
        _train_and_check(Scaled(3.5))  # forward and backward, now on the worker
        after = inductor.statistics()
    assert after.cpp >= during.cpp + 2, after  # the forward's kernel and the backward's
    assert after.caller_cpp == during.caller_cpp and after.failed == before.failed


def test_an_executor_that_fails_the_probe_leaves_compiles_in_the_caller_warning_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from torch._inductor.async_compile import AsyncCompile

    closed = PrecompileExecutor(1)
    closed.shutdown()
    with caplog.at_level("WARNING", logger="precompile_executor.inductor"):
        with inductor.use(closed):
            assert not AsyncCompile.use_process_pool()
            assert not AsyncCompile.use_process_pool()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "readiness probe" in warnings[0].getMessage()
    assert "in the caller" in warnings[0].getMessage()


def test_an_executor_dropped_after_its_probe_is_collected() -> None:
    # The probes are kept weakly by executor; a probe that held its executor would keep every
    # executor ever used in a block alive, and one dropped without shutdown() never shut down.
    import gc
    import weakref

    ex = PrecompileExecutor(1)
    with inductor.use(ex):
        _wait_until(_pool_ready, "ready")
    dropped = weakref.ref(ex)
    del ex
    gc.collect()
    assert dropped() is None


ORDER_PROGRAM = """
import json
import sys

import torch

import precompile_executor.inductor as inductor
from precompile_executor.inductor import _default

MARKERS = ("torch._inductor.async_compile", "torch._inductor.select_algorithm")
events = []
build = _default.default_executor


def default_executor():
    events.append(["warm-up starts", [m for m in MARKERS if m in sys.modules]])
    executor = build()
    events.append(["warming", inductor.state.warming is not None])
    return executor


_default.default_executor = default_executor
if sys.argv[1] == "use":
    with inductor.use():
        events.append(["patched", [m for m in MARKERS if m in sys.modules]])
else:
    inductor.install()
    events.append(["patched", [m for m in MARKERS if m in sys.modules]])
inductor.state.reset()
print("EVENTS " + json.dumps(events))
"""


@pytest.mark.parametrize("form", ["use", "install"])
def test_use_and_install_start_the_default_executors_warm_up_before_importing_inductor(
    form: str,
) -> None:
    # The seam's check imports Inductor (seconds); the template's import of torch should run
    # meanwhile, not after. A fresh interpreter: torch imported, Inductor not yet.
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="2")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent)] + sys.path)
    done = subprocess.run(
        [sys.executable, "-c", ORDER_PROGRAM, form],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    line = [ln for ln in done.stdout.splitlines() if ln.startswith("EVENTS ")][-1]
    events = json.loads(line.removeprefix("EVENTS "))
    assert events == [
        ["warm-up starts", []],
        ["warming", True],
        ["patched", ["torch._inductor.async_compile", "torch._inductor.select_algorithm"]],
    ]


def test_the_default_executor_has_as_many_workers_as_inductors_own_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch._inductor import config

    from precompile_executor.inductor import _default

    with config.patch(compile_threads=5):  # Inductor's config is a module of its own kind
        assert _default.compile_threads() == 5  # what the program set, Inductor imported
    monkeypatch.delitem(sys.modules, "torch._inductor.config")  # not imported yet: its rule
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "3")
    assert _default.compile_threads() == 3
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS")
    assert _default.compile_threads() == min(32, len(os.sched_getaffinity(0)))
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "many")
    with pytest.raises(ValueError, match="TORCHINDUCTOR_COMPILE_THREADS must be a whole number"):
        _default.compile_threads()
    monkeypatch.undo()

    # One compile thread: Inductor compiles in the caller on purpose; no worker is started.
    from torch._inductor.async_compile import AsyncCompile

    with config.patch(compile_threads=1), inductor.use():
        assert not AsyncCompile.use_process_pool()
        assert inductor.state.warming is None
        default = inductor.state.default
        assert default is not None and default.statistics().workers_alive == 0


def test_inductors_pool_is_the_executor_of_the_innermost_block_then_the_newest(
    executor: PrecompileExecutor,
) -> None:
    from torch._inductor.async_compile import AsyncCompile

    inner = executor.options(timeout=600.0)

    def pool_on_a_fresh_thread() -> Any:
        with ThreadPoolExecutor(1) as threads:
            return threads.submit(lambda: AsyncCompile.process_pool().executor).result(WAIT_S)

    with inductor.use(executor):
        assert AsyncCompile.process_pool().executor is executor
        with inductor.use(inner):
            assert AsyncCompile.process_pool().executor is inner
            assert pool_on_a_fresh_thread() is inner  # the newest open block
        assert AsyncCompile.process_pool().executor is executor
        inductor.install(inner)
        try:
            assert pool_on_a_fresh_thread() is executor  # an open block before the installation
        finally:
            inductor.uninstall()
    assert not inductor.installed()


def test_state_reset_closes_every_holder_stops_the_default_and_counts_from_zero() -> None:
    originals = _inductor_originals()
    block = inductor.use()
    block.__enter__()  # left open on purpose: reset() closes it
    inductor.install()
    _compile_and_check(Scaled(2.0))
    state = inductor.state
    default, warming = state.default, state.warming
    assert default is not None and warming is not None
    counted = inductor.statistics()  # on the default executor, or in the caller while it warms
    assert counted.total + counted.in_caller > 0

    state.reset()

    assert not inductor.installed() and _inductor_originals() == originals
    assert state.default is None and state.warming is None and state.saved == []
    assert not warming.is_alive()
    assert inductor.statistics() == inductor.InductorStatistics()
    with pytest.raises(RuntimeError):
        default.submit(int)  # shut down
    block.__exit__(None, None, None)  # the owner's late exit does nothing
    assert not inductor.installed() and _inductor_originals() == originals


def test_install_sends_every_threads_compiles_until_uninstall(
    executor: PrecompileExecutor,
) -> None:
    originals = _inductor_originals()
    before = inductor.statistics()
    inductor.install(executor)
    try:
        _wait_until(_pool_ready, "ready")
        errors: list[BaseException] = []

        def compile_here() -> None:
            try:
                _compile_and_check(Scaled(2.5))
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=compile_here)
        thread.start()
        thread.join(WAIT_S)
        assert not thread.is_alive()
        assert errors == []
        assert inductor.statistics().cpp > before.cpp
    finally:
        inductor.uninstall()
    assert not inductor.installed()
    assert _inductor_originals() == originals


CPP_CHOICE_SOURCE = """
extern "C" void double_it(const float* in, float* out) {
    for (int i = 0; i < 8; ++i) out[i] = 2.0f * in[i];
}
"""


def test_a_cpp_template_choice_precompiles_on_the_executor_and_its_library_runs(
    executor: PrecompileExecutor,
) -> None:
    # What max-autotune's make_precompile_fn does for a C++ template choice, on a thread of its
    # own pool. Called directly: Inductor skips that step on Python 3.11.0 to 3.11.8
    # (python/cpython#106905), and a C++ GEMM template needs freezing and minutes to build.
    from torch._inductor.autotune_process import CppBenchmarkRequest, TensorMeta

    meta = TensorMeta(torch.device("cpu"), torch.float32, (8,), (1,), 0)
    request = CppBenchmarkRequest("double_it", [meta], [meta], [], CPP_CHOICE_SOURCE)
    before = inductor.statistics()
    with use_ready(executor), ThreadPoolExecutor(1) as threads:
        threads.submit(request.precompile).result(timeout=WAIT_S)
    after = inductor.statistics()
    assert after.template == before.template + 1
    assert after.cpp == before.cpp and after.failed == before.failed
    x = torch.arange(8.0)
    out = torch.empty(8)
    request.make_run_fn(x, out=out)()  # loads the library the executor built: no build here
    torch.testing.assert_close(out, 2 * x)
    assert inductor.statistics() == after


GATE_WAIT_S = 120.0
"""Longest a gated task holds its worker."""


def _wait_for_file(path: str) -> None:
    """A task that holds its worker until ``path`` exists (at most ``GATE_WAIT_S``); its only
    argument is a path, so its cost is predicted from its function alone, as every Inductor
    compile's is (their arguments are a kernel loader, paths and flags)."""
    import os
    import time

    with open(f"{path}.started", "a"):  # the test may wait for this task to have begun
        pass
    deadline = time.monotonic() + GATE_WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.parametrize("in_order", [True, False], ids=["submission-order", "cost-order"])
def test_inductors_compiles_start_in_the_order_inductor_submitted_them(
    tmp_path: Path, in_order: bool
) -> None:
    # Inductor waits for what it submitted in about the order it submitted it (a template's
    # choices before the next template's), as its own pool runs it. The executor's cost order
    # would start compiles submitted after a first duration was observed (predicted: that
    # duration) before those queued earlier (predicted: nothing known), every Inductor compile
    # being predicted from one function. One worker: the start order is the queue's order.
    from torch._inductor.async_compile import AsyncCompile

    open_gate, first_gate, always = tmp_path / "open", tmp_path / "first", tmp_path / "second"
    always.touch()
    inductor.state.in_submission_order = in_order  # the fixture's reset() sets it back
    with PrecompileExecutor(1) as ex, inductor.use(ex):
        pool = AsyncCompile.process_pool()
        first = pool.submit(_wait_for_file, str(first_gate))  # runs at once: nothing known
        early = [pool.submit(_wait_for_file, str(open_gate))]  # runs next, held open
        early += [pool.submit(_wait_for_file, str(always)) for _ in range(2)]
        # The first task's duration is what every later one is predicted to take: held well
        # past AHEAD_BATCH_S after it began, so no two wait ahead of the held task together
        # (docs/design.md, "Sending ahead"), however fast the machine.
        assert crashers.wait_for_file(str(first_gate) + ".started", WAIT_S)
        time.sleep(10 * AHEAD_BATCH_S)
        first_gate.touch()
        first.result(timeout=WAIT_S)  # a duration is known now
        late = [pool.submit(_wait_for_file, str(always)) for _ in range(2)]
        open_gate.touch()
        for future in [*early, *late]:
            future.result(timeout=WAIT_S)
        rows = ex.timeline()
    assert len(rows) == 6 and all(row.started is not None for row in rows)
    started = [row.task_id for row in sorted(rows, key=lambda row: row.started or 0.0)]
    first_id = min(started)
    if in_order:
        assert started == sorted(started)
    else:  # the executor's order: the two sent last start before one queued before them (the
        # other may have gone ahead of the held task while its length was thought short:
        # docs/design.md, "Sending ahead")
        late_ids = [started.index(first_id + 4), started.index(first_id + 5)]
        assert max(late_ids) < started.index(first_id + 3), started


TRITON_KERNEL_SOURCE = """
import triton
import triton.language as tl
from torch._inductor.runtime import triton_heuristics
from torch._inductor.runtime.hints import DeviceProperties


@triton_heuristics.pointwise(
    size_hints={"x": 1024},
    filename=__file__,
    triton_meta={
        "signature": {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32", "XBLOCK": "constexpr"},
        "device": DeviceProperties(type="cuda", index=0, multi_processor_count=132, cc=90, major=9,
                                   warp_size=32),
        "constants": {},
        "configs": [],
    },
    inductor_meta={"kernel_name": "triton_poi_double_0", "backend_hash": "0" * 64},
)
@triton.jit
def triton_poi_double_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, xmask) * 2.0, xmask)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU test compiles Triton kernels")
def test_a_triton_kernel_compiles_in_a_worker_and_its_error_keeps_its_type(
    executor: PrecompileExecutor,
) -> None:
    # A kernel as Inductor writes it, for an H100; without a GPU, Triton's driver check fails
    # inside the compile, so the route is seen by where that error comes from: a worker.
    from torch._inductor.async_compile import AsyncCompile

    before = inductor.statistics()
    with use_ready(executor):
        kernel = AsyncCompile().triton("triton_poi_double_0", TRITON_KERNEL_SOURCE)
        with pytest.raises(RuntimeError, match="active GPU backend") as info:
            kernel.result()
    assert isinstance(info.value, RemoteError)  # raised in the worker, type kept
    after = inductor.statistics()
    assert (after.triton, after.failed) == (before.triton + 1, before.failed + 1)


def test_entering_use_points_the_callers_triton_at_the_ptxas_inductors_workers_use(
    executor: PrecompileExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inside use() the caller still compiles what the workers compiled (benchmarking a template
    # choice, a fused epilogue), and Triton's disk cache is keyed by the ptxas version, so the
    # caller must pick the ptxas the workers pick: torch's bundled one, where the wheel has one
    # (Inductor's _set_triton_ptxas_path). A CPU wheel has none, so this test gives torch a
    # bundled ptxas: compile_tasks looks for it beside its own file (torch/bin in 2.11,
    # torch/_inductor/bin in 2.13).
    from torch._inductor.runtime import compile_tasks

    module = tmp_path / "torch" / "_inductor" / "runtime" / "compile_tasks.py"
    bundled = [
        tmp_path / "torch" / "bin" / "ptxas",
        tmp_path / "torch" / "_inductor" / "bin" / "ptxas",
    ]
    for ptxas in bundled:
        ptxas.parent.mkdir(parents=True)
        ptxas.write_text("#!/bin/sh\n")
        ptxas.chmod(0o755)
    monkeypatch.setattr(compile_tasks, "__file__", str(module))
    monkeypatch.setenv("TRITON_PTXAS_PATH", "set by this test, removed at its end")
    monkeypatch.delenv("TRITON_PTXAS_PATH")
    clear = getattr(compile_tasks._set_triton_ptxas_path, "cache_clear", lambda: None)
    clear()
    try:
        with inductor.use(executor):
            assert os.environ.get("TRITON_PTXAS_PATH") in {str(p) for p in bundled}
    finally:
        clear()


def test_a_compile_over_its_memory_limit_fails_naming_memory_and_the_next_compile_works(
    executor: PrecompileExecutor,
) -> None:
    model = Scaled(3.5)
    failed_before = inductor.statistics().failed
    with use_ready(executor.options(memory_limit=TINY_MEMORY_LIMIT_BYTES)):
        with pytest.raises(Exception) as info:
            _compile_and_check(model)
    errors = [e for e in _chain(info.value) if isinstance(e, TaskMemoryError)]
    assert errors, f"no TaskMemoryError in {_chain(info.value)!r}"
    assert "memory" in str(info.value)
    assert inductor.statistics().failed > failed_before

    # The same code again: Inductor's caches forgot the failed build, so it is built afresh.
    torch._dynamo.reset()
    with inductor.use(executor):
        _compile_and_check(model)


FAULTS = [
    pytest.param("segfault", WorkerCrashedError, None, id="segfault"),
    pytest.param("hang", TaskTimeoutError, HANG_TIMEOUT_S, id="hang"),
]


@pytest.mark.parametrize(("action", "error", "timeout"), FAULTS)
def test_a_compile_that_crashes_or_hangs_fails_alone_and_the_next_compile_works(
    executor: PrecompileExecutor,
    tmp_path: Path,
    action: str,
    error: type[BaseException],
    timeout: float | None,
) -> None:
    from torch._inductor import config

    marker = "7777.5"  # the faulty kernel's literal, as Inductor writes it into the C++ source
    compiler = crashers.write_faulty_compiler(str(tmp_path), marker=marker, action=action)
    with config.patch({"cpp.cxx": (compiler,)}):
        with use_ready(executor.options(timeout=timeout)):
            with pytest.raises(Exception) as info:
                _compile_and_check(Scaled(float(marker)))
        assert any(isinstance(e, error) for e in _chain(info.value)), _chain(info.value)

        torch._dynamo.reset()
        before = inductor.statistics()
        with use_ready(executor):
            _compile_and_check(Scaled(0.5))  # the same compiler, the same executor
        assert inductor.statistics().cpp > before.cpp


def test_another_torch_is_refused_and_nothing_is_patched(
    executor: PrecompileExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    originals = _inductor_originals()
    inductor.check_torch(version="2.11.0+cu130")
    inductor.check_torch(version="2.13.0")
    monkeypatch.setattr(_seam, "torch_version", lambda: "2.12.1")
    with pytest.raises(inductor.UnsupportedTorchError, match=r"2\.11\.x and 2\.13\.x.*2\.12\.1"):
        with inductor.use(executor):
            pass
    with pytest.raises(inductor.UnsupportedTorchError, match="Nothing was patched"):
        inductor.install(executor)
    assert not inductor.installed()
    assert _inductor_originals() == originals


@pytest.mark.parametrize("bad", ["pool", 42, PrecompileExecutor])
def test_use_and_install_refuse_what_is_not_an_executor_and_patch_nothing(bad: Any) -> None:
    originals = _inductor_originals()
    with pytest.raises(TypeError, match=r"concurrent\.futures\.Executor"), inductor.use(bad):
        pass
    with pytest.raises(TypeError, match=r"concurrent\.futures\.Executor"):
        inductor.install(bad)
    assert not inductor.installed()
    assert _inductor_originals() == originals


def test_a_changed_seam_is_refused_naming_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor.async_compile import AsyncCompile

    def submit(cls: Any, task: Any, priority: int) -> Any:  # a parameter Inductor never had
        raise AssertionError("never called")

    monkeypatch.setattr(AsyncCompile, "submit", classmethod(submit))
    with pytest.raises(inductor.UnsupportedTorchError, match=r"AsyncCompile\.submit"):
        inductor.install()
    assert not inductor.installed()
    assert AsyncCompile.__dict__["submit"].__func__ is submit


def _cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def _inductor_precompiles_templates() -> bool:
    """Inductor skips max-autotune's precompile on Python 3.11.0 to 3.11.8
    (``make_precompile_fn``; python/cpython#106905): each choice compiles when benchmarked."""
    return not (sys.version_info[:2] == (3, 11) and sys.version_info.micro <= 8)


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["default", "max-autotune"])
def test_gpu_triton_kernels_and_template_choices_compile_on_the_executor(
    executor: PrecompileExecutor, mode: str
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512)
    ).cuda()
    x = torch.randn(64, 256, device="cuda")
    before = inductor.statistics()
    with torch.no_grad(), use_ready(executor):
        out = torch.compile(model, mode=mode)(x)
        torch.cuda.synchronize()
    torch.testing.assert_close(out, model(x), rtol=1e-3, atol=1e-3)
    after = inductor.statistics()
    assert after.triton > before.triton
    assert after.failed == before.failed
    if mode == "max-autotune" and _inductor_precompiles_templates():
        assert after.template > before.template


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(
    not _inductor_precompiles_templates(), reason="Inductor skips the precompile step here"
)
def test_gpu_a_template_choice_compiled_on_the_executor_is_benchmarked_without_compiling_again(
    executor: PrecompileExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Benchmarking a choice runs the kernel of the module Inductor loaded for it; unless the
    # worker's compile landed there, that kernel compiles itself again in the caller, one
    # choice after another (docs/inductor.md, "What runs where").
    import functools

    import triton
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    benchmarking = threading.local()
    compiled_while_benchmarking: list[str] = []
    original_compile = triton.compile
    original_benchmark = AlgorithmSelectorCache.__dict__["benchmark"]

    @functools.wraps(original_compile)
    def compile(src: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(benchmarking, "on", False):
            compiled_while_benchmarking.append(str(getattr(src, "name", src)))
        return original_compile(src, *args, **kwargs)

    @functools.wraps(original_benchmark)
    def benchmark(*args: Any, **kwargs: Any) -> Any:
        benchmarking.on = True
        try:
            return original_benchmark(*args, **kwargs)
        finally:
            benchmarking.on = False

    monkeypatch.setattr(triton, "compile", compile)
    monkeypatch.setattr(AlgorithmSelectorCache, "benchmark", benchmark)
    torch.manual_seed(0)
    model = torch.nn.Linear(384, 640).cuda().half()
    x = torch.randn(192, 384, device="cuda", dtype=torch.half)
    before = inductor.statistics()
    with torch.no_grad(), use_ready(executor):
        out = torch.compile(model, mode="max-autotune")(x)
        torch.cuda.synchronize()
    torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)
    after = inductor.statistics()
    assert after.template > before.template
    assert compiled_while_benchmarking == []
