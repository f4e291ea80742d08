"""Helion's benchmark subprocess started by ``install()``/``use()`` (the spare) and taken by the
streaming provider (``precompile_executor.helion._bench_worker``).

Real processes throughout: each spare is a spawn child running Helion's own worker loop. There
is no GPU here, so a spare warms ``"cpu"`` (its warm-up then imports what a benchmark job needs
and opens no CUDA context) where on a GPU machine it warms ``"cuda:N"``.
"""

# Helion's decorators are untyped.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

helion = pytest.importorskip("helion")
torch = pytest.importorskip("torch")

import psutil  # noqa: E402
from test_faults import _assert_gone  # noqa: E402
from test_helion import (  # noqa: E402
    _assert_all_gone,
    _fork_batch,
    _pids_printed_before_its_sigkill,
)

import precompile_executor.helion as peh  # noqa: E402
from precompile_executor import PrecompileExecutor  # noqa: E402
from precompile_executor.helion import _bench_worker  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WAIT_S = 120.0
ROOT = Path(__file__).parent.parent


@pytest.fixture
def executor() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(2, initializer=peh.import_helion) as ex:
        yield ex


@pytest.fixture(autouse=True)
def _no_spare_left() -> Iterator[None]:
    yield
    left = peh.state.spare
    peh.state.reset()
    assert left is None, "a test left a spare benchmark worker"


def _provider(bound: Any, args: Any) -> Any:
    from benchmarks._helion_cpu import on_the_cpu
    from precompile_executor.helion._provider import StreamingBenchmarkProvider

    s = helion.Settings(autotune_precompile="fork", autotune_progress_bar=False)
    return on_the_cpu(
        StreamingBenchmarkProvider, bound, args, s, lambda c: 1.0, benchmark_subprocess=True
    )


@pytest.mark.timeout(240)
def test_the_provider_takes_the_spare_started_before_it(
    tmp_path: Path, executor: PrecompileExecutor
) -> None:
    """A spare started before the provider is its benchmark worker: Helion's jobs run in
    that process, which was warm before the provider existed; the block's end ends it."""
    with _fork_batch(tmp_path) as (bound, args, _ctx), peh.use(executor):
        spare = _bench_worker.prestart("cpu", 30)  # what install() starts on a GPU machine
        assert spare is not None and _bench_worker.spare() is spare
        spare.join()
        assert spare.error is None and spare.result is not None
        pid = spare.process.pid
        provider = _provider(bound, args)
        try:
            assert provider.__dict__["_early_benchmark_worker"] is spare
            assert _bench_worker.spare() is None  # taken
            worker = provider._benchmark_worker
            assert worker is spare.worker
            assert worker.run(os.getpid, timeout=60) == pid  # Helion's run(), no cold start
        finally:
            provider.cleanup()
    _assert_gone(pid, timeout_s=30)


@pytest.mark.slow  # two cold workers; the default run has the taken spare
@pytest.mark.timeout(240)
def test_a_spare_for_another_device_is_discarded_and_the_provider_starts_its_own(
    tmp_path: Path, executor: PrecompileExecutor
) -> None:
    """A spare warmed for another device than the kernel's is not taken (its CUDA context would
    be on the wrong GPU): it ends, and the provider starts Helion's worker itself."""
    with _fork_batch(tmp_path) as (bound, args, _ctx), peh.use(executor):
        spare = _bench_worker.prestart("meta", 30)
        assert spare is not None
        provider = _provider(bound, args)  # the kernel's device: cpu
        try:
            early = provider.__dict__["_early_benchmark_worker"]
            assert early is not spare and early.device == "cpu"
            assert spare.ended is not None and not spare.process.is_alive()
            worker = provider._benchmark_worker  # after its warm-up's round trip
            assert worker.run(os.getpid, timeout=120) == early.process.pid
        finally:
            provider.cleanup()


