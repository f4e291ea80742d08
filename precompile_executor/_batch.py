"""Consuming a batch: :func:`wait_for_all`, the way an autotuner waits for its configs."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, wait
from typing import Any, TypeVar

from ._base import kill_running_futures
from ._errors import Classification, RemoteError, TaskTimeoutError, classification
from ._validate import short_repr

log = logging.getLogger("precompile_executor")

T = TypeVar("T")

_LEVELS = {"raise": logging.ERROR, "warn": logging.WARNING, "debug": logging.DEBUG}


def completed_future(value: T) -> Future[T]:
    """A finished standard ``Future`` holding ``value``, for work that is already done.

    Mix it into a batch where a task would go, e.g. for a config already in the Triton cache:
    it costs no process, no queue slot and no round trip.
    """
    future: Future[T] = Future()
    future.set_running_or_notify_cancel()
    future.set_result(value)
    return future


def _verdict(
    exc: BaseException,
    classify: Callable[[BaseException], Classification] | None,
    ignore_errors: bool,
) -> Classification:
    # Without a hook, a task's error keeps the executor's verdict (set when it was settled).
    default = exc.classification if isinstance(exc, RemoteError) else "raise"
    return classification(exc, classify, ignore_errors, default)


def _cancel_and_kill(futures: Sequence[Future[Any]]) -> None:
    for future in futures:
        future.cancel()
    kill_running_futures(futures)


def wait_for_all(
    futures: Sequence[Future[Any]],
    *,
    classify: Callable[[BaseException], Classification] | None = None,
    ignore_errors: bool = False,
    progress: bool | None = None,
    description: str = "precompiling",
    timeout: float | None = None,
) -> list[bool]:
    """Wait for every future; return, in order, whether each succeeded.

    Each failure is logged through ``logging`` at its classification's level ("raise" → ERROR,
    "warn" → WARNING, "debug" → DEBUG). After all futures are done, the first "raise" failure is
    raised (unless ``ignore_errors``). On any exception while waiting — Ctrl-C included — every
    future not yet done is cancelled and its worker's process group killed before it propagates.

    Args:
        futures: futures from a :class:`PrecompileExecutor` (others work too, without the kill).
        classify: overrides the executor's classification (default: the proxy's own).
        ignore_errors: treat every failure as "debug" and never raise.
        progress: show a rich progress bar (queued / running / ok / failed / timed out).
            ``None``: only when stderr is a terminal.
        description: the progress bar's label.
        timeout: seconds to wait in total; on expiry the rest are cancelled and killed and
            ``TimeoutError`` is raised.

    Raises:
        TypeError: an item of ``futures`` is not a ``concurrent.futures.Future`` (checked
            before any waiting: nothing is cancelled).
    """
    import time

    futures = list(futures)
    stranger = next((f for f in futures if not isinstance(f, Future)), None)
    if stranger is not None:
        raise TypeError(
            "wait_for_all takes concurrent.futures.Future objects (what an executor's submit() "
            f"returns); got {type(stranger).__name__} {short_repr(stranger)}"
        )
    end = None if timeout is None else time.monotonic() + timeout
    show = sys.stderr.isatty() if progress is None else progress
    display = _Progress(futures, description) if show else None
    pending = set(futures)
    try:
        if display is not None:
            display.start()
        while pending:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"{len(pending)} of {len(futures)} tasks unfinished after {timeout}s"
                )
            step = left
            if display is not None:
                step = 0.1 if left is None else min(0.1, left)
            done, pending = wait(pending, timeout=step, return_when=FIRST_COMPLETED)
            if display is not None:
                display.update()
    except BaseException:
        _cancel_and_kill(futures)
        raise
    finally:
        if display is not None:
            display.stop()
    results: list[bool] = []
    first_raise: BaseException | None = None
    for index, future in enumerate(futures):
        if future.cancelled():
            results.append(False)
            log.debug("task %d was cancelled", index)
            continue
        exc = future.exception()
        if exc is None:
            results.append(True)
            continue
        results.append(False)
        verdict = _verdict(exc, classify, ignore_errors)
        log.log(
            _LEVELS[verdict],
            "task %d failed: %s: %s",
            index,
            type(exc).__name__,
            exc,
            exc_info=exc if verdict == "raise" else None,
        )
        if verdict == "raise" and first_raise is None:
            first_raise = exc
    if first_raise is not None:
        raise first_raise
    return results


class _Progress:
    """A rich progress bar over a batch of futures."""

    def __init__(self, futures: Sequence[Future[Any]], description: str) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._futures = futures
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._id = self._bar.add_task(description, total=len(futures), detail="")

    def counts(self) -> dict[str, int]:
        """How many futures are queued, running, ok, failed and timed out."""
        c = {"queued": 0, "running": 0, "ok": 0, "failed": 0, "timed out": 0}
        for f in self._futures:
            if f.running():
                c["running"] += 1
            elif not f.done():
                c["queued"] += 1
            elif f.cancelled():
                c["failed"] += 1
            else:
                try:
                    exc = f.exception(timeout=0)
                except CancelledError:
                    exc = None
                if exc is None:
                    c["ok"] += 1
                elif isinstance(exc, TaskTimeoutError):
                    c["timed out"] += 1
                else:
                    c["failed"] += 1
        return c

    def start(self) -> None:
        self._bar.start()
        self.update()

    def update(self) -> None:
        c = self.counts()
        detail = " ".join(f"{k} {v}" for k, v in c.items())
        self._bar.update(self._id, completed=c["ok"] + c["failed"] + c["timed out"], detail=detail)

    def stop(self) -> None:
        self.update()
        self._bar.stop()
