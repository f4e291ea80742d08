"""The warm template: one interpreter per worker kind that pays the initializer once, then forks
workers on request, in milliseconds, already warm.

Runs in a process started by loky (a fresh interpreter, like any spawn worker). It connects to
the parent, runs the initializer (imports, an optional warm-up compile) with its output captured,
says hello, and then serves :class:`._messages.ForkWorker` requests. Before every fork it checks
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
import ctypes
import os
import signal
import sys
import time
from multiprocessing.connection import Connection, wait

from ._messages import Exited, Forked, ForkRefused, ForkWorker, decode, encode
from ._worker import become_group_leader, connect_and_initialize, serve


def fork_safety() -> str | None:
    """Why forking this process now would be unsafe, or ``None`` when it is safe."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = 1  # no /proc: trust the interpreter's own count below
    import threading

    threads = max(threads, threading.active_count())
    if threads > 1:
        return (
            f"the initializer left {threads} threads running ({', '.join(_thread_names())}; a "
            "fork copies only the calling thread, and locks the others hold would stay locked "
            f"in the child){_gpu_libraries()}"
        )
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None and cuda.is_initialized():
        return "the initializer initialized CUDA (a CUDA context does not survive a fork)"
    return None


NVML_RELEASE_WAIT_S = 2.0
"""How long a template waits for NVML's threads to end after shutting it down."""


def release_nvml() -> bool:
    """Shut down NVML if the initializer left it initialized and CUDA itself is not: its thread
    would make the template refuse to fork. Returns whether NVML was shut down here.

    ``torch.cuda.is_available()`` with ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` — which
    ``import torch._inductor`` (and so ``import helion``) calls at import — initializes NVML and
    never shuts it down; NVML keeps a thread. Nothing in the template uses NVML afterwards, and a
    worker forked from it starts with no NVML state in use (torch counts devices again, in the
    worker, with its own ``CUDA_VISIBLE_DEVICES``). A template whose CUDA driver was initialized
    (``libcuda`` loaded, e.g. ``is_available()`` without the NVML check) is left as it is: that
    cannot be undone, and :func:`fork_safety` refuses it.
    """
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return False
    if "libnvidia-ml.so" not in maps:
        return False
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None and cuda.is_initialized():
        return False
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")  # already loaded: the same library
    except OSError:
        return False
    shut = False
    for _ in range(16):  # NVML counts its initializations: one shutdown each, until it says so
        if nvml.nvmlShutdown() != 0:  # NVML_ERROR_UNINITIALIZED: nothing more to shut down
            break
        shut = True
    if shut:
        deadline = time.monotonic() + NVML_RELEASE_WAIT_S
        while _thread_count() > 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # its threads end asynchronously
    return shut


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _thread_names() -> list[str]:
    """This process's threads by their kernel names (``/proc/self/task/*/comm``), e.g. a CUDA
    driver thread or ``jemalloc_bg_thd``: native threads have no Python name."""
    names = []
    with contextlib.suppress(OSError):
        for tid in sorted(os.listdir("/proc/self/task")):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
    return names or ["names unknown"]


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


def serve_template(address: str, token: str, capture_path: str, init_blob: bytes | None) -> None:
    """The template's life: initialize once, then fork workers until told to stop."""
    become_group_leader()
    conn, capture, ok = connect_and_initialize(address, token, capture_path, init_blob)
    if not ok:
        conn.close()
        return
    release_nvml()  # before the first fork request is read: a fork then sees one thread
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
                _become_worker(message, address, conn, (wake_r, wake_w))
            conn.send_bytes(encode(Forked(message.token, pid)))
    except (EOFError, OSError):
        pass
    finally:
        conn.close()
        del capture


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
    request: ForkWorker, address: str, conn: Connection, wake: tuple[int, int]
) -> None:
    """In the forked child: drop the template's resources, pin the device, serve; never return."""
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wake:
            os.close(fd)
        conn.close()  # the template's socket: its end must be the template's alone
        if request.device is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = request.device
            os.environ["PRECOMPILE_EXECUTOR_DEVICE"] = request.device
        serve(address, request.token, request.capture_path, None)
    except BaseException:  # noqa: BLE001 - leave with a code the parent can see
        code = 1
    finally:
        os._exit(code)