@pytest.mark.timeout(240)
def test_a_spare_nobody_takes_ends_with_the_last_holder(executor: PrecompileExecutor) -> None:
    """Every open holder keeps the spare — nested blocks, and a block on another thread that
    exits after this thread's (blocks may close in any order); when the last one leaves, it is
    killed, warm or still starting."""
    import threading

    entered, leave = threading.Event(), threading.Event()

    def other_block() -> None:
        with peh.use(executor):
            entered.set()
            assert leave.wait(WAIT_S)

    other = threading.Thread(target=other_block)
    try:
        with peh.use(executor):
            with peh.use(executor):
                spare = _bench_worker.prestart("cpu", 30)
                assert spare is not None
                assert _bench_worker.prestart("cpu", 30) is None  # one at a time
            assert _bench_worker.spare() is spare and spare.process.is_alive()
            other.start()
            assert entered.wait(WAIT_S)
        assert _bench_worker.spare() is spare and spare.process.is_alive()  # the other's block
    finally:
        leave.set()
        if other.ident is not None:  # started
            other.join(WAIT_S)
    assert not other.is_alive()
    assert _bench_worker.spare() is None
    _assert_gone(spare.process.pid, timeout_s=30)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("env", "gpu", "starts"),
    [
        ({}, True, True),
        ({"HELION_AUTOTUNE_BENCHMARK_SUBPROCESS": "0"}, True, False),
        ({"WORLD_SIZE": "2"}, True, False),
        ({"CUDA_VISIBLE_DEVICES": ""}, True, False),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, True, False),
        ({}, False, False),
    ],
    ids=["gpu", "subprocess-off", "torchrun", "no-visible-gpu", "hidden-gpu", "no-gpu"],
)
def test_before_helion_a_spare_starts_only_where_helion_will_measure_in_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], gpu: bool, starts: bool
) -> None:
    """Before torch is imported the environment alone decides: Helion's subprocess setting,
    ``torchrun``'s world size, and a visible NVIDIA GPU (told without asking CUDA)."""
    for name in ("HELION_AUTOTUNE_BENCHMARK_SUBPROCESS", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    control = tmp_path / "nvidiactl"
    if gpu:
        control.touch()
    monkeypatch.setattr(_bench_worker, "NVIDIA_CONTROL_DEVICE", str(control))
    monkeypatch.setattr(_bench_worker, "FIRST_GPU", "cpu")
    if "CUDA_VISIBLE_DEVICES" not in env:
        assert _bench_worker.gpu_visible() is gpu
    spare = _bench_worker.prestart_before_helion()
    assert (spare is not None) is starts
    if spare is not None:
        assert spare.device == "cpu"
        _bench_worker.discard()
        _assert_gone(spare.process.pid, timeout_s=30)


_TOP_OF_PROGRAM = """
# install() as a program's first lines, before Helion and torch (docs/helion.md). Helion's
# worker, a spawn child, imports this file again as __mp_main__: these lines run there too.
import json, os, sys, time
sys.path[:0] = [{tests!r}, {root!r}]
from precompile_executor.helion import _bench_worker
_bench_worker.gpu_visible = lambda: True  # stand-ins: this machine has no GPU
_bench_worker.FIRST_GPU = "cpu"
spawned_with = []
_real_init = _bench_worker.EarlyWorker.__init__
def _init(self, *a, **kw):
    spawned_with.append(sorted(m for m in ("helion", "torch") if m in sys.modules))
    _real_init(self, *a, **kw)
_bench_worker.EarlyWorker.__init__ = _init
import precompile_executor.helion as peh
peh.install()

if __name__ == "__main__":
    import psutil
    from test_helion import _fork_batch
    from test_helion_spare import _provider
    spare = _bench_worker.spare()
    out = {{"spawned_with": list(spawned_with), "pid": spare.process.pid}}
    spare.join()
    out["warm"] = spare.error is None
    # Its own re-import of this file ran install() too, while bootstrapping: nothing started.
    out["its_children"] = len(psutil.Process(spare.process.pid).children(recursive=True))
    with _fork_batch(__import__("pathlib").Path(sys.argv[1])) as (bound, args, _ctx):
        provider = _provider(bound, args)
        out["taken"] = provider.__dict__["_early_benchmark_worker"] is spare
        out["ran_in"] = provider._benchmark_worker.run(os.getpid, timeout=60)
        provider.cleanup()
    peh.uninstall()
    print(json.dumps(out))
"""


@pytest.mark.slow  # a whole program in a fresh interpreter
@pytest.mark.timeout(300)
def test_install_at_the_top_starts_the_benchmark_worker_beside_the_programs_imports(
    tmp_path: Path,
) -> None:
    """``install()`` before ``import helion``: the spare's process starts before this process
    imports Helion or torch (so its cold start runs beside them), the provider takes it, and its
    own import of the program's main module, which calls ``install()`` again while the spawn
    child bootstraps, starts nothing."""
    script = tmp_path / "program.py"
    script.write_text(
        textwrap.dedent(_TOP_OF_PROGRAM.format(tests=str(Path(__file__).parent), root=str(ROOT)))
    )
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    env.pop("HELION_AUTOTUNE_PRECOMPILE", None)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["spawned_with"] == [[]]  # one spare, started before helion and torch were here
    assert out["warm"] and out["taken"]
    assert out["ran_in"] == out["pid"]
    assert out["its_children"] == 0
    _assert_gone(out["pid"], timeout_s=30)


_KILLED = """
import os, signal, sys, time
import psutil
from precompile_executor.helion import _bench_worker
spare = _bench_worker.prestart("cpu", 30)
time.sleep(float(sys.argv[1]))
print(spare.process.pid, *(c.pid for c in psutil.Process().children(recursive=True)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("after", [0.3, 12.0], ids=["importing", "warm"])
def test_a_sigkill_of_the_program_leaves_no_spare(after: float) -> None:
    """The spare, and every other process the program started (the guardian, the
    ``multiprocessing`` resource tracker), die with the program that started it, killed while
    the spare still imports Helion (before Helion's own loop arranges anything) or after it
    warmed up."""
    _assert_all_gone(_pids_printed_before_its_sigkill([_KILLED, str(after)]))


_KILLED_WHILE_HELIONS_WORKER_IMPORTS = """
import os, signal
import helion
import psutil
from precompile_executor.helion import _bench_worker
settings = helion.Settings(autotune_benchmark_subprocess=True)
early = _bench_worker.start_early(settings, "cpu")  # Helion's own _start(), as the provider's
print(early.process.pid, *(c.pid for c in psutil.Process().children(recursive=True)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(240)
def test_a_sigkill_while_helions_worker_still_imports_leaves_no_process() -> None:
    """Helion's own worker loop asks for a signal at its parent's death only after ``import
    helion`` in the child: killed before that, the worker would import on for seconds and only
    then see its pipe closed. The guardian kills it at once, and the resource tracker its spawn
    start brought up ends with it."""
    _assert_all_gone(_pids_printed_before_its_sigkill([_KILLED_WHILE_HELIONS_WORKER_IMPORTS]))


_KILLED_INSTALLED = """
import os, signal, sys, time
from precompile_executor.helion import _bench_worker
_bench_worker.gpu_visible = lambda: True  # stand-ins: this machine has no GPU
_bench_worker.FIRST_GPU = "cpu"
import precompile_executor.helion as peh
peh.install()  # before helion and torch: the spare imports them beside this process
import psutil
spare = _bench_worker.spare()
if sys.argv[1] == "warm":
    spare.join()
    assert spare.error is None, spare.error
print(spare.process.pid, *(c.pid for c in psutil.Process().children(recursive=True)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("when", ["starting", "warm"])
def test_a_sigkill_of_an_installed_program_leaves_no_process(when: str) -> None:
    """``install()`` at the top of a program starts the spare; a SIGKILL of the program while
    the spare starts or once it is warm leaves no process of the program's tree: not the spare,
    not the resource tracker its spawn start brought up, not the guardians."""
    env = {**os.environ}
    env.pop("HELION_AUTOTUNE_PRECOMPILE", None)
    pids = _pids_printed_before_its_sigkill([_KILLED_INSTALLED, when], env)
    assert len(pids) >= 3  # the spare, the guardian, the resource tracker, ...
    _assert_all_gone(pids)


def test_check_refuses_a_changed_worker_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spare runs Helion's ``_worker_loop(connection, device)``: another loop is refused
    before anything is patched."""
    from helion.autotuner import benchmark_worker

    def _worker_loop(connection):  # device gone
        raise AssertionError

    monkeypatch.setattr(benchmark_worker, "_worker_loop", _worker_loop)
    with pytest.raises(peh.UnsupportedHelionError, match=r"_worker_loop\(connection, device\)"):
        peh.check_helion()


def test_a_process_still_bootstrapping_starts_no_spare(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spawn child importing its parent's main module (where ``install()`` may sit) starts no
    process: multiprocessing would refuse, and the child is not the program."""
    import multiprocessing

    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    assert _bench_worker.bootstrapping()
    before = {p.pid for p in psutil.Process().children()}
    assert _bench_worker.prestart("cpu", 30) is None
    assert _bench_worker.spare() is None
    assert {p.pid for p in psutil.Process().children()} <= before


@pytest.mark.slow  # two autotunes in a row; the dead and cut-short cases stay in the default run
@pytest.mark.timeout(300)
def test_a_worker_whose_autotune_ended_serves_the_next_autotune_with_its_caches_released(
    tmp_path: Path, executor: PrecompileExecutor
) -> None:
    """While installed, ``cleanup()`` keeps the provider's healthy worker as the spare instead of
    Helion's shutdown: the next autotune's provider takes it warm (no cold start), after the
    kernel arguments Helion's worker cached for the last autotune were dropped. When the
    installation ends, so does the worker."""
    import functools

    from helion.autotuner import kernel_args

    saved = tmp_path / "args.pt"
    torch.save((torch.ones(4),), saved)
    with _fork_batch(tmp_path) as (bound, args, _ctx), peh.use(executor):
        first = _provider(bound, args)
        worker = first._benchmark_worker
        pid = worker._process.pid
        loaded = worker.run(
            functools.partial(kernel_args.load_trusted_kernel_args, str(saved)), timeout=60
        )
        assert float(loaded[0].sum()) == 4.0
        from benchmarks._helion_cpu import cached_kernel_args

        assert worker.run(cached_kernel_args, timeout=60) == 1
        first.cleanup()
        kept = _bench_worker.spare()
        assert kept is not None and kept.process.pid == pid and kept.process.is_alive()
        second = _provider(bound, args)
        try:
            assert second.__dict__["_early_benchmark_worker"] is kept
            again = second._benchmark_worker  # after the release's round trip
            assert kept.error is None and kept.result == {"pid": pid, "released": True}
            assert again.run(os.getpid, timeout=60) == pid
            assert again.run(cached_kernel_args, timeout=60) == 0
            second.cleanup()
            assert _bench_worker.spare().process.pid == pid  # kept again, for a third
        finally:
            second.cleanup()
    assert _bench_worker.spare() is None
    _assert_gone(pid, timeout_s=30)


@pytest.mark.timeout(240)
def test_a_dead_worker_is_not_kept(tmp_path: Path, executor: PrecompileExecutor) -> None:
    """A worker that died (a kernel that crashed it, a kill) is left to Helion's cleanup."""
    with _fork_batch(tmp_path) as (bound, args, _ctx), peh.use(executor):
        provider = _provider(bound, args)
        worker = provider._benchmark_worker
        worker._process.kill()
        worker._process.join(timeout=30)
        provider.cleanup()
        assert _bench_worker.spare() is None


@pytest.mark.timeout(240)
def test_every_job_runs_with_the_triton_variables_the_autotune_has_when_it_sends_it(
    tmp_path: Path, executor: PrecompileExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spare was spawned with the program's ``TRITON_*`` variables; Helion sets its own for the
    autotune (a temporary ``TRITON_CACHE_DIR`` the precompiles fill, ``TRITON_LOCAL_BUILD``).
    Each job runs with the autotuning process's variables of the moment, as in Helion's own worker,
    spawned inside the autotune — not with the spare's, which would compile every config again."""
    import functools

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "programs-cache"))
    monkeypatch.delenv("TRITON_LOCAL_BUILD", raising=False)
    with peh.use(executor):
        spare = _bench_worker.prestart("cpu", 30)
        assert spare is not None
        with _fork_batch(tmp_path) as (bound, args, _ctx):  # TRITON_CACHE_DIR: the autotune's
            provider = _provider(bound, args)
            try:
                assert provider.__dict__["_early_benchmark_worker"] is spare
                worker = provider._benchmark_worker
                monkeypatch.setenv("TRITON_LOCAL_BUILD", "1")  # as Helion sets it, later still
                cache, local = (
                    functools.partial(os.getenv, n)
                    for n in ("TRITON_CACHE_DIR", "TRITON_LOCAL_BUILD")
                )
                assert worker.run(cache, timeout=60) == str(tmp_path / "triton")
                assert worker.run(local, timeout=60) == "1"
                # ... for the job only: the worker's own variables are put back after it
                helions_run = type(worker).__mro__[1].run
                assert helions_run(worker, local, 60) is None
            finally:
                provider.cleanup()


@pytest.mark.timeout(240)
def test_a_worker_whose_job_was_cut_short_is_not_kept(
    tmp_path: Path, executor: PrecompileExecutor, sigint_raises: None
) -> None:
    """Ctrl-C while the provider waits for a job leaves that job's answer on its way down the
    pipe: such a worker would hand it to the next autotune's first job, so it is not kept."""
    import _thread
    import functools
    import threading
    import time

    with _fork_batch(tmp_path) as (bound, args, _ctx), peh.use(executor):
        provider = _provider(bound, args)
        worker = provider._benchmark_worker
        pid = worker._process.pid
        threading.Timer(1.0, _thread.interrupt_main).start()
        with pytest.raises(KeyboardInterrupt):
            worker.run(functools.partial(time.sleep, 6), timeout=60)
        assert worker.alive() and not worker.idle
        provider.cleanup()
        assert _bench_worker.spare() is None
    _assert_gone(pid, timeout_s=30)


@pytest.mark.timeout(120)
def test_a_forked_child_does_not_take_its_parents_spare() -> None:
    """A process forked after the spare started (a data-loader worker, an autotune in a forked
    pool worker) starts with no spare: the parent's is not its child to use, test or kill."""
    spare = _bench_worker.prestart("cpu", 30)
    assert spare is not None
    try:
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status only, never return
            try:
                ok = _bench_worker.spare() is None and _bench_worker.take("cpu") is None
            except BaseException:
                ok = False
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert _bench_worker.spare() is spare and spare.process.is_alive()  # the parent's, intact
    finally:
        _bench_worker.discard()
    _assert_gone(spare.process.pid, timeout_s=30)


def test_install_starts_a_spare_and_a_use_block_leaves_the_start_to_its_autotune(
    monkeypatch: pytest.MonkeyPatch, executor: PrecompileExecutor
) -> None:
    """``install()`` (one per process, kept across autotunes) starts the spare at once; a
    ``use()`` block entered with Helion imported does not: a block that autotunes nothing would
    start and kill a process for nothing, and its autotune's provider starts the worker."""
    calls: list[str] = []
    monkeypatch.setattr(_bench_worker, "prestart_with_torch", lambda: calls.append("prestart"))
    with peh.use(executor):
        pass
    assert calls == []
    peh.install(executor)
    try:
        assert calls == ["prestart"]
    finally:
        peh.uninstall()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("subprocess_setting", ["1", "0"])
def test_install_after_helion_starts_a_spare_without_initialising_cuda_here(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, subprocess_setting: str
) -> None:
    """``install()`` with torch and Helion imported reads Helion's default settings and, where a
    GPU is visible, starts the spare for the current device — without initialising CUDA in the
    program (a later fork of it could not use CUDA; until it is initialised the device is 0)."""
    monkeypatch.setenv("HELION_AUTOTUNE_BENCHMARK_SUBPROCESS", subprocess_setting)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    control = tmp_path / "nvidiactl"
    control.touch()
    monkeypatch.setattr(_bench_worker, "NVIDIA_CONTROL_DEVICE", str(control))
    spare = _bench_worker.prestart_with_torch()
    try:
        assert not torch.cuda.is_initialized()
        if subprocess_setting == "0":
            assert spare is None
        else:
            assert spare is not None and spare.device == "cuda:0"
    finally:
        _bench_worker.discard()
    if spare is not None:
        _assert_gone(spare.process.pid, timeout_s=30)
