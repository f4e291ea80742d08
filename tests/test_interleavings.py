"""Races between dispatch, worker death, idle expiry and shutdown, and contract edge cases.

Each test provokes one interleaving that once lost a task, hung a future, broke the cap on
running tasks or left a process behind. Races are provoked by repetition, so a test
that passes says only that the race was not hit. Public API only: the internals change.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import gc
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crashers
import interleave_helpers as helpers
import psutil
import pytest

from precompile_executor import (
    KILL_GRACE_S,
    PrecompileExecutor,
    RemoteError,
    TaskTimeoutError,
    WorkerCrashedError,
    WorkerStartError,
    stop_idle_workers,
)

TESTS_DIR = Path(__file__).resolve().parent
ROOT = TESTS_DIR.parent
_HELPER_MARKERS = ("resource_tracker", "signal.SIG_IGN")  # as in conftest


# -- helpers ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _executor(*args: Any, **kwargs: Any) -> Iterator[PrecompileExecutor]:
    """An executor that is shut down cleanly on success and killed on a failure (so a stuck
    task cannot turn a failed test into a hung ``shutdown(wait=True)``)."""
    executor = PrecompileExecutor(*args, **kwargs)
    try:
        yield executor
    except BaseException:
        executor.kill_workers()
        raise
    executor.shutdown(wait=True)


def _is_helper(proc: psutil.Process) -> bool:
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return True
    return any(marker in cmdline for marker in _HELPER_MARKERS)


def _live_children() -> list[psutil.Process]:
    """Live children of this process that are not long-lived helpers."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if not _is_helper(proc):
            out.append(proc)
    return out


