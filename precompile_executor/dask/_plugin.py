"""``NodePlugin``: the ``WorkerPlugin`` that gives each dask worker its node-local pool.

Registered by the caller's :class:`~._executor.DaskPrecompileExecutor` (dask sends it to every
worker, and to workers that join later). On each node:

* ``setup`` (the worker's event loop) builds a node-local ``PrecompileExecutor`` with
  ``max_workers`` = the node's window and starts warming it in a background thread;
* ``run`` (a dask executor thread, from :func:`._node.run_task`) submits one pre-pickled call,
  tells the caller when it really starts, waits for it and turns the result into an outcome;
* ``kill`` (the event loop, from ``Client.run``) cancels a task not yet started on the node, or
  hands the kill of a running one to a thread: the loop never blocks;
* ``teardown`` shuts the node-local executor down; its idle workers stay warm in the dask
  worker's process-wide pool for the next executor with the same initializer.

:class:`NodeCleanupPlugin` (one per cluster, never unregistered) stops those pools when the dask
worker closes: a dask worker is a ``multiprocessing`` child, which joins its non-daemonic
children and skips ``atexit`` hooks on exit, so warm pool workers would hold it until the nanny's
kill.

The plugin holds only bytes and numbers until ``setup``: the scheduler stores it unopened.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
import uuid
from concurrent.futures import CancelledError, Future
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from ._node import DAEMON_MESSAGE, Outcome, call_blob, is_daemon, refused
from ._plan import node_window

log = logging.getLogger("precompile_executor.dask")

WARM_TIMEOUT_S = 300.0
"""Longest the background warm-up waits for the node's pool (an initializer importing torch and
triton takes seconds; more means something is wrong, and tasks then report it themselves)."""

START_POLL_MAX_S = 0.02
"""Longest pause between checks for "the node-local task has started": the start reaches the
caller at most this late, and a task that ends first needs no start report at all."""

_MAX_EARLY_KILLS = 10_000
"""Kills for keys not (yet) on this node are remembered, so a task that arrives after its kill is
refused; bounded because a kill for a task that never arrives would otherwise stay forever."""


class NodePlugin(WorkerPlugin):
    """Hosts one node-local ``PrecompileExecutor`` in a dask worker (see the module docstring)."""

    def __init__(self, name: str, settings: bytes, max_workers_per_node: int | None) -> None:
        self.name = name
        self._settings = settings  # cloudpickled (initializer, initargs, classify)
        self._max_workers_per_node = max_workers_per_node

    # -- lifecycle (the worker's event loop) -----------------------------------------------------

    def setup(self, worker: Any) -> None:
        """Build the node-local executor and warm it in the background; never raises."""
        self.token = uuid.uuid4().hex
        self.lock = threading.Lock()
        self.tasks: dict[str, Future[Any]] = {}
        self.early_kills: set[str] = set()
        self.window = node_window(worker.state.nthreads, self._max_workers_per_node)
        self.error: str | None = None
        self.executor: Any = None
        if is_daemon():
            self.error = DAEMON_MESSAGE
            log.error("%s", DAEMON_MESSAGE)
            return
        try:
            import cloudpickle

            from precompile_executor import PrecompileExecutor

            initializer, initargs, classify = cloudpickle.loads(self._settings)
            self.executor = PrecompileExecutor(
                self.window, initializer=initializer, initargs=initargs, classify=classify
            )
        except Exception as exc:  # noqa: BLE001 - reported to every task instead
            self.error = f"the node pool could not be created: {type(exc).__name__}: {exc}"
            log.exception("precompile_executor node pool could not be created")
            return
        threading.Thread(
            target=self._warm_in_background, name="precompile-node-warm", daemon=True
        ).start()

    def _warm_in_background(self) -> None:
        try:
            self.executor.warm_up(timeout=WARM_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the node's tasks report it with their error
            log.warning("precompile_executor node pool did not warm up: %s", exc)

    def teardown(self, worker: Any) -> None:
        """Stop the node-local executor; its idle workers stay warm in this process's pool."""
        executor = getattr(self, "executor", None)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    # -- tasks (dask executor threads) -----------------------------------------------------------

    def warm_up(self, timeout: float | None) -> list[int]:
        """Start every pool worker of this node now; return their pids (a thread, not the loop)."""
        if self.executor is None:
            raise RuntimeError(self.error or "the node pool is not available")
        pids: list[int] = self.executor.warm_up(timeout=timeout)
        return pids

    def run(
        self, key: str, blob: bytes, timeout: float | None, with_output: bool, topic: str
    ) -> Outcome:
        """Run one pre-pickled call on the node-local pool; return its outcome. Never raises."""
        if self.executor is None:
            return refused("unavailable", self.error or "the node pool is not available")
        with self.lock:
            if key in self.early_kills:
                self.early_kills.discard(key)
                return refused("cancelled", "cancelled before it reached the node")
            view = self.executor.options(timeout=timeout, with_output=with_output)
            local: Future[Any] = view.submit(call_blob, blob)
            self.tasks[key] = local
        try:
            self._report_start(local, key, topic)
            return _outcome(local, with_output)
        finally:
            with self.lock:
                self.tasks.pop(key, None)

    def _report_start(self, local: Future[Any], key: str, topic: str) -> None:
        """Tell the caller when the node-local pool really starts the task (not when dask did)."""
        pause = 0.0005
        while not local.running() and not local.done():
            time.sleep(pause)
            pause = min(pause * 2, START_POLL_MAX_S)
        if local.running():
            from distributed import get_worker

            get_worker().log_event(topic, {"key": key})

    def kill(self, key: str) -> bool:
        """Cancel ``key`` if queued on this node, else kill its pool worker's group (a thread)."""
        with self.lock:
            local = self.tasks.get(key)
            if local is None:
                if len(self.early_kills) >= _MAX_EARLY_KILLS:
                    self.early_kills.clear()
                self.early_kills.add(key)
                return False
        if local.cancel():
            return True
        from precompile_executor import kill_running_futures

        threading.Thread(
            target=kill_running_futures, args=([local],), name="precompile-node-kill", daemon=True
        ).start()
        return True


class NodeCleanupPlugin(WorkerPlugin):
    """Stops every node pool of this dask worker when the worker closes (see the docstring)."""

    name = "precompile-executor-cleanup"
    idempotent = True

    def teardown(self, worker: Any) -> None:
        """Kill the pools' running tasks and stop their idle workers."""
        from precompile_executor import stop_idle_workers

        for plugin in list(worker.plugins.values()):
            executor = getattr(plugin, "executor", None) if isinstance(plugin, NodePlugin) else None
            if executor is not None:
                executor.kill_workers()
        stop_idle_workers()


def _outcome(local: Future[Any], with_output: bool) -> Outcome:
    try:
        result = local.result()
    except CancelledError:
        return refused("cancelled", "cancelled on the node before it started")
    except BaseException as exc:  # noqa: BLE001 - every failure travels as a record
        return {
            "status": "error",
            "error": _pickle_error(exc),
            "classification": getattr(exc, "classification", "raise"),
            "output": "",
            "pid": int(getattr(exc, "worker_pid", 0) or 0),
            "elapsed_s": 0.0,
        }
    if with_output:
        return {
            "status": "ok",
            "value": result.value,
            "output": result.output,
            "pid": result.worker_pid,
            "elapsed_s": result.elapsed_s,
        }
    return {"status": "ok", "value": result, "output": "", "pid": 0, "elapsed_s": 0.0}


def _pickle_error(exc: BaseException) -> bytes:
    """The exception as bytes the caller can load: proxies pickle as plain records."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - a non-proxy exception that does not round-trip
        return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
