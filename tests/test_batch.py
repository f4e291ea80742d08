"""wait_for_all, classification, Ctrl-C and parent death: nothing keeps running."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import crashers
import psutil
import pytest

from precompile_executor import (
    PrecompileExecutor,
    RemoteError,
    TaskTimeoutError,
    WorkerCrashedError,
    wait_for_all,
)

pytestmark = pytest.mark.timeout(90)
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _classify(exc: BaseException) -> str:
    if isinstance(exc, MemoryError) or "out of resources" in str(exc):
        return "debug"
    if isinstance(exc, TaskTimeoutError):
        return "warn"
    return "raise"


def _resource_error() -> None:
    raise RuntimeError("out of resources: shared memory 300000 > 232448")


def test_wait_for_all_logs_each_level_and_raises_on_raise(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="precompile_executor")
    with PrecompileExecutor(2, classify=_classify) as executor:  # type: ignore[arg-type]
        futures = [
            executor.submit(crashers.square, 2),
            executor.submit(_resource_error),
            executor.options(timeout=0.5).submit(time.sleep, 30),
            executor.submit(crashers.raise_two_args),
        ]
        with pytest.raises(crashers.NeedsTwoArgs):
            wait_for_all(futures, progress=False)
        levels = {r.levelname for r in caplog.records if "failed" in r.getMessage()}
        assert levels == {"DEBUG", "WARNING", "ERROR"}
        # the proxies carry their classification
        assert futures[1].exception().classification == "debug"  # type: ignore[union-attr]
        assert futures[2].exception().classification == "warn"  # type: ignore[union-attr]
        assert futures[3].exception().classification == "raise"  # type: ignore[union-attr]
        # ignore_errors: everything is debug, nothing raises
        assert wait_for_all(futures, ignore_errors=True, progress=False) == [
            True,
            False,
            False,
            False,
        ]
        # a classify override at wait time
        assert wait_for_all(futures, classify=lambda e: "warn", progress=False) == [
            True,
            False,
            False,
            False,
        ]


def test_wait_for_all_with_progress_display(capsys: pytest.CaptureFixture[str]) -> None:
    with PrecompileExecutor(2) as executor:
        futures = [executor.submit(crashers.square, i, 0.2) for i in range(4)]
        futures.append(executor.submit(crashers.exit_3))
        assert wait_for_all(futures, progress=True, ignore_errors=True) == [True] * 4 + [False]
        assert isinstance(futures[-1].exception(), WorkerCrashedError)
    err = capsys.readouterr().err
    assert "ok 4" in err and "failed 1" in err


@pytest.mark.timeout(60)
def test_wait_for_all_refuses_what_is_not_a_future_and_cancels_nothing() -> None:
    with PrecompileExecutor(1) as executor:
        future = executor.submit(crashers.square, 5)
        with pytest.raises(TypeError, match=r"concurrent\.futures\.Future.*got int 7"):
            wait_for_all([future, 7], progress=False)
        assert future.result(timeout=60) == 25  # left to run: the call was refused up front


def test_wait_for_all_timeout_cancels_and_kills() -> None:
    with PrecompileExecutor(1) as executor:
        executor.warm_up(timeout=60)
        hung = executor.submit(crashers.c_hang_holding_gil)
        queued = executor.submit(crashers.square, 3)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            wait_for_all([hung, queued], timeout=1.0, progress=False)
        assert time.monotonic() - start < 15
        assert queued.cancelled()
        assert isinstance(hung.exception(timeout=10), WorkerCrashedError)
        assert "interrupted" in str(hung.exception())
        assert executor.submit(crashers.square, 4).result(timeout=60) == 16


# A child inherits an ignored SIGINT (a suite started with ``pytest &`` or ``nohup``), and Python
# then installs no KeyboardInterrupt handler: the script puts Python's own handler back, so the
# SIGINT the Ctrl-C tests send raises KeyboardInterrupt there whatever this process ignores.
_SIGINT_RAISES = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


def _script(body: str, tmp_path: Path) -> subprocess.Popen[str]:
    code = (
        _SIGINT_RAISES + f"import sys; sys.path.insert(0, {TESTS_DIR!r})\n" + textwrap.dedent(body)
    )
    script = tmp_path / "parent.py"
    script.write_text(code)
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_files(paths: list[Path], timeout_s: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(p.exists() and p.read_text().strip() for p in paths):
            return [int(p.read_text()) for p in paths]
        time.sleep(0.05)
    raise AssertionError(f"not all of {paths} appeared")


def _wait_gone(pids: list[int], timeout_s: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = pids
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return []
        time.sleep(0.05)
    return alive


_HANGING_BATCH = """
import os, sys, time, crashers
from precompile_executor import PrecompileExecutor, wait_for_all
d = sys.argv[1]
ex = PrecompileExecutor(3)
pids = ex.warm_up(timeout=60)
open(os.path.join(d, "workers.txt"), "w").write(" ".join(map(str, pids)))
futures = [ex.submit(crashers.hang_with_grandchild, os.path.join(d, f"gc{i}.pid")) for i in range(2)]
futures.append(ex.submit(crashers.c_hang_holding_gil))
"""


def test_ctrl_c_while_waiting_kills_running_tasks(tmp_path: Path) -> None:
    proc = _script(
        _HANGING_BATCH
        + """
