"""Killing process groups, and the guardian that kills them if the parent itself dies.

Every worker and every forked child leads its own process group (it called ``setsid``), so a
kill of the group reaches compiler grandchildren such as ptxas too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

from ._wire import write_now

KILL_GRACE_S = 1.0
"""Seconds between SIGTERM and SIGKILL: long enough for a clean exit, short for a hung ptxas."""

_POLL_S = 0.01


def _group_members(pgid: int, seed: list[psutil.Process]) -> list[psutil.Process]:
    """The live processes of group ``pgid`` among ``seed`` (the leader and its descendants)."""
    members = []
    for proc in seed:
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return members


def descendants(pid: int) -> list[psutil.Process]:
    """``pid`` and all its descendants that exist now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_group(pgid: int, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the process group ``pgid``, wait up to ``grace_s``, then SIGKILL what is left.

    Descendants that left the group (a grandchild that called ``setsid`` itself) are killed
    individually. Returns once every member is gone or a zombie.
    """
    seed = descendants(pgid)
    first = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, first)
    for proc in seed:
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) != pgid:
                proc.send_signal(first)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(seed):
        time.sleep(_POLL_S)
    if _alive(seed):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        for proc in seed:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and _alive(seed):
            time.sleep(_POLL_S)


def _alive(procs: list[psutil.Process]) -> bool:
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return False


_GUARDIAN_CODE = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups = set()
for line in sys.stdin:
    op, pgid = line[:1], int(line[1:])
    if op == "+":
        groups.add(pgid)
    else:
        groups.discard(pgid)
for pgid in groups:
    for kill in (os.killpg, os.kill):  # the group, and the leader itself if it has no group yet
        try:
            kill(pgid, signal.SIGKILL)
        except OSError:
            pass
"""


class Guardian:
    """A tiny process that SIGKILLs every registered process group when the parent dies.

    It reads ``+pgid`` / ``-pgid`` lines on stdin; EOF means the parent is gone (even by
    SIGKILL), whatever state the workers are in — a worker stuck in C code holding the GIL
    cannot watch for that itself. A worker is registered by pid as soon as its process exists,
    before it has made itself a group leader: the guardian kills the pid as well as the group.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._watched: set[int] = set()

    def _ensure(self) -> subprocess.Popen[bytes]:
        # Callers hold self._lock: two threads must never start two guardians.
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None and self._proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self._proc.stdin.close()  # the pipe to a guardian that died
            self._proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _GUARDIAN_CODE],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._watched = set()  # a new guardian knows nothing yet
        return self._proc

    def fileno(self) -> int:
        """The fd of the pipe to the guardian, started if need be (a forked child closes it)."""
        with self._lock:
            proc = self._ensure()
            assert proc.stdin is not None
            return proc.stdin.fileno()

    def _send(self, op: str, pgid: int) -> None:
        with self._lock:
            proc = self._ensure()
            if op == "+":
                if pgid in self._watched:
                    return
                self._watched.add(pgid)
            else:
                self._watched.discard(pgid)
            assert proc.stdin is not None
            line = f"{op}{pgid}\n".encode()
            with contextlib.suppress(OSError, ValueError):
                # The GIL kept when the pipe has room (_wire.py); the buffer is always empty.
                if write_now(proc.stdin.fileno(), line) is None:
                    proc.stdin.write(line)
                    proc.stdin.flush()

    def watch(self, pgid: int) -> None:
        """Kill group ``pgid`` if this process dies before :meth:`forget` is called for it.

        A group already watched is not sent again: a worker is watched from its birth (or its
        template's ``Forked``) and again at its hello, in whichever order they come, and each
        write to the pipe gives up the GIL on the hub's monitor thread, which a caller busy in
        C code may hold for long (the hellos of 17 workers took 5.2 s there on an H200 during a
        max-autotune compile: docs/gpu-runs.md, "`torch.compile`")."""
        self._send("+", pgid)

    def forget(self, pgid: int) -> None:
        """Stop watching group ``pgid`` (it is gone)."""
        self._send("-", pgid)

    def stop(self) -> None:
        """Close the pipe with nothing registered: the guardian exits without killing."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
