"""The warm template: one interpreter per worker kind that pays the initializer once, then forks
workers on request, in milliseconds, already warm.

Runs in a process started by loky (a fresh interpreter, like any spawn worker). It connects to
the parent, runs the initializer (imports, an optional warm-up compile) with its output captured,
says hello, and then serves :class:`._wire.ForkWorker` requests. Before every fork it checks
that forking is safe — one thread, CUDA never initialized — and refuses otherwise (the parent then
starts that worker as a fresh interpreter and says why in its log). A forked worker closes the
template's socket, pins itself to its device (``CUDA_VISIBLE_DEVICES`` before anything touches
CUDA) and runs :func:`._worker.serve`: its own session and process group, capture file, socket
and hello, exactly as a loky-started worker. The template reaps its children and reports each
exit code, which only it can know.

Nothing here imports the parent-side executor.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from multiprocessing.connection import Connection, wait
from typing import NoReturn

from ._wire import Exited, Forked, ForkRefused, ForkWorker, decode, encode
from ._worker import (
    Startup,
    become_group_leader,
    connect_and_initialize,
    drop_inherited_trackers,
    end_interpreter,
    serve,
)

DRIVER_THREAD = re.compile(r"cuda[0-9a-f]+")
"""The kernel name of the thread the CUDA driver leaves when something only asks it (or NVML)
how many devices there are — e.g. ``cuda00001800007`` after ``torch.cuda.is_available()``,
which ``import torch._inductor`` and so ``import helion`` call at import. (A CUDA context's own
threads are named otherwise, ``cuda-EvtHandlr`` and the like, and are never accepted.)"""


def fork_safety() -> str | None:
    """Why forking this process now would be unsafe, or ``None`` when it is safe.

    Safe: no thread but this one, or besides it only the CUDA driver's idle threads of a device
    count that initialized no CUDA context and left torch able to use CUDA in a child (a worker
    forked after ``torch.cuda.is_available()`` with the NVML check, or after ``import helion``,
    opens its context and runs kernels: ``tests/test_gpu.py``,
    ``test_an_initializer_that_asks_if_cuda_is_available``; docs/design.md, "Warm templates").
    A fork copies only the calling thread, and glibc's ``fork`` holds malloc's locks across it,
    so such a thread leaves nothing locked that the child uses; any other thread might.
    """
    import threading

    python_threads = threading.active_count()
    others = _other_threads()
    foreign = [name for name in others if not DRIVER_THREAD.fullmatch(name)]
    if python_threads > 1 or foreign:
        count = max(python_threads, len(others) + 1)
        return (
            f"the initializer left {count} threads running ({', '.join(_thread_names())}; a "
            "fork copies only the calling thread, and locks the others hold would stay locked "
            f"in the child){_gpu_libraries()}"
        )
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None and cuda.is_initialized():
        return "the initializer initialized CUDA (a CUDA context does not survive a fork)"
    if others and _torch_refuses_cuda_after_fork():
        return (
            "the initializer initialized the CUDA runtime (e.g. torch.cuda.is_available() "
            "without PYTORCH_NVML_BASED_CUDA_CHECK=1, or torch.cuda.device_count()): torch "
            f"refuses CUDA in a process forked after that ({', '.join(_thread_names())})"
        )
    return None


_REFUSES_AFTER_FORK: bool | None = None


def _torch_refuses_cuda_after_fork() -> bool:
    """Whether torch would mark a child forked now as unable to use CUDA ("Cannot re-initialize
    CUDA in forked subprocess"): it does once its CUDA runtime counted devices. Known only in a
    child, so one throwaway child is forked to ask, once per template (nothing in a template
    runs after its initializer, so the answer cannot change)."""
    global _REFUSES_AFTER_FORK
    if _REFUSES_AFTER_FORK is None:
        torch = sys.modules.get("torch")
        in_bad_fork = getattr(getattr(torch, "_C", None), "_cuda_isInBadFork", None)
        if in_bad_fork is None:
            _REFUSES_AFTER_FORK = False  # no torch, or torch without CUDA: nothing to refuse
        else:
            try:
                pid = os.fork()
            except OSError:
                return True  # no child to ask (nor, likely, for a worker): refuse, ask again later
            if pid == 0:
                code = 4  # whatever happens here, the child never returns into the template
                try:
                    code = 3 if in_bad_fork() else 0
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            _REFUSES_AFTER_FORK = os.waitstatus_to_exitcode(status) != 0
    return _REFUSES_AFTER_FORK


def _threads() -> list[tuple[int, str]]:
    """This process's threads, ``(tid, kernel name)`` (``/proc/self/task/*/comm``): native
    threads — a CUDA driver thread, ``jemalloc_bg_thd`` — have no Python name."""
    threads = []
    with contextlib.suppress(OSError):
        for tid in sorted(os.listdir("/proc/self/task"), key=int):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
                threads.append((int(tid), f.read().strip()))
    return threads


def _other_threads() -> list[str]:
    """The kernel names of this process's threads other than the calling one."""
    import threading

    me = threading.get_native_id()
    return [name for tid, name in _threads() if tid != me]


def _thread_names() -> list[str]:
    """This process's threads by their kernel names, for a refusal's message."""
    return [name for _, name in _threads()] or ["names unknown"]


def _gpu_libraries() -> str:
    """Which GPU driver libraries this process has loaded, for a refusal's message: a thread
    named ``cuda…`` comes from the CUDA driver (``libcuda``) or from NVML (``libnvidia-ml``,
    what ``torch.cuda.is_available()`` uses with ``PYTORCH_NVML_BASED_CUDA_CHECK=1``)."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return ""
    loaded = [name for name in ("libcuda.so", "libnvidia-ml.so") if name in maps]
    return f"; loaded: {', '.join(loaded)}" if loaded else ""


def serve_template(start: Startup) -> NoReturn:
    """The template's life: initialize once, then fork workers until told to stop (each forked
    worker's ``max_tasks`` comes with its fork request, not from ``start``); then end without
    the interpreter's teardown (:func:`._worker.end_interpreter`)."""
    drop_inherited_trackers()  # before anything: every worker forked later inherits the result
    become_group_leader()
    conn, capture, ok = connect_and_initialize(start)
    if not ok:
        conn.close()
        end_interpreter()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    signal.set_wakeup_fd(wake_w)
    try:
        while True:
            ready = wait([conn, wake_r])
            if wake_r in ready:
                with contextlib.suppress(OSError):
                    os.read(wake_r, 512)
            _reap(conn)
            if conn not in ready:
                continue
            try:
                message = decode(conn.recv_bytes())
            except (EOFError, OSError, ValueError):
                break  # the parent is gone
            if not isinstance(message, ForkWorker):
                break
            reason = fork_safety()
            if reason is not None:
                conn.send_bytes(encode(ForkRefused(message.token, reason)))
                continue
            pid = os.fork()
            if pid == 0:
                _become_worker(message, start.address, conn, (wake_r, wake_w, capture.fd))
            conn.send_bytes(encode(Forked(message.token, pid)))
    except (EOFError, OSError):
        pass
    finally:
        conn.close()
        del capture
    end_interpreter()


def _reap(conn: Connection) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            conn.send_bytes(encode(Exited(pid, os.waitstatus_to_exitcode(status))))


def _become_worker(
    request: ForkWorker, address: str, conn: Connection, own_fds: tuple[int, ...]
) -> None:
    """In the forked child: drop the template's resources (its wake pipe, its capture file, its
    socket), pin the device, serve; never return."""
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in own_fds:
            os.close(fd)
        conn.close()  # the template's socket: its end must be the template's alone
        if request.device is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = request.device
            os.environ["PRECOMPILE_EXECUTOR_DEVICE"] = request.device
        serve(Startup(address, request.token, request.capture_path, None, request.max_tasks))
    except BaseException:  # noqa: BLE001 - leave with a code the parent can see
        code = 1
    finally:
        os._exit(code)