try:
    wait_for_all(futures, progress=False)
except KeyboardInterrupt:
    print("interrupted", [type(f.exception()).__name__ for f in futures], flush=True)
    raise SystemExit(130)
""",
        tmp_path,
    )
    try:
        grandchildren = _wait_for_files([tmp_path / "gc0.pid", tmp_path / "gc1.pid"])
        workers = [int(p) for p in (tmp_path / "workers.txt").read_text().split()]
        time.sleep(0.5)  # the third task is in its C hang
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    assert "interrupted" in out and out.count("WorkerCrashedError") == 3, out
    assert _wait_gone(grandchildren) == []
    assert _wait_gone(workers) == []


def test_parent_sigkill_takes_workers_and_grandchildren_down(tmp_path: Path) -> None:
    proc = _script(_HANGING_BATCH + "time.sleep(600)\n", tmp_path)
    try:
        grandchildren = _wait_for_files([tmp_path / "gc0.pid", tmp_path / "gc1.pid"])
        workers = [int(p) for p in (tmp_path / "workers.txt").read_text().split()]
        time.sleep(0.5)
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert _wait_gone(workers + grandchildren, timeout_s=15) == []


def test_executor_context_exit_on_ctrl_c_kills_running(tmp_path: Path) -> None:
    proc = _script(
        """
import os, sys, time, crashers
from precompile_executor import PrecompileExecutor
d = sys.argv[1]
try:
    with PrecompileExecutor(1) as ex:
        f = ex.submit(crashers.hang_with_grandchild, os.path.join(d, "gc0.pid"))
        time.sleep(600)
except KeyboardInterrupt:
    print("exited", type(f.exception()).__name__, flush=True)
""",
        tmp_path,
    )
    try:
        grandchild = _wait_for_files([tmp_path / "gc0.pid"])
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "exited WorkerCrashedError" in out, out
    assert _wait_gone(grandchild) == []


def test_remote_error_is_instance_of_remote_error_for_every_failure_kind() -> None:
    with PrecompileExecutor(2) as executor:
        errors = [
            executor.submit(crashers.segfault).exception(timeout=30),
            executor.options(timeout=0.5).submit(time.sleep, 10).exception(timeout=30),
            executor.submit(crashers.raise_with_lock).exception(timeout=30),
        ]
    assert all(isinstance(e, RemoteError) for e in errors)
    assert all(e.worker_pid > 0 for e in errors)  # type: ignore[union-attr]
