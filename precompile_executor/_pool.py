"""The process-wide hub: worker processes, their sockets, and the monitor thread.

One hub per parent process owns every worker, so workers outlive the executor that started
them: an executor returns its idle workers here when it shuts down and the next executor with
the same initializer takes them back (same pids, imports already paid).

Spawn workers are started by loky — one ``loky.ProcessPoolExecutor(max_workers=1)`` per worker,
because loky breaks a whole executor, and kills its other workers, when any one worker dies.
Each loky worker runs :func:`._worker.serve`, which connects back to the hub's Unix socket; from
then on tasks travel over that socket, one at a time, straight to an idle worker. The monitor
thread waits on every socket at once, resolves finished tasks, notices dead workers (EOF) and
enforces deadlines.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import re
import secrets
import selectors
import shutil
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Literal

import loky

from . import _process
from ._fork import fork_task
from ._worker import read_capture_file, serve

if TYPE_CHECKING:
    from ._executor import _Core, _Task

log = logging.getLogger("precompile_executor")

WorkerState = Literal["starting", "idle", "busy", "dead"]

WORKER_START_TIMEOUT_S = 600.0
"""How long a new worker may take to start and run its initializer (``import torch`` is slow
on a loaded machine) before it counts as failed."""


def loky_exit_code(exc: BaseException | None) -> int | None:
    """The worker exit code in loky's ``TerminatedWorkerError`` message, e.g. -11 for SIGSEGV.

    loky reports a dead worker only as text ("The exit codes of the workers are {SIGSEGV(-11)}");
    this is the one place that reads it.
    """
    if exc is None:
        return None
    match = re.search(r"\{[A-Z0-9_]*\((-?\d+)\)", str(exc)) or re.search(
        r"exit codes? of the workers? (?:are|is) \{(-?\d+)", str(exc)
    )
    return int(match.group(1)) if match else None


class Worker:
    """The parent's handle on one worker process (a loky worker, or a forked child)."""

    _ids = itertools.count(1)

    def __init__(self, kind: Literal["spawn", "fork"], key: bytes, capture_path: str) -> None:
        self.id = next(self._ids)
        self.kind = kind
        self.key = key
        self.capture_path = capture_path
        self.token = secrets.token_hex(8)
        self.state: WorkerState = "starting"
        self.pid = 0
        self.conn: Connection | None = None
        self.task: _Task | None = None
        self.owner: _Core | None = None
        self.idle_since = time.monotonic()
        self.idle_timeout_s: float | None = None
        self.loky: Any = None
        self.serve_future: Future[Any] | None = None
        self.exit_code: int | None = None
        self.start_error: BaseException | None = None
        self.killing = False
        self.device: str | None = None

    def __repr__(self) -> str:
        return f"<Worker {self.kind} #{self.id} pid={self.pid} {self.state}>"


