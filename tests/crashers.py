"""Tasks that misbehave on purpose, shared by the fault tests (importable by workers)."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any


def square(x: int, delay: float = 0.0) -> int:
    time.sleep(delay)
    return x * x


def segfault() -> None:
    faulthandler._sigsegv()


def abort() -> None:
    os.abort()


def exit_3() -> None:
    os._exit(3)


def self_sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def python_loop() -> None:
    while True:
        pass


def c_hang_holding_gil() -> None:
    # PyDLL keeps the GIL held during the call: no Python-level timer can fire in this process.
    ctypes.PyDLL(None).sleep(1000)


def hang_with_grandchild(pid_file: str) -> None:
    child = subprocess.Popen(["sleep", "1000"])
    with open(pid_file, "w") as f:
        f.write(str(child.pid))
    child.wait()


class NeedsTwoArgs(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}: {detail}")
        self.code = code
        self.detail = detail


MEMORY_LIMIT_BYTES = 128 << 20
"""The memory limit the fault table runs :func:`allocate_gib` under."""


def allocate_gib() -> None:
    """Write 1 GiB in 32 MiB steps, then hold it (a compile that blows up)."""
    chunks = [b"\x01" * (32 << 20) for _ in range(32)]
    time.sleep(30)
    del chunks


def raise_two_args() -> None:
    raise NeedsTwoArgs(7, "needs two arguments")


def raise_with_lock() -> None:
    exc = ValueError("holds a lock")
    exc.lock = threading.Lock()  # type: ignore[attr-defined]
    raise exc


def raise_local_class() -> None:
    class OnlyInWorker(Exception):
        pass

    raise OnlyInWorker("defined inside the task")


def unpicklable_result() -> object:
    return threading.Lock()


def write_fd2_then_raise() -> None:
    os.write(2, b"ptxas fatal: written at fd level\n")
    sys.stdout.write("python-level stdout\n")
    raise RuntimeError("compile failed after writing")


def print_and_return(text: str) -> str:
    print(text)
    os.write(2, b"fd2 line\n")
    return text.upper()


def _refuse_to_rebuild() -> None:
    raise RuntimeError("this object cannot be rebuilt in the parent")


class BreaksOnUnpickle:
    """Pickles fine in the worker; unpickling it (in the parent) raises."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_refuse_to_rebuild, ())


def result_that_breaks_on_unpickle() -> BreaksOnUnpickle:
    return BreaksOnUnpickle()


LONG_MESSAGE = "compile failed: " + "x" * 20_000


def raise_long_error() -> None:
    # dask truncates exception messages over 10,000 characters; ours travel as records.
    raise ValueError(LONG_MESSAGE)


def square_and_log(x: int, log_path: str, delay: float = 0.0) -> int:
    """Square ``x`` and append ``x`` to ``log_path``: a test can count how often each task ran."""
    time.sleep(delay)
    with open(log_path, "a") as f:
        f.write(f"{x}\n")
    return x * x


def wait_for_file(path: str, timeout_s: float) -> bool:
    """Return once ``path`` exists (True) or ``timeout_s`` has passed (False): a task the test
    releases when it is ready for the task to finish."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


FAULTY_COMPILER_NAME = "faulty-g++"
"""Named like g++: Inductor picks the flags for a compiler by its name."""


def write_faulty_compiler(directory: str, *, marker: str, action: str) -> str:
    """Write a C++ compiler that is g++, except on a source file containing ``marker``.

    There it does ``action`` to the process that runs it: ``"segfault"`` sends SIGSEGV to its
    whole process group (an executor's worker is a group leader: the worker dies of it, as a
    compile aborting inside its own process would), ``"hang"`` sleeps for good. Set it as
    ``torch._inductor.config.cpp.cxx = (compiler,)``: Inductor then runs it for every C++
    kernel it builds. It never signals the process group of the test that wrote it (a build in
    the caller's own process exits with status 1 instead).
    """
    act = {"segfault": "kill -s SEGV 0; sleep 60", "hang": "exec sleep 1000"}[action]
    script = f"""#!/bin/sh
for arg in "$@"; do
  case "$arg" in
    *.cpp)
      if grep -q '{marker}' "$arg" 2>/dev/null; then
        if [ "$(ps -o pgid= -p $$ | tr -d ' ')" = "{os.getpgid(0)}" ]; then exit 1; fi
        {act}
      fi;;
  esac
done
exec g++ "$@"
"""
    path = os.path.join(directory, FAULTY_COMPILER_NAME)
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, 0o755)
    return path


def nap(seconds: float, then: str = "return") -> float:
    """Sleep ``seconds``, then return them, or (``then``) ``"sigkill"`` itself or ``"hang"``:
    one function, so the cost model predicts the misbehaving call as short as the quiet ones."""
    time.sleep(seconds)
    if then == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if then == "hang":
        time.sleep(3600)
    return seconds


class _TeardownWitness:
    """Writes its file when it is freed: a module global is freed only by the interpreter's
    teardown, which a process the pool stops must skip (docs/design.md, "Process lifecycle")."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __del__(
        self, _open: Any = os.open, _close: Any = os.close, _flags: int = os.O_CREAT | os.O_WRONLY
    ) -> None:
        # os.open bound now: late in the teardown the module's globals may already be gone
        _close(_open(self.path, _flags))


_WITNESS: _TeardownWitness | None = None


def note_how_the_process_ends(directory: str, leave_a_thread: bool) -> None:
    """An initializer: writes ``init-PID``; registers an ``atexit`` hook writing ``atexit-PID``;
    keeps a global that writes ``teardown-PID`` when freed; with ``leave_a_thread``, leaves a
    daemon thread running, so the template refuses to fork and workers start as interpreters."""
    import atexit

    global _WITNESS
    pid = os.getpid()
    with open(os.path.join(directory, f"init-{pid}"), "w") as f:
        f.write("initialized")
    atexit.register(_write, os.path.join(directory, f"atexit-{pid}"))
    _WITNESS = _TeardownWitness(os.path.join(directory, f"teardown-{pid}"))
    if leave_a_thread:
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()


def _write(path: str) -> None:
    with open(path, "w") as f:
        f.write("atexit")
