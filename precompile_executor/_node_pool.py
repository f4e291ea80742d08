"""The node side of every cluster backend: one node-local pool and the outcome records it returns.

A cluster backend (``precompile_executor.dask``, ``precompile_executor.ray``) gives each node one
long-lived host process (a dask worker, a Ray actor) that holds a :class:`NodePool`: a
node-local :class:`~precompile_executor.PrecompileExecutor` whose own threads own the pool
workers, their timeouts, group kills, output capture and classification, exactly as on one
machine. The host hands it pre-pickled calls and sends back plain :data:`Outcome` records
(bytes, str, numbers), so the cluster's own serialization never meets a user object, a user
exception or Triton.

Threads: :meth:`NodePool.submit`, :meth:`NodePool.release` and :meth:`NodePool.kill` may be
called from any thread of the host (the lock guards ``tasks`` and ``early_kills``); a kill of a
running task runs in a thread of its own, so the caller (an event loop) never blocks.

This module imports nothing heavy at import time: a dask scheduler can unpickle a task that
names :func:`call_blob` without Triton or the user's modules.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import pickle
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future
from typing import Any

log = logging.getLogger("precompile_executor")

Outcome = dict[str, Any]
"""``status``: ``"ok"`` (``value``: the cloudpickled result), ``"error"`` (``error``: the pickled
exception, a ``RemoteError`` proxy as a plain record; ``classification``), or ``"refused"``
(``reason``: ``"cancelled"``, ``"node-changed"`` or ``"unavailable"``; ``message``). Always also
``output`` (str), ``pid`` (int) and ``elapsed_s`` (float)."""

WARM_TIMEOUT_S = 300.0
"""Longest the background warm-up waits for the node's pool (an initializer importing torch and
triton takes seconds; more means something is wrong, and tasks then report it themselves)."""

_MAX_EARLY_KILLS = 10_000
"""Kills for keys not (yet) on this node are remembered, so a task that arrives after its kill is
refused; bounded because a kill for a task that never arrives would otherwise stay forever."""


@dataclasses.dataclass(frozen=True)
class NodeCall:
    """One pre-pickled call as the caller sends it to a node (plain data: it crosses the
    cluster's own serialization unopened).

    Attributes:
        key: the task's name, the same on both sides (kills and starts name it).
        blob: the cloudpickled ``(fn, args, kwargs)``, opened only in a pool worker.
        timeout: seconds from the task's start on the node, or ``None``.
        with_output: the result comes back as a ``TaskResult`` with the captured output.
        memory_limit: bytes the task's process group may hold on the node, or ``None``.
    """

    key: str
    blob: bytes
    timeout: float | None
    with_output: bool
    memory_limit: int | None = None


def triton_version() -> str | None:
    """This process's Triton version, from its distribution's metadata (``None``: no Triton).

    Read from the metadata rather than ``triton.__version__`` so that neither side imports
    Triton to compare (a dask scheduler or a node used for other work may not have it).
    """
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclasses.dataclass(frozen=True)
class TritonCheck:
    """The caller's Triton version, which a node must have to join (``require_same_triton``).

    A node with another Triton would compile binaries under cache keys the caller never looks
    up (Triton's version is part of every key), so it gets no tasks. Triton missing on both
    sides counts as the same.

    Attributes:
        caller: the caller's Triton version, or ``None`` where it has no Triton.
    """

    caller: str | None

    def refusal(self, node: str) -> str | None:
        """Why ``node`` (named in the message) may not join, or ``None`` where it may."""
        here = triton_version()
        if here == self.caller:
            return None
        return (
            f"node {node} has {_triton_name(here)} but the caller has "
            f"{_triton_name(self.caller)}: kernels compiled there would be cached under keys the "
            "caller never looks up (Triton's version is part of the key), so it gets no tasks. "
            f"{_triton_fix(self.caller)}, or pass require_same_triton=False if this executor "
            "runs no Triton compiles."
        )


def _triton_name(version: str | None) -> str:
    return f"Triton {version}" if version is not None else "no Triton"


def _triton_fix(caller: str | None) -> str:
    if caller is None:
        return "Uninstall Triton on the node (or install it here)"
    return f"Install triton=={caller} on the node"


def refused(reason: str, message: str) -> Outcome:
    """The outcome of a task the node did not run."""
    return {
        "status": "refused",
        "reason": reason,
        "message": message,
        "output": "",
        "pid": 0,
        "elapsed_s": 0.0,
    }


def call_blob(blob: bytes) -> bytes:
    """Run a pickled ``(fn, args, kwargs)`` in a node-local pool worker; return the result pickled.

    The result is pickled here, in the pool worker, so the host process in between only ever
    holds bytes: a result class it cannot import never reaches it.
    """
    import cloudpickle

    from precompile_executor import ResultSerializationError

    fn, args, kwargs = cloudpickle.loads(blob)
    value = fn(*args, **kwargs)
    try:
        return bytes(cloudpickle.dumps(value))
    except Exception as exc:
        raise ResultSerializationError(
            f"the task's result could not be pickled in the worker: {type(exc).__name__}: {exc}. "
            "Return plain data."
        ) from exc


class NodePool:
    """One node-local ``PrecompileExecutor`` and the tasks a host process has handed it.

    Args:
        settings: cloudpickled ``(initializer, initargs, classify)``.
        window: the pool's ``max_workers``: tasks the node runs at once.
        devices: the node's GPUs to pin pool workers to (``PrecompileExecutor(devices=)``).

    ``error`` is set (and ``executor`` is None) when the pool could not be created: every task
    is then refused with that message. Never raises.
    """

    def __init__(
        self, settings: bytes, window: int, devices: Sequence[int | str] | None = None
    ) -> None:
        self.window = window
        self.lock = threading.Lock()
        self.tasks: dict[str, Future[Any]] = {}
        self.early_kills: set[str] = set()
        self.error: str | None = None
        self.executor: Any = None
        try:
            import cloudpickle

            from precompile_executor import PrecompileExecutor

            initializer, initargs, classify = cloudpickle.loads(settings)
            self.executor = PrecompileExecutor(
                window,
                initializer=initializer,
                initargs=initargs,
                classify=classify,
                devices=devices,
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

    def warm_up(self, timeout: float | None) -> list[int]:
        """Start every pool worker now; return their pids (blocks: call it from a thread)."""
        if self.executor is None:
            raise RuntimeError(self.error or "the node pool is not available")
        pids: list[int] = self.executor.warm_up(timeout=timeout)
        return pids

    def submit(self, call: NodeCall) -> Future[Any] | Outcome:
        """Hand one pre-pickled call to the pool: its node-local future, or a refusal.

        ``memory_limit`` is enforced by the node-local pool as on one machine (the task's
        process group on this node; past it: ``TaskMemoryError``)."""
        if self.executor is None:
            return refused("unavailable", self.error or "the node pool is not available")
        with self.lock:
            if call.key in self.early_kills:
                self.early_kills.discard(call.key)
                return refused("cancelled", "cancelled before it reached the node")
            view = self.executor.options(
                timeout=call.timeout, with_output=call.with_output, memory_limit=call.memory_limit
            )
            local: Future[Any] = view.submit(call_blob, call.blob)
            self.tasks[call.key] = local
        return local

    def release(self, key: str) -> None:
        """Forget ``key`` once its outcome is taken."""
        with self.lock:
            self.tasks.pop(key, None)

    def kill(self, key: str) -> bool:
        """Cancel ``key`` if queued in the pool, else kill its worker's group (in a thread)."""
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

    def close(self) -> None:
        """Stop the pool's executor; its idle workers stay warm in this process's pool."""
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)


def outcome_of(local: Future[Any], with_output: bool) -> Outcome:
    """The :data:`Outcome` of a finished node-local future (never raises)."""
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
