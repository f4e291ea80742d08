"""The fork path: one forked child of the calling process per task.

The child inherits ``fn`` and its arguments as they are in memory, so nothing is pickled on the
way in: closures over compiled launchers, ``JITFunction`` objects holding locks, Triton's
``AsyncCompileMode`` compile closures all work. The result travels back over a socket the parent
always reads, so a result of any size cannot deadlock on a pipe buffer.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import warnings
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from ._errors import CudaInForkError
from ._wire import Done, encode
from ._worker import Call, OutputCapture, become_group_leader, run_calls, with_output

CUDA_IN_FORK_MESSAGE = (
    "this task ran on the fork path and tried to initialize CUDA in the forked child, which "
    "hangs or crashes once the parent has a CUDA context. Run GPU work on the spawn path: "
    "executor.options(path='spawn'), with a callable that can be pickled."
)


def _forbid_cuda() -> None:
    """Make any CUDA initialization in this (forked) process raise :class:`CudaInForkError`."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None:
        return

    def refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise CudaInForkError(CUDA_IN_FORK_MESSAGE)

    cuda._lazy_init = refuse
    cuda.init = refuse


def fork_task(
    task_id: int,
    calls: Sequence[Call],
    want_output: bool,
    capture: str,
    guardian_fd: int,
    close_fds: Sequence[int],
) -> tuple[int, Connection]:
    """Fork a child that runs ``calls`` and sends one :class:`._wire.Done` back.

    Args:
        task_id: echoed in the child's message.
        calls: ``(fn, args, kwargs)`` triples, run in order.
        want_output: send the captured output even when every call succeeds.
        capture: the file the child's fd 1 and fd 2 go to.
        guardian_fd: the pipe to the guardian: the child registers itself, then closes it.
        close_fds: other fds the child must close at once (the hub's listener and wake pipe).

    Returns:
        The child's pid (also its process-group id) and the parent's end of the socket.
    """
    parent_end, child_end = socket.socketpair()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()  # or the child would print the parent's pending output again
            except (OSError, ValueError):
                pass
    with warnings.catch_warnings():
        # Python 3.12+ warns that fork() in a threaded process may deadlock; the child only
        # runs the task and leaves with os._exit, never touching the parent's threads' locks.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: runs the calls, sends one Done, never returns
        status = 0
        try:
            # First of all, tell the guardian about this process: even if the parent dies before
            # it gets the pid from fork(), the guardian learns of the child and kills it.
            os.write(guardian_fd, f"+{os.getpid()}\n".encode())
            parent_end.close()
            become_group_leader()
            for fd in (guardian_fd, *close_fds):
                with contextlib.suppress(OSError):
                    os.close(fd)
            _forbid_cuda()
            cap = OutputCapture(capture)
            cap.reset()
            outcomes, plain = run_calls(calls, os.getpid())
            output = cap.read()
            failed = any(not ok for ok, _ in outcomes)
            if failed:
                outcomes = with_output(outcomes, output)
            done = Done(task_id, outcomes, output if want_output or failed else None, plain=plain)
            Connection(child_end.detach()).send_bytes(encode(done))
        except BaseException:  # noqa: BLE001 - the parent sees a crash with the captured output
            status = 70
        finally:
            os._exit(status)
    child_end.close()
    return pid, Connection(parent_end.detach())
