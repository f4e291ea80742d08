"""The process-wide hub: worker processes, their sockets, the monitor thread, background jobs.

One hub per parent process owns every worker, so workers outlive the executor that started
them: an executor returns its idle workers to the hub's pool when it shuts down, and the next
executor with the same initializer takes them back (same pids, imports already paid).

Spawn workers are started by loky's process backend — one loky ``Process`` per worker, a fresh
interpreter (fork + exec) fed with cloudpickle — not by a loky executor: an executor breaks as a
whole, and kills its other workers, when any one dies, and each would add a manager thread and
an exit hook to the parent. Each worker runs :func:`._worker.serve`, which connects back to the
hub's Unix socket. Until it says hello, the monitor also watches its process sentinel, so a
worker that dies while starting is noticed at once.

Threads and what they own:

* **monitor** (one): waits on every socket; turns wire messages into state changes under
  ``lock``; enforces deadlines and idle limits. It never blocks on a process and never runs user
  code: kills, reaps and starts go to the job pool, decoding results and setting futures (and so
  the user's done-callbacks) to the settle threads. It alone closes worker sockets.
* **job pool** (bounded, :class:`._jobs.JobPool`): starts workers, kills process groups, reaps
  dead workers and reports their tasks, stops workers.
* **settle threads** (at most a few, a ``JobPool`` too): unpickle results and set futures.
* **memory watcher** (:mod:`._memory`, while a task with a ``memory_limit`` runs or waits):
  samples those tasks' process groups; one past its limit is doomed and killed by a job.

Only the monitor lives for the process's life: idle job, settle and watcher threads end.
* callers' threads: submit, decide under ``lock`` and run the resulting actions.

``lock`` guards every task, worker handle and executor core (one lock: a task's state and its
worker's state always change together). Decisions are made under it; sends, forks, kills and
future updates happen after it is released.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable
from concurrent.futures import CancelledError
from multiprocessing.connection import Connection
from typing import Any, Literal

from loky.backend import get_context

from . import _process
from ._errors import (
    TaskMemoryError,
    TaskTimeoutError,
    WorkerCrashedError,
    WorkerStartError,
    proxy_from_record,
)
from ._fork import fork_task
from ._jobs import JobPool
from ._memory import MemoryGuard, anon_bytes, kill_now
from ._messages import (
    Done,
    Exited,
    Forked,
    ForkRefused,
    ForkWorker,
    Hello,
    Run,
    Started,
    Stop,
    decode,
    encode,
)
from ._state import (
    Action,
    Doom,
    Fork,
    Launch,
    Owner,
    Send,
    Settle,
    StopWorker,
    Task,
    TaskState,
    WorkerHandle,
)
from ._template import serve_template
from ._worker import read_capture_file, serve

log = logging.getLogger("precompile_executor")

_LOKY = get_context("loky")
"""loky's start method: a fresh interpreter (fork + exec), arguments pickled with cloudpickle."""

THREAD_LIMIT_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
"""Set to 1 in every worker (unless the caller set them): one worker per core should not start
a BLAS/OpenMP thread pool of its own (loky's executors limit them likewise), and an imported
numpy or torch then leaves a template single-threaded, so it can fork."""

FORK_FRIENDLY_ENV = {
    # torch.cuda.is_available() (which `import torch._inductor`, and so `import helion`, calls)
    # asks NVML instead of the CUDA runtime: PyTorch's documented way to keep a process
    # forkable. It still leaves the driver's idle thread, which fork_safety() accepts; after a
    # runtime count torch refuses CUDA in forked children (both measured on the H200, session 4).
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    # pyarrow (imported by pandas, which some compile stacks import) starts a jemalloc
    # background thread on import unless told not to: this removes that thread (measured).
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}
"""Set in every worker and template (unless the caller set them), so that common imports leave
fewer native threads in a template that must fork (docs/gpu-runs.md, 2026-12-01)."""

TEMPLATE_FAILURES_BEFORE_FALLBACK = 2
"""A template that dies this many times without serving a fork is given up for its kind:
workers of that kind then start as fresh interpreters."""

WORKER_START_TIMEOUT_S = 600.0
"""How long a new worker may take to start and run its initializer (``import torch`` is slow
on a loaded machine) before it counts as failed."""

JOB_THREADS = 64
"""Most background job threads at once: kills wait out a grace period each, so many may run
at once. Idle ones end (:mod:`._jobs`): only the monitor stays for the process's life."""

SETTLE_THREADS = 4
"""Most threads decoding results and setting futures at once; a slow done-callback holds only
one. Idle ones end, like the job threads."""


