"""The launcher: starts worker processes — a spawn worker forked from its kind's warm template, or
a fresh interpreter started by loky; the templates themselves — carries out what the templates'
lifecycle decides (:mod:`._template_lifecycle`), and finds the exit codes of dead workers.

Spawn workers are started by loky's process backend — one loky ``Process`` per worker, a fresh
interpreter (fork + exec) fed with cloudpickle — not by a loky executor: an executor breaks as a
whole, and kills its other workers, when any one dies (docs/design.md, "Why one loky Process per
worker"). Each worker runs :func:`._worker.serve` (a template
:func:`._fork_server.serve_template`), which connects back to the hub's Unix socket; a process
loky started ends without the interpreter's teardown (:func:`._worker.end_interpreter`).

:class:`Launcher` runs on the job pool (``launch``) and on the monitor thread (a template's
messages, its end); it decides under the hub's lock and starts, sends and logs after releasing
it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from loky.backend import get_context

from . import _process
from ._errors import WorkerStartError
from ._fork_server import serve_template
from ._messages import ForkWorker, encode
from ._roster import WorkerRoster
from ._state import WorkerHandle
from ._template_lifecycle import (
    AskFork,
    Decision,
    DiedStarting,
    FailStart,
    Refused,
    StartInterpreter,
    StartTemplate,
    Watch,
)
from ._worker import Startup, read_capture_file, serve_interpreter

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
    # runtime count torch refuses CUDA in forked children (tests/test_gpu.py, docs/gpu-runs.md).
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    # pyarrow (imported by pandas, which some compile stacks import) starts a jemalloc
    # background thread on import unless told not to: this removes that thread
    # (tests/test_contract.py).
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}
"""Set in every worker and template (unless the caller set them), so that common imports leave
fewer native threads in a template that must fork (docs/design.md, "Warm templates")."""


class Ends(Protocol):
    """What the launcher reports a failed start to (:class:`._reaper.Reaper`)."""

    def start_failed(self, worker: WorkerHandle, error: BaseException) -> None: ...

    def retire(self, worker: WorkerHandle) -> None: ...


class LaunchSite(Protocol):
    """What the launcher needs of the hub."""

    lock: threading.RLock
    changed: threading.Condition
    closed: bool
    address: str
    guardian: _process.Guardian

    @property
    def roster(self) -> WorkerRoster: ...

    @property
    def reaper(self) -> Ends: ...

    def submit_job(self, fn: Callable[..., Any], *args: Any) -> None: ...

    def wake(self) -> None: ...


class Launcher:
    """Starts spawn workers and templates for the hub (see the module doc)."""

    def __init__(self, hub: LaunchSite) -> None:
        self._hub = hub
        self.templates = hub.roster.templates

    def launch(self, worker: WorkerHandle, init_blob: bytes | None) -> None:
        """Start a spawn worker (job pool): forked from its kind's warm template, or as a
        fresh interpreter."""
        if worker.start != "template":
            self._start_process(worker, serve_interpreter, init_blob)
            return
        with self._hub.lock:
            if self._hub.closed:
                return
            decisions = self.register_new_templates(self.templates.route(worker))
        self.carry_out(decisions, inline=True)

    def register_new_templates(self, decisions: list[Decision]) -> list[Decision]:
        """Register the templates ``decisions`` start (lock held), in the same step that decided
        them; return ``decisions``."""
        for decision in decisions:
            if isinstance(decision, StartTemplate):
                self._hub.roster.register_starting(decision.template)
        return decisions

    def carry_out(self, decisions: list[Decision], *, inline: bool = False) -> None:
        """Carry out the templates' decisions (no lock held); process starts run here when
        ``inline`` (a job thread), else on the job pool."""
        hub = self._hub
        for decision in decisions:
            if isinstance(decision, StartTemplate):
                log.debug("starting a warm template for a worker kind")
                self._start(decision.template, serve_template, inline)
            elif isinstance(decision, StartInterpreter):
                self._start(decision.worker, serve_interpreter, inline)
            elif isinstance(decision, AskFork):
                self._ask_fork(decision.template, decision.workers)
            elif isinstance(decision, Watch):
                hub.guardian.watch(decision.pid)
            elif isinstance(decision, FailStart):
                hub.reaper.start_failed(decision.worker, decision.error)
            elif isinstance(decision, DiedStarting):
                hub.reaper.start_failed(decision.worker, died_early(decision.worker, decision.code))
            elif isinstance(decision, Refused):
                log.warning(
                    "workers of this kind start as fresh interpreters, not from a warm "
                    "template: %s",
                    decision.reason,
                )

    def template_gone(self, template: WorkerHandle, *, said_hello: bool) -> None:
        """A template ended: its pending workers start again (a new template, or after repeated
        deaths, fresh interpreters); a forked worker never depends on its template."""
        with self._hub.lock:
            decisions = self.templates.gone(
                template, said_hello=said_hello, relaunch=not self._hub.closed
            )
            self.register_new_templates(decisions)
        self.carry_out(decisions)

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
        with self._hub.lock:
            while (code := self.templates.take_exit_code(worker.pid)) is None:
                left = end - time.monotonic()
                template = worker.forked_by
                # A template reports its children's ends before its own (one socket, in order):
                # once it is dead, nobody will report this one.
                if left <= 0 or (template is not None and template.is_dead()):
                    return None
                self._hub.changed.wait(left)
            return code

    def _start(self, worker: WorkerHandle, target: Any, inline: bool) -> None:
        init_blob = worker.template_key or None  # a kind's key is its pickled initializer
        if inline:
            self._start_process(worker, target, init_blob)
        else:
            self._hub.submit_job(self._start_process, worker, target, init_blob)

    def _ask_fork(self, template: WorkerHandle, workers: list[WorkerHandle]) -> None:
        with self._hub.lock:
            template.since = time.monotonic()
        with template.send_lock:
            conn = template.conn
            for worker in workers:
                try:
                    if conn is None or conn.closed:
                        raise OSError("template socket closed")
                    request = ForkWorker(
                        worker.token, worker.capture_path, worker.device, worker.max_tasks
                    )
                    conn.send_bytes(encode(request))
                except (OSError, ValueError):
                    pass  # the template is dying: its end of file relaunches what it held

    def _start_process(self, worker: WorkerHandle, target: Any, init_blob: bytes | None) -> None:
        """Start a fresh interpreter (loky) running ``target`` for ``worker``."""
        hub = self._hub
        try:
            with hub.lock:
                if hub.closed or worker.is_dead():
                    return
            env = {v: "1" for v in THREAD_LIMIT_VARS if v not in os.environ}
            env.update({k: v for k, v in FORK_FRIENDLY_ENV.items() if k not in os.environ})
            if worker.device is not None:
                # Set before the interpreter starts, so CUDA only ever sees this one device.
                env["CUDA_VISIBLE_DEVICES"] = env["PRECOMPILE_EXECUTOR_DEVICE"] = worker.device
            process = _LOKY.Process(
                target=target,
                args=(
                    Startup(
                        hub.address, worker.token, worker.capture_path, init_blob, worker.max_tasks
                    ),
                ),
                name=f"precompile-{worker.kind}-{worker.id}",
                env=env,
            )
            process.start()
            hub.guardian.watch(process.pid)  # from birth: a parent killed now leaves no orphan
            with hub.lock:
                worker.process = process
                worker.pid = process.pid
                gone = hub.closed or worker.is_dead()
        except BaseException as exc:  # noqa: BLE001 - report as a failed start
            hub.reaper.start_failed(worker, exc)
            return
        if gone:  # stopped (or the hub closed) while it was starting
            _process.kill_group(worker.pid, grace_s=0)
            hub.reaper.retire(worker)
            return
        hub.wake()  # watch its sentinel from now on


def died_early(worker: WorkerHandle, code: int | None) -> WorkerStartError:
    """The error of a worker that exited before it said hello."""
    return WorkerStartError(
        f"worker pid {worker.pid} exited (code {code}) before it was ready; its output:\n"
        f"{read_capture_file(worker.capture_path)[-2000:]}"
    )