def _is_dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_dead(pid: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not _is_dead(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} still alive {timeout_s}s after SIGKILL")
        time.sleep(0.001)


def _peak_overlap(spans: list[tuple[float, float]]) -> int:
    # at equal times an end sorts before a start: touching intervals do not overlap
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def _tagged_processes(tags: set[str]) -> dict[str, list[psutil.Process]]:
    """Live processes (anywhere on the machine) whose environment carries one of ``tags``."""
    found: dict[str, list[psutil.Process]] = {}
    for proc in psutil.process_iter():
        try:
            tag = proc.environ().get("PE_TEST_TAG")
            if tag in tags and proc.status() != psutil.STATUS_ZOMBIE:
                found.setdefault(tag, []).append(proc)
        except psutil.Error:
            continue
    return found


def _kill_tagged(tags: set[str]) -> None:
    for procs in _tagged_processes(tags).values():
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()


@dataclasses.dataclass
class _ScriptResult:
    returncode: int | None  # None: still running at the timeout (then killed)
    stdout: str
    stderr: str


def _run_script(
    code: str, *args: str, timeout: float = 60, tag: str | None = None, cleanup: bool = True
) -> _ScriptResult:
    """Run ``code`` in a fresh interpreter. Everything it starts inherits ``PE_TEST_TAG``, so
    whatever it leaves behind (orphaned workers) is found and, with ``cleanup``, killed. Output
    goes to files, not pipes: an orphan holding a pipe must not keep us waiting."""
    tag = tag or str(uuid.uuid4())
    path = os.pathsep.join([str(ROOT), str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "PE_TEST_TAG": tag}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=out, stderr=err, env=env
        )
        try:
            returncode: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
            proc.kill()
            proc.wait(timeout=10)
        finally:
            if cleanup:
                _kill_tagged({tag})
        out.seek(0)
        err.seek(0)
        return _ScriptResult(returncode, out.read(), err.read())


def _wait_done(futures: list[cf.Future[Any]], timeout: float) -> list[cf.Future[Any]]:
    """Wait until every future is done; return those that are not.

    Not ``concurrent.futures.wait``: it counts a future cancelled with ``cancel()`` as done only
    once the executor has also called ``set_running_or_notify_cancel()`` on it.
    """
    deadline = time.monotonic() + timeout
    while True:
        pending = [f for f in futures if not f.done()]
        if not pending or time.monotonic() > deadline:
            return pending
        time.sleep(0.01)


# -- 1: idle expiry racing a dispatch --------------------------------------------------------------


@pytest.mark.timeout(240)
def test_idle_expiry_racing_a_dispatch_never_loses_a_task() -> None:
    rng = random.Random(1101)
    with _executor(max_workers=2, idle_timeout=0.05) as executor:
        executor.warm_up(timeout=60)
        for round_ in range(40):
            time.sleep(rng.uniform(0.03, 0.07))
            futures = [executor.submit(helpers.noop, 2 * round_ + i) for i in range(2)]
            for i, future in enumerate(futures):
                try:
                    value = future.result(timeout=30)
                except cf.TimeoutError:
                    pytest.fail(f"round {round_}: task {i} never resolved: {future!r}")
                assert value == 2 * round_ + i
        assert executor.statistics().running == 0


# -- 2: a task that never started is not a crashed task ------------------------------------------


@pytest.mark.timeout(300)
def test_a_task_that_never_started_runs_elsewhere_when_an_idle_worker_dies() -> None:
    stop_idle_workers()  # only this executor's workers from here on
    rng = random.Random(1102)
    with _executor(2) as executor:
        for round_ in range(40):
            pids = executor.warm_up(timeout=60)
            os.kill(rng.choice(pids), signal.SIGKILL)
            futures = [executor.submit(helpers.noop, i) for i in range(4)]
            for i, future in enumerate(futures):
                error = future.exception(timeout=30)
                assert error is None, (
                    f"round {round_}: task {i} was submitted after its worker died idle, so it "
                    f"never started, yet it failed: {error!r}"
                )
                assert future.result() == i


# -- 3: workers still starting when the parent dies ------------------------------------------------

_ORPHAN_SCRIPT = """
import os, signal, sys, time
from precompile_executor import PrecompileExecutor
executor = PrecompileExecutor(max_workers=1)
executor.submit(abs, -1)
time.sleep(float(sys.argv[1]))
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(120)
def test_workers_starting_when_the_parent_is_killed_do_not_outlive_it() -> None:
    tags = {}
    try:
        for delay in ("0.0", "0.05", "0.1", "0.3"):
            tag = f"orphan-{delay}-{uuid.uuid4()}"
            tags[tag] = delay
            result = _run_script(_ORPHAN_SCRIPT, delay, tag=tag, cleanup=False)
            assert result.returncode == -signal.SIGKILL, result.stderr
        _assert_none_outlived(tags, "after its first submit")
    finally:
        _kill_tagged(set(tags))


def _assert_none_outlived(tags: dict[str, str], when: str) -> None:
    """No process carrying one of ``tags`` (tag → delay) is alive 15 s after its parent died."""
    deadline = time.monotonic() + 15
    while True:
        left = _tagged_processes(set(tags))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    report = []
    for tag, procs in left.items():
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                report.append(
                    f"parent killed {tags[tag]}s {when}: pid {proc.pid} "
                    f"{' '.join(proc.cmdline())[:100]}"
                )
    assert not report, "processes outlived their killed parent by 15 s:\n" + "\n".join(report)


_FORKING_SCRIPT = """
import os, signal, sys, time
from precompile_executor import PrecompileExecutor
executor = PrecompileExecutor(max_workers=2, start="template")
executor.warm_up(timeout=60)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:  # every task kills its worker: the template forks replacements
    executor.submit(os._exit, 3)
    time.sleep(0.005)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(180)
def test_template_and_forked_workers_die_with_a_parent_killed_mid_fork() -> None:
    tags = {}
    try:
        for delay in ("0.02", "0.1", "0.25", "0.5"):
            tag = f"forking-{delay}-{uuid.uuid4()}"
            tags[tag] = delay
            result = _run_script(_FORKING_SCRIPT, delay, tag=tag, cleanup=False)
            assert result.returncode == -signal.SIGKILL, result.stderr
        _assert_none_outlived(tags, "into a burst of crashes")
    finally:
        _kill_tagged(set(tags))


# -- 4a: a re-queued task is not failed by the dead worker's EOF; no worker stays busy ------------


@pytest.mark.timeout(300)
def test_after_idle_workers_die_no_task_and_no_worker_is_stuck() -> None:
    stop_idle_workers()
    rng = random.Random(1104)
    with _executor(2) as executor:
        for round_ in range(24):
            pids = executor.warm_up(timeout=60)
            victim = rng.choice(pids)
            how = round_ % 3
            if how == 2:
                # Hold the parent's result handling in a slow done-callback, so the victim's
                # socket is closed before the parent can notice the EOF: the send to it fails
                # and its task goes back to the queue while the victim is still "idle".
                blocking = threading.Event()
                quick = executor.submit(helpers.noop, -1)
                quick.add_done_callback(lambda f: (blocking.set(), time.sleep(1.0)))
                assert blocking.wait(timeout=30)
            os.kill(victim, signal.SIGKILL)
            if how != 0:
                _wait_dead(victim)
            futures = [executor.submit(helpers.noop, i) for i in range(4)]
            not_done = _wait_done(futures, timeout=30)
            assert not not_done, f"round {round_}: {len(not_done)} of 4 futures never resolved"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stats = executor.statistics()
            if stats.running == 0 and stats.queued == 0:
                break
            time.sleep(0.05)
        assert (stats.running, stats.queued) == (0, 0), stats
        executor.warm_up(timeout=60)
        spans = [executor.submit(helpers.pid_and_interval, 0.5) for _ in range(2)]
        pids_used = {f.result(timeout=30)[0] for f in spans}
        assert len(pids_used) == 2, (
            f"two 0.5 s tasks on two idle workers both ran on pid {pids_used}: a worker is stuck"
        )


# -- 4b: re-queued tasks and shutdown(cancel_futures=True) / interrupt() ---------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["shutdown(cancel_futures=True)", "interrupt()"])
# Each round starts two workers; the slow run repeats the race five times as often.
@pytest.mark.parametrize("rounds", [8, pytest.param(40, marks=pytest.mark.slow)])
def test_shutdown_and_interrupt_resolve_requeued_tasks(how: str, rounds: int) -> None:
    stop_idle_workers()
    rng = random.Random(1105)
    for round_ in range(rounds):
        # Even rounds: SIGKILL both idle workers and let them die. Odd rounds: a short idle
        # timeout expires as the tasks arrive. Either way a task may be sent to a dead worker
        # and go back to the queue just before shutdown/interrupt empties it.
        expiry = round_ % 2 == 1
        executor = PrecompileExecutor(2, idle_timeout=0.05 if expiry else None)
        try:
            pids = executor.warm_up(timeout=60)
            if expiry:
                time.sleep(rng.uniform(0.03, 0.07))
            else:
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                for pid in pids:
                    _wait_dead(pid)
            futures = [executor.submit(helpers.noop, i) for i in range(12)]
            if how == "interrupt()":
                executor.interrupt()
            else:
                executor.shutdown(wait=False, cancel_futures=True)
            not_done = _wait_done(futures, timeout=30)
            assert not not_done, (
                f"round {round_}: after {how}, {len(not_done)} futures never resolved: "
                f"{[repr(f) for f in not_done][:4]}"
            )
        finally:
            executor.kill_workers()


# -- 4c: the fork path respects max_workers --------------------------------------------------------


@pytest.mark.timeout(120)
def test_fork_path_keeps_the_cap_under_concurrent_submits() -> None:
    n_threads = 8
    for round_ in range(3):
        barrier = threading.Barrier(n_threads)
        futures: list[cf.Future[tuple[int, float, float]]] = []
        lock = threading.Lock()
        with _executor(2, path="fork") as executor:

            def submitter() -> None:
                barrier.wait(timeout=30)
                mine = [executor.submit(helpers.pid_and_interval, 0.05) for _ in range(2)]
                with lock:
                    futures.extend(mine)

            threads = [threading.Thread(target=submitter) for _ in range(n_threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            spans = [f.result(timeout=60) for f in futures]
        peak = _peak_overlap([(s, e) for _, s, e in spans])
        assert peak <= 2, f"round {round_}: {peak} fork tasks ran at once with max_workers=2"


# -- 4d: one guardian process --------------------------------------------------------------------

_GUARDIAN_SCRIPT = """
import threading, time
import psutil
from precompile_executor import PrecompileExecutor

seen = set()
stop = threading.Event()

def watch():
    me = psutil.Process()
    while not stop.is_set():
        for proc in me.children():
            try:
                # the guardian runs `python -S -c <code>`; not a substring test: this very
                # script's text (and so its forked children's cmdline) holds the code's words
                if proc.cmdline()[1:3] == ["-S", "-c"]:
                    seen.add(proc.pid)
            except psutil.Error:
                pass
        time.sleep(0.002)

watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
executor = PrecompileExecutor(8, path="fork")
barrier = threading.Barrier(8)
futures = []

def submit():
    barrier.wait(timeout=30)
    futures.append(executor.submit(time.sleep, 0.2))

threads = [threading.Thread(target=submit) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=30)
for f in futures:
    f.result(timeout=30)
time.sleep(0.1)
stop.set()
watcher.join(timeout=10)
print(len(seen))
executor.shutdown()
"""


@pytest.mark.timeout(120)
def test_concurrent_first_fork_tasks_start_one_guardian() -> None:
    counts = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(counts) < 12:
        result = _run_script(_GUARDIAN_SCRIPT, timeout=60)
        assert result.returncode == 0, result.stderr
        counts.append(int(result.stdout.split()[-1]))
        if counts[-1] != 1:
            break
    assert all(c == 1 for c in counts), f"guardian processes seen per run: {counts}"


# -- 4e: no replacement worker outlives a shutdown -----------------------------------------------


@pytest.mark.timeout(120)
def test_replacement_for_a_crash_on_the_last_task_does_not_outlive_shutdown() -> None:
    stop_idle_workers()
    try:
        for round_ in range(2):
            before = {p.pid for p in _live_children()}
            executor = PrecompileExecutor(1)
            future = executor.submit(crashers.segfault)
            assert isinstance(future.exception(timeout=60), WorkerCrashedError)
            executor.shutdown(wait=True)
            stop_idle_workers()
            time.sleep(5)
            deadline = time.monotonic() + 3
            while True:
                new = [p for p in _live_children() if p.pid not in before]
                if not new or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert not new, (
                f"round {round_}: worker(s) {[p.pid for p in new]} still alive 5 s after "
                "shutdown(wait=True) and stop_idle_workers()"
            )
    finally:
        stop_idle_workers()


# -- 4f: statistics().running -------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_statistics_never_counts_more_running_tasks_than_max_workers() -> None:
    peaks: list[int] = []
    with _executor(2) as executor:
        executor.warm_up(timeout=60)
        stop = threading.Event()

        def poll() -> None:
            peak = 0
            while not stop.is_set():
                peak = max(peak, executor.statistics().running)
                # Let the other threads run between samples: a loop that never releases the
                # GIL starves the monitor to one switch interval per message, and 500 tasks then
                # took over a minute on 2 cores (the check was slow, not the executor).
                time.sleep(0)
            peaks.append(peak)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            futures = [executor.submit(helpers.noop, i) for i in range(500)]
            assert [f.result(timeout=60) for f in futures] == list(range(500))
        finally:
            stop.set()
            poller.join(timeout=10)
    assert peaks and peaks[0] <= 2, f"statistics().running read {peaks} with max_workers=2"


# -- 4g: slow user code in the parent does not delay deadlines -----------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("blocker", ["done-callback", "result unpickling"])
def test_slow_callback_or_unpickling_does_not_delay_a_deadline(blocker: str) -> None:
    with _executor(2) as executor:
        executor.warm_up(timeout=60)
        start = time.monotonic()
        hang = executor.options(timeout=0.5).submit(time.sleep, 100)
        if blocker == "done-callback":
            quick = executor.submit(time.sleep, 0.1)
            quick.add_done_callback(lambda f: time.sleep(3))
        else:
            quick = executor.submit(helpers.slow_to_unpickle, 3.0)
        error = hang.exception(timeout=30)
        took = time.monotonic() - start
        assert isinstance(error, TaskTimeoutError)
        limit = 0.5 + KILL_GRACE_S + 1.0
        assert took <= limit, f"a 0.5 s timeout fired after {took:.2f}s with a slow {blocker}"
        quick.result(timeout=30)


# -- 4h: a view's shutdown ------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_shutting_down_a_view_leaves_its_executor_running() -> None:
    with _executor(1) as executor:
        view = executor.options(timeout=5)
        view.shutdown()
        with pytest.raises(RuntimeError):
            view.submit(abs, -1)
        assert executor.submit(abs, -1).result(timeout=30) == 1


# -- 5a: SystemExit while unpickling a result -------------------------------------------------------

_EXIT_ON_UNPICKLE_SCRIPT = """
import interleave_helpers as helpers
from precompile_executor import PrecompileExecutor

executor = PrecompileExecutor(1)
future = executor.submit(helpers.exits_on_unpickle)
try:
    error = future.exception(timeout=10)
    print("first:", "none" if error is None else type(error).__name__)
except TimeoutError:
    print("first: unresolved")
try:
    print("second:", executor.submit(abs, -1).result(timeout=10))
except BaseException as exc:
    print("second:", type(exc).__name__)
executor.shutdown(wait=False, cancel_futures=True)
"""


@pytest.mark.timeout(120)
def test_system_exit_while_unpickling_a_result_fails_that_task_only() -> None:
    # In a fresh interpreter: on failure the process-wide monitor thread is dead.
    result = _run_script(_EXIT_ON_UNPICKLE_SCRIPT, timeout=90)
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert lines.get("first") not in (None, "none", "unresolved"), result.stdout + result.stderr
    assert lines.get("second") == "1", result.stdout + result.stderr


# -- 5b: exceptions outside Exception ----------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["spawn", "fork"])
def test_base_exceptions_keep_their_type(path: str) -> None:
    with _executor(1, path=path) as executor:
        error = executor.submit(helpers.raise_system_exit, 3).exception(timeout=30)
        assert isinstance(error, RemoteError), repr(error)
        assert isinstance(error, SystemExit), repr(error)
        assert error.code == 3
        mine = executor.submit(helpers.raise_my_base).exception(timeout=30)
        assert isinstance(mine, RemoteError), repr(mine)
        assert isinstance(mine, helpers.MyBase), repr(mine)
    if path == "spawn":  # the stdlib, for reference
        context = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(1, mp_context=context) as stdlib:
            std = stdlib.submit(helpers.raise_system_exit, 3).exception(timeout=60)
        assert isinstance(std, SystemExit) and std.code == 3


# -- 5c: a failed initializer breaks the executor ---------------------------------------------------


def _count_lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.timeout(120)
def test_a_failed_initializer_breaks_the_executor(tmp_path: Path) -> None:
    runs_file = tmp_path / "inits"
    executor = PrecompileExecutor(1, initializer=helpers.failing_init, initargs=(str(runs_file),))
    try:
        queued = executor.submit(abs, -1)
        with pytest.raises(WorkerStartError):
            executor.warm_up(timeout=60)
        assert isinstance(queued.exception(timeout=60), WorkerStartError)
        runs = _count_lines(runs_file)
        assert runs >= 1
        with pytest.raises(cf.BrokenExecutor):
            executor.submit(abs, -1)
        time.sleep(1.0)
        assert _count_lines(runs_file) == runs, "the initializer ran again after it failed"
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
    std_file = tmp_path / "std-inits"
    context = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(
        1, mp_context=context, initializer=helpers.failing_init, initargs=(str(std_file),)
    ) as stdlib:
        assert isinstance(stdlib.submit(abs, -1).exception(timeout=60), cf.BrokenExecutor)
        with pytest.raises(cf.BrokenExecutor):
            stdlib.submit(abs, -1)


# -- 5d: submit() once interpreter shutdown has begun ------------------------------------------------

_ATEXIT_SCRIPT = """
import atexit
import concurrent.futures as cf
from precompile_executor import PrecompileExecutor

executor = PrecompileExecutor(1)
stdlib = cf.ThreadPoolExecutor(1)
assert executor.submit(abs, -1).result(timeout=60) == 1

def late(name, ex):
    try:
        future = ex.submit(abs, -1)
    except RuntimeError:
        print(name, "RuntimeError", flush=True)
        return
    try:
        print(name, "result", future.result(timeout=3), flush=True)
    except BaseException as exc:
        print(name, "future", repr(future), type(exc).__name__, flush=True)

atexit.register(late, "precompile", executor)
atexit.register(late, "stdlib", stdlib)
"""


@pytest.mark.timeout(120)
def test_submit_during_interpreter_shutdown_raises() -> None:
    result = _run_script(_ATEXIT_SCRIPT, timeout=90)
    out = {line.split(" ", 1)[0]: line for line in result.stdout.splitlines()}
    assert out.get("stdlib") == "stdlib RuntimeError", result.stdout + result.stderr
    assert out.get("precompile") == "precompile RuntimeError", result.stdout + result.stderr


# -- 5e: pending tasks at normal interpreter exit -------------------------------------------------

_EXIT_SCRIPT = """
import concurrent.futures as cf
import sys, time
from precompile_executor import PrecompileExecutor

def write_later(path):
    time.sleep(0.5)
    with open(path, "w") as f:
        f.write("done")

executor = PrecompileExecutor(1)
executor.submit(write_later, sys.argv[1])
stdlib = cf.ThreadPoolExecutor(1)
stdlib.submit(write_later, sys.argv[2])
"""


@pytest.mark.timeout(120)
def test_a_task_pending_at_interpreter_exit_still_runs(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "precompile", tmp_path / "stdlib"
    result = _run_script(_EXIT_SCRIPT, str(ours), str(theirs), timeout=60)
    assert theirs.exists()  # the stdlib waits for pending work at exit
    exited = "did not exit within 60 s" if result.returncode is None else "exited"
    assert ours.exists(), f"a task submitted before exit did not run; the interpreter {exited}"
    assert result.returncode == 0, result.stderr


_STOP_SCRIPT = """
import os, sys
import crashers
from precompile_executor import PrecompileExecutor

executor = PrecompileExecutor(
    1, initializer=crashers.note_how_the_process_ends, initargs=(sys.argv[1], sys.argv[2] == "1")
)
assert executor.submit(abs, -1).result(timeout=60) == 1
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("leave_a_thread", [False, True], ids=["forked", "interpreters"])
def test_a_process_the_pool_stops_runs_its_exit_hooks_and_skips_the_teardown(
    tmp_path: Path, leave_a_thread: bool
) -> None:
    """At the caller's exit, the template and every worker started as an interpreter run their
    ``atexit`` hooks (an initializer's, multiprocessing's) and then end without the
    interpreter's teardown: freeing each module one by one takes about a second with torch and
    Inductor imported, and the caller's exit waits for every process it stops."""
    result = _run_script(_STOP_SCRIPT, str(tmp_path), "1" if leave_a_thread else "0")
    assert result.returncode == 0, result.stderr

    def pids(kind: str) -> set[str]:
        return {p.name.split("-", 1)[1] for p in tmp_path.glob(f"{kind}-*")}

    initialized = pids("init")
    # forked: the template alone ran the initializer; interpreters: the template and the worker
    assert len(initialized) == (2 if leave_a_thread else 1), sorted(initialized)
    assert pids("atexit") == initialized, "an initializer's atexit hook did not run at the stop"
    assert pids("teardown") == set(), "a stopped process tore its interpreter down"


# -- 5f: map() drops results it has yielded --------------------------------------------------------


def _assert_map_drops_yielded_results(executor: cf.Executor) -> None:
    results = executor.map(helpers.make_obj, range(3))
    first = next(results)
    ref = weakref.ref(first)
    del first
    gc.collect()
    assert ref() is None, f"{type(executor).__name__}.map keeps the last yielded result alive"
    assert [obj.i for obj in results] == [1, 2]


@pytest.mark.timeout(60)
def test_map_does_not_keep_the_last_result_alive() -> None:
    with cf.ThreadPoolExecutor(1) as stdlib:
        _assert_map_drops_yielded_results(stdlib)
    with _executor(1) as executor:
        _assert_map_drops_yielded_results(executor)