class Hub:
    """Process-wide owner of workers, the listening socket, the monitor and the job pools."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # any task or worker changed state
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
        self.conns: dict[Connection, WorkerHandle] = {}
        self._unknown: list[Connection] = []
        self._starting: dict[str, WorkerHandle] = {}
        self.pool: dict[bytes, list[WorkerHandle]] = {}  # idle workers no executor holds
        self.templates: dict[bytes, WorkerHandle] = {}  # the warm template of each worker kind
        self._no_template: dict[bytes, str] = {}  # kinds that start as interpreters, and why
        self._template_deaths: dict[bytes, int] = {}
        self._exit_codes: dict[int, int] = {}  # template-forked workers' exit codes, by pid
        self.workers: set[WorkerHandle] = set()  # every worker not yet dead
        self.cores: weakref.WeakSet[Owner] = weakref.WeakSet()  # drained and aborted at exit
        self.closed = False
        self.exiting = False  # the interpreter is exiting: no new tasks
        self._capture_ids = iter(range(1, 1 << 62))
        self._to_close: list[tuple[Connection, threading.Lock]] = []
        # Both pools start threads on demand and let idle ones end (issue 24: a burst of kills
        # left 64 idle threads for the process's life).
        self._jobs = JobPool(JOB_THREADS, "precompile-job")
        self._settlers = JobPool(SETTLE_THREADS, "precompile-settle")
        self.memory = MemoryGuard(self.lock, self._memory_exceeded, self._repump, self._submit_job)
        self._thread = threading.Thread(
            target=self._monitor, name="precompile-monitor", daemon=True
        )
        self._thread.start()
        # threading's exit hooks run last-registered first, before atexit's and before the
        # thread pools are joined: registered after the import of ThreadPoolExecutor, ours runs
        # while the job pools still take work.
        threading._register_atexit(self._at_exit)  # type: ignore[attr-defined]

    # -- small helpers -----------------------------------------------------------------------

    def new_capture_path(self) -> str:
        """A fresh file path for one worker's captured output."""
        return os.path.join(self._dir, f"out-{next(self._capture_ids)}.txt")

    def wake(self) -> None:
        """Make the monitor recompute its deadlines and the sockets it waits on."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def new_worker(
        self,
        key: bytes,
        owner: Owner | None,
        idle_timeout_s: float | None,
        device: str | None,
        *,
        start: Literal["template", "interpreter"] = "interpreter",
        template_key: bytes = b"",
        max_tasks: int | None = None,
    ) -> WorkerHandle:
        """Register a spawn worker in state ``starting`` (``lock`` held); launch it with
        a :class:`Launch` action."""
        worker = WorkerHandle(
            "spawn",
            key,
            self.new_capture_path(),
            device=device,
            idle_timeout_s=idle_timeout_s,
            start=start,
            template_key=template_key,
        )
        worker.max_tasks = max_tasks
        worker.owner = owner
        self._starting[worker.token] = worker
        self.workers.add(worker)
        return worker

    def take_pooled(self, key: bytes) -> WorkerHandle | None:
        """Take an idle pooled worker of ``key`` (``lock`` held): one step, so an idle expiry
        can never take the same worker."""
        pool = self.pool.get(key)
        while pool:
            worker = pool.pop()
            if worker.state == "idle":
                return worker
        return None

    def put_pooled(self, worker: WorkerHandle, now: float) -> None:
        """Give an idle worker back to the pool (``lock`` held)."""
        worker.owner = None
        worker.since = now
        self.pool.setdefault(worker.key, []).append(worker)
        self.wake()

    def _unpool(self, worker: WorkerHandle) -> None:
        pool = self.pool.get(worker.key)
        if pool and worker in pool:
            pool.remove(worker)

    def stop_idle(self, key: bytes | None = None) -> int:
        """Stop the pooled idle workers of ``key`` (every key: ``None``) and the warm templates
        no live worker came from; return how many workers (no lock held)."""
        with self.lock:
            keys = [key] if key is not None else list(self.pool)
            victims = [w for k in keys for w in self.pool.pop(k, []) if w.state == "idle"]
            # Spares still starting (no executor holds them) would join the pool right after.
            victims += [
                w
                for w in self.workers
                if w.owner is None and w.kind == "spawn" and w.state == "starting" and w.key in keys
            ]
            for worker in victims:
                self.forget(worker)
            # A warm template no live worker came from is only memory now: stop it too.
            in_use = {w.template_key for w in self.workers if w.kind == "spawn"}
            templates = [t for k, t in self.templates.items() if k not in in_use and not t.pending]
            for template in templates:
                self.forget(template)
        self.run([StopWorker(w, kill=False) for w in victims + templates])
        return len(victims)

    # -- running actions (no lock held) --------------------------------------------------------

    def run(self, actions: Iterable[Action]) -> None:
        """Carry out what the executor cores decided under the lock."""
        wake = False
        for action in actions:
            if isinstance(action, Send):
                self._send(action.worker, action.task)
                wake = wake or action.task.timeout is not None
            elif isinstance(action, Fork):
                self._fork(action.task)
            elif isinstance(action, Launch):
                self._submit_job(self._launch, action.worker, action.init_blob)
            elif isinstance(action, Settle):
                self._settle(action.task, action.outcome)
            elif isinstance(action, StopWorker):
                self._submit_job(self._stop, action.worker, action.kill)
        if wake:
            self.wake()

    def _submit_job(self, fn: Any, *args: Any) -> None:
        try:
            self._jobs.submit(fn, *args)
        except RuntimeError:  # the interpreter is past the point of new threads: do it here
            fn(*args)

    def _settle(self, task: Task, outcome: Any) -> None:
        try:
            self._settlers.submit(task.owner.settle, task, outcome)
        except RuntimeError:  # the settle pool is shut down (or exit is near): do it here
            task.owner.settle(task, outcome)

    def _send(self, worker: WorkerHandle, task: Task) -> None:
        assert task.blob is not None
        message = encode(Run(task.id, task.n, task.want_output, task.blob))
        log.debug("task %d on the spawn path, worker pid %d", task.id, worker.pid)
        with worker.send_lock:
            conn = worker.conn
            try:
                if conn is None or conn.closed:
                    raise OSError("socket closed")
                conn.send_bytes(message)
            except (OSError, ValueError):
                # The worker is dying; its end of file (read by the monitor) puts the task,
                # which never started, back in the queue.
                log.debug("task %d: worker pid %d gone before the send", task.id, worker.pid)

    def _fork(self, task: Task) -> None:
        assert task.calls is not None
        worker = WorkerHandle("fork", b"", self.new_capture_path())
        worker.owner = task.owner
        # What the child starts with is the caller's: its memory charge counts from here.
        anon_at_fork = anon_bytes(os.getpid()) if task.memory_limit is not None else 0
        try:
            pid, conn = fork_task(
                task.id,
                task.calls,
                task.want_output,
                worker.capture_path,
                self.guardian.fileno(),
                [self._listener.fileno(), self._wake_r, self._wake_w],
            )
        except Exception as exc:  # noqa: BLE001 - e.g. EAGAIN: too many processes
            with self.lock:
                actions = task.owner.task_failed(task, exc)
            self.run(actions)
            return
        self.guardian.watch(pid)  # the child registered itself too, before anything else
        now = time.monotonic()
        with self.lock:
            worker.pid = pid
            worker.conn = conn
            worker.state = "busy"
            worker.task = task
            task.worker = worker
            task.start(now)
            if task.memory_limit is not None:
                self.memory.watch(task, pid, task.memory_limit, fork_anon=anon_at_fork)
            self.workers.add(worker)
            self.conns[conn] = worker
        log.debug("task %d on the fork path, child pid %d", task.id, pid)
        self.wake()

    def _launch(self, worker: WorkerHandle, init_blob: bytes | None) -> None:
        """Start a spawn worker (job pool): forked from its kind's warm template, or as a
        fresh interpreter."""
        if worker.start == "template":
            with self.lock:
                reason = self._no_template.get(worker.template_key)
            if reason is None:
                self._fork_from_template(worker, init_blob)
                return
        self._start_process(worker, serve, init_blob)

    def _start_process(self, worker: WorkerHandle, target: Any, init_blob: bytes | None) -> None:
        """Start a fresh interpreter (loky) running ``target`` for ``worker``."""
        try:
            with self.lock:
                if self.closed or worker.is_dead():
                    return
            env = {v: "1" for v in THREAD_LIMIT_VARS if v not in os.environ}
            env.update({k: v for k, v in FORK_FRIENDLY_ENV.items() if k not in os.environ})
            if worker.device is not None:
                # Set before the interpreter starts, so CUDA only ever sees this one device.
                env["CUDA_VISIBLE_DEVICES"] = env["PRECOMPILE_EXECUTOR_DEVICE"] = worker.device
            process = _LOKY.Process(
                target=target,
                args=(self.address, worker.token, worker.capture_path, init_blob, worker.max_tasks),
                name=f"precompile-{worker.kind}-{worker.id}",
                env=env,
            )
            process.start()
            self.guardian.watch(process.pid)  # from birth: a parent killed now leaves no orphan
            with self.lock:
                worker.process = process
                worker.pid = process.pid
                gone = self.closed or worker.is_dead()
        except BaseException as exc:  # noqa: BLE001 - report as a failed start
            self._start_failed(worker, exc)
            return
        if gone:  # stopped (or the hub closed) while it was starting
            _process.kill_group(worker.pid, grace_s=0)
            self._retire(worker)
            return
        self.wake()  # watch its sentinel from now on

    # -- warm templates --------------------------------------------------------------------------

    def _fork_from_template(self, worker: WorkerHandle, init_blob: bytes | None) -> None:
        key = worker.template_key
        with self.lock:
            if self.closed or worker.is_dead():
                return
            template = self.templates.get(key)
            new = template is None or template.is_dead()
            if template is None or template.is_dead():
                template = WorkerHandle(
                    "template",
                    key,
                    self.new_capture_path(),
                    idle_timeout_s=worker.idle_timeout_s,
                    template_key=key,
                )
                self.templates[key] = template
                self._starting[template.token] = template
                self.workers.add(template)
            template.pending.append(worker)
            ready = template.state == "idle"
        if new:
            log.debug("starting a warm template for a worker kind")
            self._start_process(template, serve_template, init_blob)
        elif ready:
            self._ask_fork(template, [worker])

    def _ask_fork(self, template: WorkerHandle, workers: list[WorkerHandle]) -> None:
        with self.lock:
            template.since = time.monotonic()
        with template.send_lock:
            conn = template.conn
            for worker in workers:
                try:
                    if conn is None or conn.closed:
                        raise OSError("template socket closed")
                    conn.send_bytes(
                        encode(
                            ForkWorker(
                                worker.token, worker.capture_path, worker.device, worker.max_tasks
                            )
                        )
                    )
                except (OSError, ValueError):
                    pass  # the template is dying: its end of file relaunches what it held

    def _template_message(self, template: WorkerHandle, message: Any) -> None:
        """A template reported a fork, a refusal or a dead child (monitor thread)."""
        if isinstance(message, Exited):
            with self.lock:
                self._exit_codes[message.pid] = message.code
                if len(self._exit_codes) > 10_000:  # never asked for: forget the oldest
                    self._exit_codes.pop(next(iter(self._exit_codes)))
                template.children = max(0, template.children - 1)
                starting = [w for w in self._starting.values() if w.pid == message.pid]
                self.changed.notify_all()
            for early in starting:  # died before it said hello
                self._start_failed(
                    early,
                    WorkerStartError(
                        f"worker pid {message.pid} exited (code {message.code}) before it was "
                        f"ready; its output:\n{read_capture_file(early.capture_path)[-2000:]}"
                    ),
                )
            return
        with self.lock:
            worker = self._starting.get(message.token)
            if worker is not None and worker in template.pending:
                template.pending.remove(worker)
            if isinstance(message, Forked):
                template.children += 1
                self._template_deaths.pop(template.key, None)
                if worker is not None:
                    worker.pid = message.pid
                refused = None
            else:
                refused = message.reason
                first = template.key not in self._no_template
                self._no_template[template.key] = refused
                pending, template.pending = template.pending, []
        if isinstance(message, Forked):
            self.guardian.watch(message.pid)
            return
        if first:
            log.warning(
                "workers of this kind start as fresh interpreters, not from a warm template: %s",
                refused,
            )
        for other in [w for w in (worker, *pending) if w is not None]:
            self._submit_job(self._start_process, other, serve, self._init_blob_of(other))

    def template_refused(self, key: bytes) -> str | None:
        """Why workers of kind ``key`` start as interpreters, or ``None`` (``lock`` held)."""
        return self._no_template.get(key)

    @staticmethod
    def _init_blob_of(worker: WorkerHandle) -> bytes | None:
        return worker.template_key or None  # a kind's key is its pickled initializer

    def _template_gone(self, template: WorkerHandle, said_hello: bool) -> None:
        """A template ended: its pending workers start again (a new template, or after repeated
        deaths, fresh interpreters); a forked worker never depends on its template."""
        with self.lock:
            if self.templates.get(template.key) is template:
                del self.templates[template.key]
            pending, template.pending = template.pending, []
            if not said_hello or pending:
                deaths = self._template_deaths.get(template.key, 0) + 1
                self._template_deaths[template.key] = deaths
                if deaths >= TEMPLATE_FAILURES_BEFORE_FALLBACK:
                    self._no_template.setdefault(
                        template.key, f"its warm template died {deaths} times"
                    )
        for worker in pending:
            self._submit_job(self._launch, worker, self._init_blob_of(worker))

    def exit_code_of(self, worker: WorkerHandle, timeout_s: float = 5.0) -> int | None:
        """A dead spawn worker's exit code (negative: the signal), waiting ``timeout_s`` at most:
        from loky's process, or as its template reports it."""
        process = worker.process
        if process is not None:
            process.join(timeout_s)
            code: int | None = process.exitcode
            return code
        if worker.start != "template" or not worker.pid:
            return None
        end = time.monotonic() + timeout_s
        with self.lock:
            while worker.pid not in self._exit_codes:
                left = end - time.monotonic()
                template = self.templates.get(worker.template_key)
                if left <= 0 or template is None or template.is_dead():
                    # Its template is gone too (stopped with it: terminate_workers()): its
                    # messages were all read before its end, so nobody will report this one.
                    return self._exit_codes.pop(worker.pid, None)
                self.changed.wait(left)
            return self._exit_codes.pop(worker.pid)

    def _stop(self, worker: WorkerHandle, kill: bool) -> None:
        """Stop a worker already marked dead: ask its serve loop to return, or kill its group."""
        if kill or worker.conn is None:
            if worker.pid:
                _process.kill_group(worker.pid, grace_s=0)
            if worker.conn is None:  # never connected: nothing will report its end
                self._retire(worker)
            return
        with worker.send_lock:
            conn = worker.conn
            with contextlib.suppress(OSError, ValueError):
                if not conn.closed:
                    conn.send_bytes(encode(Stop()))
        # its end of file reaches the monitor, which retires it

    # -- worker ends ---------------------------------------------------------------------------

    def forget(self, worker: WorkerHandle) -> None:
        """Drop a worker from every registry (``lock`` held)."""
        worker.die(time.monotonic())
        self.workers.discard(worker)
        self._starting.pop(worker.token, None)
        self._unpool(worker)
        if worker.kind == "template" and self.templates.get(worker.key) is worker:
            del self.templates[worker.key]
        template = self.templates.get(worker.template_key) if worker.kind == "spawn" else None
        if template is not None and worker in template.pending:
            template.pending.remove(worker)  # not forked yet: never will be
        self.changed.notify_all()

    def _start_failed(self, worker: WorkerHandle, error: BaseException) -> None:
        with self.lock:
            if worker.state == "dead":
                return
            self.forget(worker)
            owner = worker.owner
            actions = owner.worker_failed_to_start(worker, error) if owner is not None else []
        if worker.kind == "template":
            log.debug("a warm template failed to start: %s", error)
            self._retire(worker)
            self._template_gone(worker, said_hello=False)
            return
        log.warning("a worker failed to start: %s", error)
        self._retire(worker)
        self.run(actions)

    def _retire(self, worker: WorkerHandle) -> None:
        """Release a dead worker's resources: socket, process, guardian entry, capture file."""
        if worker.conn is not None:
            self._close_conn(worker)
        process = worker.process
        if process is not None:
            process.join(5.0)
            if process.exitcode is None:  # told to stop but still there: no more waiting
                _process.kill_group(worker.pid, grace_s=0)
                process.join(5.0)
        if worker.pid:
            self.guardian.forget(worker.pid)
        with contextlib.suppress(OSError):
            os.unlink(worker.capture_path)

    def _close_conn(self, worker: WorkerHandle) -> None:
        """Close a worker socket. Only the monitor closes sockets while it runs: closing one it
        may be polling would free the fd number for reuse under its feet."""
        conn = worker.conn
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            with worker.send_lock, contextlib.suppress(OSError):
                conn.close()
            return
        with self.lock:
            self._to_close.append((conn, worker.send_lock))
        self.wake()

    def _reap(self, worker: WorkerHandle, task: Task | None) -> None:
        """A worker's socket closed: get its exit code, report its started task (job pool)."""
        code = _reap_child(worker.pid) if worker.kind == "fork" else self.exit_code_of(worker)
        output = read_capture_file(worker.capture_path) if task is not None else ""
        self._retire(worker)
        if task is None:
            return
        doom = task.doom
        error: BaseException
        if doom is not None and doom.reason == "timeout":
            elapsed = doom.at - (task.started_at or doom.at)
            error = TaskTimeoutError(task.timeout or 0.0, elapsed, worker.pid, output)
        elif doom is not None and doom.reason == "memory":
            error = TaskMemoryError(task.memory_limit or 0, task.memory_peak, worker.pid, output)
        else:
            error = WorkerCrashedError(worker.pid, code, output, detail=doom.detail if doom else "")
        with self.lock:
            actions = task.owner.task_failed(task, error)
        self.run(actions)

    # -- killing -------------------------------------------------------------------------------

    def kill_tasks(self, tasks: Iterable[Task], detail: str, grace_s: float) -> list[Task]:
        """Kill the workers running (or about to run) ``tasks``; once reaped, a started one
        fails with ``WorkerCrashedError`` saying ``detail``, one not yet started is cancelled.
        Returns the tasks a kill went out for."""
        now = time.monotonic()
        victims: list[tuple[Task, WorkerHandle]] = []
        with self.lock:
            for task in tasks:
                worker = task.worker
                live = task.state in (TaskState.SENT, TaskState.STARTED)
                if live and task.doom is None and worker is not None:
                    task.doom = Doom("killed", now, detail)
                    victims.append((task, worker))
        threads = [
            threading.Thread(target=_process.kill_group, args=(w.pid, grace_s), daemon=True)
            for _, w in victims
            if w.pid
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=grace_s + 10)
        return [t for t, _ in victims]

    # -- the monitor thread --------------------------------------------------------------------

    def _monitor(self) -> None:
        import selectors

        # One persistent poll set, synchronised with the live sockets each round. poll, not
        # epoll: epoll watches open file descriptions, and a forked child holding a copy of a
        # socket we closed would keep firing events under an fd number that may be reused.
        selector = selectors.PollSelector()
        selector.register(self._listener.fileno(), selectors.EVENT_READ, "listener")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        watched: dict[Any, int] = {}  # a worker socket, or a starting worker (its sentinel)
        while not self.closed:
            try:
                self._monitor_round(selector, watched)
            except BaseException:  # noqa: BLE001 - the monitor must never die: log and go on
                log.exception("precompile_executor monitor: unexpected error (continuing)")
                time.sleep(0.01)
        for fd in watched.values():
            with contextlib.suppress(KeyError, ValueError, OSError):
                selector.unregister(fd)
        selector.close()

    def _watch_list(self) -> dict[Any, int | None]:
        """What the monitor waits on (``lock`` held): every socket, and the process sentinel
        of each worker still starting (fd looked up when first registered)."""
        live: dict[Any, int | None] = dict.fromkeys([*self.conns, *self._unknown])
        for worker in self._starting.values():
            if worker.process is not None and worker.state == "starting":
                live[worker] = worker.process.sentinel
        return live

    def _monitor_round(self, selector: Any, watched: dict[Any, int]) -> None:
        with self.lock:
            live = self._watch_list()
            to_close, self._to_close = self._to_close, []
            timeout = self._next_timer()
        for key in [k for k in watched if k not in live]:
            with contextlib.suppress(KeyError, ValueError, OSError):
                selector.unregister(watched[key])
            del watched[key]
        for conn, send_lock in to_close:  # unregistered above (no longer live): safe to close
            with send_lock, contextlib.suppress(OSError):
                conn.close()
        for key, fd in live.items():
            if key in watched:
                continue
            try:
                fd = key.fileno() if fd is None else fd
                selector.register(fd, 1, key)  # EVENT_READ
            except (KeyError, ValueError, OSError):
                continue  # closed meanwhile: its end is handled elsewhere
            watched[key] = fd
        for key, _ in selector.select(timeout):
            if key.data == "listener":
                self._accept()
            elif key.data == "wake":
                with contextlib.suppress(BlockingIOError, OSError):
                    os.read(self._wake_r, 4096)
            elif isinstance(key.data, WorkerHandle):
                self._died_starting(key.data)
            else:
                self._readable(key.data)
        self._check_timers()

    def _died_starting(self, worker: WorkerHandle) -> None:
        with self.lock:
            if worker.state != "starting":
                return
        code = self.exit_code_of(worker)
        self._start_failed(
            worker,
            WorkerStartError(
                f"worker pid {worker.pid} exited (code {code}) before it was ready; its output:\n"
                f"{read_capture_file(worker.capture_path)[-2000:]}"
            ),
        )

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
        # Everything already in the socket (a quick task's Started and Done arrive together):
        # one poll round per burst, not per message.
        while True:
            try:
                message = decode(conn.recv_bytes())
            except Exception:  # noqa: BLE001 - EOF, a closed socket, a garbled stream: the end
                self._eof(conn)
                return
            self._dispatch(conn, message)
            try:
                if conn.closed or not conn.poll():
                    return
            except (OSError, ValueError):
                return

    def _dispatch(self, conn: Connection, message: Any) -> None:
        if isinstance(message, Started):
            self._started(conn, message)
        elif isinstance(message, Done):
            self._done(conn, message)
        elif isinstance(message, Hello):
            self._hello(conn, message)
        elif isinstance(message, (Forked, ForkRefused, Exited)):
            with self.lock:
                template = self.conns.get(conn)
            if template is not None and template.kind == "template":
                self._template_message(template, message)

    def _hello(self, conn: Connection, message: Hello) -> None:
        actions: list[Action] = []
        with self.lock:
            if conn in self._unknown:
                self._unknown.remove(conn)
            worker = self._starting.pop(message.token, None)
            if worker is None or worker.state != "starting":
                conn.close()  # stopped while starting: its serve loop sees EOF and returns
                return
            worker.pid = message.pid
            worker.conn = conn
            self.conns[conn] = worker
            pending: list[WorkerHandle] = []
            if message.failure is None:
                worker.ready(time.monotonic())
                if worker.kind == "template":
                    pending = list(worker.pending)
                elif worker.owner is not None:
                    actions = worker.owner.worker_ready(worker)
                else:
                    self.put_pooled(worker, worker.since)
                self.changed.notify_all()
        self.guardian.watch(message.pid)
        if message.failure is not None:
            failure = message.failure
            error = WorkerStartError(
                f"the initializer raised in worker pid {message.pid}: "
                f"{failure.exc_type}: {failure.message}"
            )
            error.__cause__ = proxy_from_record(failure)
            if worker.kind == "template":  # the initializer fails: in every worker of the kind
                with self.lock:
                    doomed, worker.pending = worker.pending, []
                for waiting in doomed:
                    self._start_failed(waiting, error)
            self._start_failed(worker, error)
            return
        log.debug("%s pid %d ready", worker.kind, message.pid)
        if pending:
            self._ask_fork(worker, pending)
        self.run(actions)

    def _started(self, conn: Connection, message: Started) -> None:
        with self.lock:
            worker = self.conns.get(conn)
            task = worker.task if worker is not None else None
            if task is not None and task.id == message.task_id and task.state is TaskState.SENT:
                task.start(time.monotonic())
                if task.memory_limit is not None and worker is not None:
                    self.memory.watch(task, worker.pid, task.memory_limit)

    def _memory_exceeded(self, task: Task, pid: int, peak: int) -> None:
        """The memory watcher saw ``task``'s group past its limit: doom it and kill the group
        at once, no grace (the machine's memory is at stake); its end of file makes the
        reaper report :class:`TaskMemoryError`. Watcher thread, no lock held."""
        with self.lock:
            worker = task.worker
            if task.state is not TaskState.STARTED or task.doom is not None:
                return
            if worker is None or worker.pid != pid:
                return
            task.doom = Doom("memory", time.monotonic())
            task.memory_peak = peak
        log.debug("task %d: process group %d past its memory limit, killed", task.id, pid)
        kill_now(pid)
        self._submit_job(_process.kill_group, pid, 0.0)  # waits for them; catches stragglers

    def _repump(self, core: Any) -> None:
        """Memory may have freed: let ``core``'s queue go on (memory watcher, no lock held)."""
        with self.lock:
            actions = core.pump()
        self.run(actions)

    def _done(self, conn: Connection, message: Done) -> None:
        actions: list[Action] = []
        with self.lock:
            worker = self.conns.get(conn)
            task = worker.task if worker is not None else None
            if worker is None or task is None or task.id != message.task_id:
                return
            if task.state is not TaskState.STARTED or task.doom is not None:
                return  # being killed: the reaper reports it
            if message.retire:
                # A sticky CUDA error: this process is done for; replace it like a crashed one.
                log.debug("worker pid %d retires after a sticky CUDA error", worker.pid)
                self.forget(worker)
            elif message.recycle:
                # max_tasks_per_child reached: the worker leaves on its own; a new one replaces
                # it at once (from the warm template: milliseconds).
                self.forget(worker)
            actions += task.owner.task_returned(task, (message, worker.pid))
            if (message.retire or message.recycle) and worker.owner is not None:
                actions += worker.owner.worker_gone(
                    worker, expected=False, recycled=message.recycle
                )
        if message.retire:
            actions.append(StopWorker(worker, kill=True))
        self.run(actions)

    def _eof(self, conn: Connection) -> None:
        actions: list[Action] = []
        with self.lock:
            if conn in self._unknown:
                self._unknown.remove(conn)
                conn.close()
                return
            worker = self.conns.pop(conn, None)
            if worker is None:
                return
            task = worker.task
            was_alive = worker.state != "dead"
            self.forget(worker)
            started = None
            if task is not None and task.state is TaskState.SENT and task.doom is not None:
                actions += task.owner.task_failed(task, CancelledError(task.doom.detail))
            elif task is not None and task.state is TaskState.SENT:
                actions += task.owner.task_lost(task)  # never started: it runs elsewhere
            elif task is not None and task.state is TaskState.STARTED:
                started = task  # the reaper reports it, with the exit code and the output
            owner = worker.owner
            if was_alive and owner is not None:
                expected = worker.kind == "fork" and task is None
                actions += owner.worker_gone(worker, expected=expected)
        with worker.send_lock, contextlib.suppress(OSError):
            conn.close()  # the monitor's own thread, and no send in progress: safe
            worker.conn = None
        if worker.kind == "template":
            self._template_gone(worker, said_hello=True)
        self._submit_job(self._reap, worker, started)
        self.run(actions)

    # -- deadlines and idle limits -----------------------------------------------------------

    def _next_timer(self) -> float | None:
        """Seconds until the next deadline or idle expiry (``lock`` held)."""
        soonest: float | None = None
        for worker in self.workers:
            when: float | None = None
            task = worker.task
            if worker.state == "busy":
                if task is not None and task.deadline is not None and task.doom is None:
                    when = task.deadline
            elif worker.kind == "template" and (worker.children or worker.pending):
                pass  # a template lives while a worker it forked does
            elif worker.state == "idle" and worker.idle_timeout_s is not None:
                when = worker.since + worker.idle_timeout_s
            elif worker.state == "starting":
                when = worker.since + WORKER_START_TIMEOUT_S
            if when is not None and (soonest is None or when < soonest):
                soonest = when
        return None if soonest is None else max(0.0, soonest - time.monotonic())

    def _check_timers(self) -> None:
        now = time.monotonic()
        kills: list[WorkerHandle] = []
        stuck: list[WorkerHandle] = []
        actions: list[Action] = []
        with self.lock:
            for worker in list(self.workers):
                task = worker.task
                if worker.state == "busy" and task is not None:
                    if task.deadline is not None and task.doom is None and now >= task.deadline:
                        task.doom = Doom("timeout", now)
                        kills.append(worker)
                elif worker.idle_expired(now) and not (worker.children or worker.pending):
                    # Taken out of every idle list in this same step: no dispatch can pick it.
                    owner = worker.owner
                    self.forget(worker)
                    if owner is not None:
                        actions += owner.worker_gone(worker, expected=True)
                    actions.append(StopWorker(worker, kill=False))
                elif worker.state == "starting" and now >= worker.since + WORKER_START_TIMEOUT_S:
                    stuck.append(worker)
        for worker in kills:
            # The kill ends the process; its end of file makes the reaper report the timeout.
            self._submit_job(_process.kill_group, worker.pid)
        self.run(actions)
        for worker in stuck:
            self._start_failed(
                worker, TimeoutError(f"worker did not start within {WORKER_START_TIMEOUT_S:g}s")
            )

    # -- exit ----------------------------------------------------------------------------------

    def _at_exit(self) -> None:
        """At interpreter exit: refuse new tasks, let every submitted task finish (as the
        stdlib pools do), then stop every worker. Ctrl-C while waiting kills the running ones."""
        global _exiting
        if os.getpid() != self._pid:
            return  # a forked child exiting: not ours
        _exiting = True
        with self.lock:
            self.exiting = True
            cores = list(self.cores)
        try:
            for core in cores:
                core.drain_at_exit()
        except BaseException:  # noqa: BLE001 - Ctrl-C: kill what runs, then close
            for core in cores:
                core.abort("the interpreter exited")
        self.close()

    def close(self) -> None:
        """Stop every worker now: idle ones cleanly, busy and starting ones killed; tasks still
        queued or running fail. Used at exit and by tests."""
        if os.getpid() != self._pid:
            return
        with self.lock:
            if self.closed:
                return
            self.closed = True
            workers = list(self.workers)
            for worker in workers:
                worker.die(time.monotonic())
            cores = list(self.cores)
        self.wake()
        self._thread.join(timeout=5.0)  # no reads in flight from here on
        for core in cores:
            core.abort("the executor's process is closing its workers")
        with self.lock:
            unknown, self._unknown = self._unknown, []
            to_close, self._to_close = self._to_close, []
        for conn, send_lock in to_close:
            with send_lock, contextlib.suppress(OSError):
                conn.close()
        for conn in unknown:
            with contextlib.suppress(OSError):
                conn.close()
        with contextlib.suppress(OSError):
            self._listener.close()
        for worker in workers:
            if worker.state == "busy" or worker.conn is None or worker.kind == "fork":
                if worker.pid:
                    _process.kill_group(worker.pid, grace_s=0)
            else:
                with worker.send_lock, contextlib.suppress(OSError, ValueError):
                    worker.conn.send_bytes(encode(Stop()))
        for worker in workers:
            if worker.kind == "fork":
                _reap_child(worker.pid)
            self._retire(worker)
        self._jobs.shutdown(wait=True)
        self._settlers.shutdown(wait=True, timeout_s=10.0)
        self.guardian.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def _reap_child(pid: int) -> int | None:
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
_exiting = False


def get_hub() -> Hub:
    """The process's hub, created on first use (and again in a forked child).

    Raises:
        RuntimeError: the interpreter is exiting (as the stdlib pools do).
    """
    global _hub
    with _hub_lock:
        if _exiting:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        if _hub is None or _hub.closed:
            _hub = Hub()
        return _hub


def current_hub() -> Hub | None:
    """The process's hub if one exists (never creates one)."""
    return _hub


def _forget_hub_in_child() -> None:
    global _hub, _hub_lock, _exiting
    _hub = None
    _hub_lock = threading.Lock()
    _exiting = False


os.register_at_fork(after_in_child=_forget_hub_in_child)