class Hub:
    """Process-wide owner of workers, the listening socket and the monitor thread."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._pid = os.getpid()
        self._dir = tempfile.mkdtemp(prefix="precompile-executor-")
        self.address = os.path.join(self._dir, "hub.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.address)
        self._listener.listen(256)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.guardian = _process.Guardian()
        self._conns: dict[Connection, Worker] = {}
        self._unknown: list[Connection] = []
        self._starting: dict[str, Worker] = {}
        self.idle: dict[bytes, list[Worker]] = {}
        self.workers: set[Worker] = set()
        self._closed = False
        self._capture_ids = itertools.count(1)
        self._retiring: list[threading.Thread] = []
        self._to_close: list[Connection] = []
        self._thread = threading.Thread(
            target=self._monitor, name="precompile-monitor", daemon=True
        )
        self._thread.start()

    def _register_exit_hook(self) -> None:
        # loky adds its exit hook (which joins its executors, so waits for our serve loops) each
        # time one of its executors starts. These hooks run last-registered first, so ours is
        # registered again after every start: it always runs first and stops the serve loops.
        with contextlib.suppress(RuntimeError):  # already shutting down
            threading._register_atexit(self.close)  # type: ignore[attr-defined]

    # -- helpers ---------------------------------------------------------------------------

    def new_capture_path(self) -> str:
        """A fresh file path for one worker's captured output."""
        return os.path.join(self._dir, f"out-{next(self._capture_ids)}.txt")

    def wake(self) -> None:
        """Make the monitor recompute its deadlines and the sockets it waits on."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def fds_for_fork_child_to_close(self) -> list[int]:
        """Descriptors a forked child must not keep: the guardian's pipe and the listener."""
        fds = [self._listener.fileno(), self._wake_r, self._wake_w]
        gfd = self.guardian.fileno()
        if gfd is not None:
            fds.append(gfd)
        return fds

    # -- starting and stopping workers -------------------------------------------------------

    def take_idle(self, key: bytes) -> Worker | None:
        """Pop a pooled idle worker started with the same initializer (``lock`` held)."""
        pool = self.idle.get(key, [])
        while pool:
            worker = pool.pop()
            if worker.state == "idle":
                return worker
        return None

    def release(self, worker: Worker) -> None:
        """Return a worker to the pool for the next executor (``lock`` held)."""
        worker.owner = None
        worker.idle_since = time.monotonic()
        if worker.state == "idle":
            self.idle.setdefault(worker.key, []).append(worker)
        self.wake()

    def new_spawn_worker(
        self, key: bytes, idle_timeout_s: float | None, device: str | None = None
    ) -> Worker:
        """Register a worker in state ``starting``; call :meth:`launch` outside the lock."""
        worker = Worker("spawn", key, self.new_capture_path())
        worker.idle_timeout_s = idle_timeout_s
        worker.device = device
        self._starting[worker.token] = worker
        self.workers.add(worker)
        return worker

    def launch(self, worker: Worker, init_blob: bytes | None) -> None:
        """Start a loky worker that runs the serve loop for ``worker``."""
        try:
            env = None
            if worker.device is not None:
                # Set before the interpreter starts, so CUDA only ever sees this one device.
                env = {
                    "CUDA_VISIBLE_DEVICES": worker.device,
                    "PRECOMPILE_EXECUTOR_DEVICE": worker.device,
                }
            executor = loky.ProcessPoolExecutor(max_workers=1, timeout=None, env=env)
            with self.lock:
                gone = self._closed or worker.state == "dead"
                worker.loky = None if gone else executor
            if gone:  # stopped (or the interpreter is exiting) while we were starting it
                executor.shutdown(wait=False, kill_workers=True)
                return
            fut = executor.submit(serve, self.address, worker.token, worker.capture_path, init_blob)
        except BaseException as exc:  # noqa: BLE001 - report as a failed start
            if self._closed or sys.is_finalizing() or "after shutdown" in str(exc):
                log.debug("not starting a worker: the interpreter is exiting")
                with self.lock:
                    self._mark_dead(worker)
                return
            self._start_failed(worker, exc)
            return
        self._register_exit_hook()
        worker.serve_future = fut
        fut.add_done_callback(lambda f, w=worker: self._serve_ended(w, f))

    def _serve_ended(self, worker: Worker, fut: Future[Any]) -> None:
        exc = fut.exception() if not fut.cancelled() else None
        code = loky_exit_code(exc)
        with self.lock:
            worker.exit_code = code
            was_starting = worker.state == "starting"
        if exc is not None and was_starting:
            self._start_failed(worker, exc)
        self.wake()

    def _start_failed(self, worker: Worker, exc: BaseException) -> None:
        with self.lock:
            if worker.state == "dead":
                return
            worker.start_error = exc
            self._starting.pop(worker.token, None)
            owner = self._mark_dead(worker)
        self._retire(worker)
        if owner is not None:
            owner.on_start_failed(worker, exc)

    def _mark_dead(self, worker: Worker) -> _Core | None:
        """Forget ``worker`` (``lock`` held); returns its owner."""
        worker.state = "dead"
        if worker.conn is not None:
            self._conns.pop(worker.conn, None)
        self.workers.discard(worker)
        pool = self.idle.get(worker.key)
        if pool and worker in pool:
            pool.remove(worker)
        owner, worker.owner = worker.owner, None
        return owner

    def _close_conn(self, conn: Connection) -> None:
        """Close a worker socket. Only the monitor closes sockets while it runs: closing one it
        may be reading would free the fd for reuse under its feet."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            with contextlib.suppress(OSError):
                conn.close()
            return
        with self.lock:
            self._to_close.append(conn)
        self.wake()

    def _retire(self, worker: Worker) -> None:
        """Release a dead or stopped worker's resources (no lock needed)."""
        if worker.conn is not None:
            self._close_conn(worker.conn)
        if worker.pid:
            self.guardian.forget(worker.pid)
        executor = worker.loky
        if executor is not None:
            worker.loky = None
            thread = threading.Thread(
                target=lambda: executor.shutdown(wait=True, kill_workers=True),
                name="precompile-retire",
                daemon=True,
            )
            with self.lock:
                self._retiring = [t for t in self._retiring if t.is_alive()] + [thread]
            thread.start()
        if not worker.killing:  # the timeout kill still has to read it (and removes it)
            with contextlib.suppress(OSError):
                os.unlink(worker.capture_path)

    def stop(self, worker: Worker, *, kill: bool = False) -> _Core | None:
        """Stop a worker: ask its serve loop to return, or kill its process group.

        Returns the executor core that owned it, for the caller to tell.
        """
        with self.lock:
            if worker.state == "dead":
                return None
            busy = worker.state == "busy"
            owner = self._mark_dead(worker)
        if kill or busy:
            if worker.pid:
                _process.kill_group(worker.pid, grace_s=0)
        elif worker.conn is not None:
            with contextlib.suppress(OSError):
                worker.conn.send_bytes(pickle.dumps(("stop",)))
        self._retire(worker)
        return owner

    def stop_idle(self, key: bytes | None = None) -> int:
        """Stop every pooled idle worker (of ``key``, or all); return how many."""
        with self.lock:
            keys = [key] if key is not None else list(self.idle)
            victims = [w for k in keys for w in self.idle.pop(k, [])]
        for worker in victims:
            self.stop(worker)
        return len(victims)

    # -- the fork path -----------------------------------------------------------------------

    def fork(self, task: _Task, owner: _Core) -> Worker:
        """Fork a child for ``task`` and register it; the child leads its own process group."""
        worker = Worker("fork", b"", self.new_capture_path())
        worker.owner = owner
        self.guardian._ensure()  # so its pipe exists and the child can close it
        assert task.calls is not None
        assert task.calls is not None
        pid, conn = fork_task(
            task.id,
            task.calls,
            task.want_output,
            worker.capture_path,
            self.fds_for_fork_child_to_close(),
        )
        self.guardian.watch(pid)
        with self.lock:
            worker.pid = pid
            worker.conn = conn
            worker.state = "busy"
            worker.task = task
            self.workers.add(worker)
            self._conns[conn] = worker
        self.wake()
        return worker

    # -- sending -----------------------------------------------------------------------------

    def send(self, worker: Worker, message: bytes) -> bool:
        """Send a task message to an idle worker; ``False`` if its socket is gone."""
        conn = worker.conn
        if conn is None:
            return False
        try:
            conn.send_bytes(message)
        except (OSError, ValueError):
            return False
        return True

    # -- the monitor thread --------------------------------------------------------------------

    def _monitor(self) -> None:
        # One persistent poll set, synchronised with the live sockets each round: cheaper per
        # event than building a new selector for every wait. poll, not epoll: epoll watches open
        # file descriptions, and a forked child holding a copy of a socket we closed would keep
        # firing events under an fd number that may belong to a new socket by then. Sockets are
        # registered by fd (a closed Connection can no longer say its fd).
        selector = selectors.PollSelector()
        selector.register(self._listener.fileno(), selectors.EVENT_READ, "listener")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        watched: dict[Connection, int] = {}
        while not self._closed:
            try:
                self._monitor_round(selector, watched)
            except Exception:  # noqa: BLE001 - the monitor must never die: log and go on
                log.exception("precompile_executor monitor: unexpected error (continuing)")
                time.sleep(0.01)
        for conn in watched:
            with contextlib.suppress(KeyError, ValueError, OSError):
                selector.unregister(watched[conn])
        selector.close()

    def _monitor_round(
        self, selector: selectors.BaseSelector, watched: dict[Connection, int]
    ) -> None:
        with self.lock:
            live = {*self._conns, *self._unknown}
            to_close, self._to_close = self._to_close, []
            timeout = self._next_timer()
        for conn in [c for c in watched if c not in live]:
            with contextlib.suppress(KeyError, ValueError, OSError):
                selector.unregister(watched[conn])
            del watched[conn]
        for conn in to_close:  # unregistered above (no longer live), so safe to close now
            with contextlib.suppress(OSError):
                conn.close()
        for conn in live:
            if conn in watched:
                continue
            try:
                fd = conn.fileno()
                selector.register(fd, selectors.EVENT_READ, conn)
            except (KeyError, ValueError, OSError):
                continue  # closed meanwhile: its end is handled elsewhere
            watched[conn] = fd
        for key, _ in selector.select(timeout):
            if key.data == "listener":
                self._accept()
            elif key.data == "wake":
                with contextlib.suppress(BlockingIOError, OSError):
                    os.read(self._wake_r, 4096)
            else:
                self._readable(key.data)
        self._check_timers()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, OSError):
                return
            sock.setblocking(True)
            with self.lock:
                self._unknown.append(Connection(sock.detach()))

    def _readable(self, conn: Connection) -> None:
        try:
            message = pickle.loads(conn.recv_bytes())
        except Exception:  # noqa: BLE001 - EOF, a closed socket, a garbled stream: all the end
            self._eof(conn)
            return
        kind = message[0]
        if kind == "hello":
            self._hello(conn, message)
        elif kind == "done":
            with self.lock:
                worker = self._conns.get(conn)
            if worker is not None:
                self._done(worker, message)

    def _hello(self, conn: Connection, message: tuple[Any, ...]) -> None:
        _, token, pid, failure = message
        with self.lock:
            if conn in self._unknown:
                self._unknown.remove(conn)
            worker = self._starting.pop(token, None)
            if worker is None or worker.state != "starting":
                conn.close()
                return
            worker.pid = pid
            worker.conn = conn
            if failure is None:
                worker.state = "idle"
                worker.idle_since = time.monotonic()
                self._conns[conn] = worker
                owner = worker.owner
                if owner is None:
                    self.idle.setdefault(worker.key, []).append(worker)
        self.guardian.watch(pid)
        if failure is not None:
            from ._errors import WorkerStartError, proxy_from_record

            error = WorkerStartError(
                f"the initializer raised in worker pid {pid}: {failure.exc_type}: {failure.message}"
            )
            error.__cause__ = proxy_from_record(failure)
            self._start_failed(worker, error)
            return
        log.debug("worker pid %d ready", pid)
        if owner is not None:
            owner.on_worker_ready(worker)

    def _done(self, worker: Worker, message: tuple[Any, ...]) -> None:
        _, task_id, outcomes, output = message[:4]
        retire = len(message) > 4 and bool(message[4])
        with self.lock:
            task = worker.task
            if task is None or task.id != task_id or task.claimed:
                return
            task.claimed = True
            worker.task = None
            if worker.kind == "spawn" and worker.state == "busy" and not retire:
                worker.state = "idle"
                worker.idle_since = time.monotonic()
            owner = worker.owner
        if retire:
            # A sticky CUDA error: the worker is done for; replace it like a crashed one.
            log.debug("worker pid %d retired after a sticky CUDA error", worker.pid)
            self.stop(worker, kill=True)
        if owner is not None:
            owner.on_task_done(worker, task, outcomes, output)
            if retire:
                owner.on_worker_gone(worker, expected=False)

    def _eof(self, conn: Connection) -> None:
        with self.lock:
            if conn in self._unknown:
                self._unknown.remove(conn)
                conn.close()
                return
            worker = self._conns.pop(conn, None)
            if worker is None:
                return
            task = worker.task
            lost = task if task is not None and not task.claimed else None
            if lost is not None:
                lost.claimed = True
            owner = self._mark_dead(worker)
        # Reaping and reading loky's report can take a moment: not on the monitor thread.
        threading.Thread(
            target=self._after_death,
            args=(worker, lost, owner),
            name="precompile-reap",
            daemon=True,
        ).start()

    def _after_death(self, worker: Worker, lost: _Task | None, owner: _Core | None) -> None:
        if worker.kind == "fork":
            worker.exit_code = _reap(worker.pid)
        else:
            worker.exit_code = self._spawn_exit_code(worker)
        output = read_capture_file(worker.capture_path) if lost is not None else ""
        self._retire(worker)
        if lost is not None:
            lost.owner.on_task_crashed(lost, worker, worker.exit_code, output)
        if owner is not None:
            owner.on_worker_gone(worker, expected=lost is None and worker.kind == "fork")

    def _spawn_exit_code(self, worker: Worker) -> int | None:
        fut = worker.serve_future
        if fut is None:
            return None
        try:
            exc = fut.exception(timeout=5.0)
        except Exception:  # noqa: BLE001 - not reported in time: the code stays unknown
            return None
        return loky_exit_code(exc) if exc is not None else 0

    # -- deadlines and idle limits -----------------------------------------------------------

    def _next_timer(self) -> float | None:
        """Seconds until the next deadline or idle expiry (``lock`` held)."""
        now = time.monotonic()
        soonest: float | None = None
        for worker in self.workers:
            when: float | None = None
            task = worker.task
            if worker.state == "busy" and task is not None and task.deadline is not None:
                if not task.claimed:
                    when = task.deadline
            elif worker.state == "idle" and worker.idle_timeout_s is not None:
                when = worker.idle_since + worker.idle_timeout_s
            elif worker.state == "starting":
                when = worker.idle_since + WORKER_START_TIMEOUT_S
            if when is not None and (soonest is None or when < soonest):
                soonest = when
        return None if soonest is None else max(0.0, soonest - now)

    def _check_timers(self) -> None:
        now = time.monotonic()
        expired: list[tuple[Worker, _Task]] = []
        idle: list[Worker] = []
        stuck: list[Worker] = []
        with self.lock:
            for worker in self.workers:
                task = worker.task
                if worker.state == "busy" and task is not None and task.deadline is not None:
                    if not task.claimed and now >= task.deadline:
                        task.claimed = True
                        worker.killing = True
                        expired.append((worker, task))
                elif worker.state == "idle" and worker.idle_timeout_s is not None:
                    if now >= worker.idle_since + worker.idle_timeout_s:
                        idle.append(worker)
                elif worker.state == "starting":
                    if now >= worker.idle_since + WORKER_START_TIMEOUT_S:
                        stuck.append(worker)
        for worker, task in expired:
            threading.Thread(
                target=self._kill_for_timeout,
                args=(worker, task, now),
                name="precompile-kill",
                daemon=True,
            ).start()
        for worker in idle:
            owner = self.stop(worker)
            if owner is not None:
                owner.on_worker_gone(worker, expected=True)
        for worker in stuck:
            self._start_failed(
                worker, TimeoutError(f"worker did not start within {WORKER_START_TIMEOUT_S:g}s")
            )

    def _kill_for_timeout(self, worker: Worker, task: _Task, at: float) -> None:
        elapsed = at - (task.started_at or at)
        _process.kill_group(worker.pid)
        output = read_capture_file(worker.capture_path)
        with contextlib.suppress(OSError):
            os.unlink(worker.capture_path)
        task.owner.on_task_timeout(task, worker, elapsed, output)
        # The monitor sees the socket close and retires the worker (see _eof).

    # -- exit ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every worker (at interpreter exit): idle ones cleanly, busy ones killed."""
        if os.getpid() != self._pid:
            return  # a forked child (e.g. a fork-started pool's worker) exiting: not ours
        with self.lock:
            if self._closed:
                return
            self._closed = True
        self.wake()
        self._thread.join(timeout=5.0)  # no reads in flight from here on
        with self.lock:
            workers = list(self.workers)
            unknown, self._unknown = self._unknown, []
            to_close, self._to_close = self._to_close, []
        for conn in to_close:
            with contextlib.suppress(OSError):
                conn.close()
        with contextlib.suppress(OSError):
            self._listener.close()
        for conn in unknown:
            with contextlib.suppress(OSError):
                conn.close()
        for worker in workers:
            self.stop(worker, kill=worker.state == "starting")
        with self.lock:
            retiring = list(self._retiring)
        for thread in retiring:
            thread.join(timeout=10.0)
        self.wake()
        self.guardian.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def _reap(pid: int) -> int | None:
    """Wait for our forked child ``pid`` and return its exit code (negative: signal)."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            _process.kill_group(pid, grace_s=0)
            deadline = time.monotonic() + 5.0
        time.sleep(0.005)


_hub: Hub | None = None
_hub_lock = threading.Lock()


def get_hub() -> Hub:
    """The process's hub, created on first use (and again in a forked child)."""
    global _hub
    with _hub_lock:
        if _hub is None or _hub._closed:
            _hub = Hub()
        return _hub


def _forget_hub_in_child() -> None:
    global _hub, _hub_lock
    _hub = None
    _hub_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_hub_in_child)
