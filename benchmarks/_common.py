"""What every scenario shares: the run context, timing, process inspection, the machine stamp."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")

RUN_TAG_ENV = "PRECOMPILE_BENCH_RUN"
"""Set to a fresh id for the whole run: every process the run starts inherits it, so the
supervisor finds any one left behind, even one re-parented to init."""


@dataclasses.dataclass
class Context:
    """One scenario process's settings (see ``benchmarks/run.py``'s options).

    ``tmp``: its scratch directory, removed at the end; ``shared``: what one scenario leaves for
    a later one (warm compile times), carried between scenario processes in a JSON file;
    ``started``: ``time.monotonic()`` at the start of the run (the clock is system-wide).
    """

    quick: bool
    workers: int
    n_configs: int
    repeats: int
    tmp: Path
    cores: int
    shared: dict[str, Any] = dataclasses.field(default_factory=dict)
    started: float = dataclasses.field(default_factory=time.monotonic)
    out: Path | None = None
    contention: bool = False
    long: bool = False
    against: str = "HEAD"
    key: str = ""
    _dirs: int = 0

    def fresh_dir(self, label: str) -> str:
        """A new empty directory under the scratch directory (e.g. a fresh Triton cache)."""
        self._dirs += 1
        path = self.tmp / f"{self._dirs:03d}-{label}"
        path.mkdir(parents=True)
        return str(path)

    def log(self, message: str) -> None:
        """Print a progress line, stamped with the seconds since the run started."""
        print(f"[{time.monotonic() - self.started:7.1f}s] {message}", flush=True)


class LoadMonitor:
    """Samples once a second the CPU time used by processes outside the run (those without
    :data:`RUN_TAG_ENV` = ``tag``), so a reader can judge how shared the machine was."""

    def __init__(self, tag: str) -> None:
        self._tag, self._ours, self._last = tag, dict[int, bool](), dict[int, float]()
        self._last_time = self.foreign_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-load", daemon=True)

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            self._sample()

    def _is_ours(self, proc: psutil.Process) -> bool:
        if proc.pid not in self._ours:
            env: dict[str, str] = {}
            with contextlib.suppress(psutil.Error):
                env = proc.environ()
            self._ours[proc.pid] = env.get(RUN_TAG_ENV) == self._tag or proc.pid == os.getpid()
        return self._ours[proc.pid]

    def _sample(self) -> None:
        total, seen, now = 0.0, {}, time.time()
        for proc in psutil.process_iter(["cpu_times", "create_time"]):
            times = proc.info.get("cpu_times")
            if times is None or self._is_ours(proc):
                continue
            seen[proc.pid] = used = times.user + times.system
            if proc.pid in self._last:
                total += used - self._last[proc.pid]
            elif (proc.info.get("create_time") or 0) > self._last_time:
                total += used  # started since the last sample: all of its time is new
        if self._last_time:
            self.foreign_s += max(0.0, total)  # one float, written by one thread
        self._last, self._last_time = seen, now


def usable_cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Run ``fn()``; return (wall seconds, its value)."""
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (NaN when there are none)."""
    data = list(values)
    return statistics.median(data) if data else float("nan")


def spread(values: Iterable[float], fmt: str = "{:.2f}") -> str:
    """``"median (min–max)"`` of ``values``, or just the value when there is one."""
    data = sorted(values)
    if len(data) < 2:
        return fmt.format(data[0]) if data else "—"
    return f"{fmt.format(median(data))} ({fmt.format(data[0])}–{fmt.format(data[-1])})"


def _alive(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    return False


def descendants() -> dict[int, psutil.Process]:
    """This process's live descendants, by pid."""
    return {p.pid: p for p in psutil.Process().children(recursive=True) if _alive(p)}


def is_gone(pid: int) -> bool:
    """True when ``pid`` does not exist or is a zombie."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def wait_gone(pids: Iterable[int], timeout_s: float) -> float | None:
    """Wait until every pid is gone; return ``time.monotonic()`` then, or ``None`` on timeout."""
    pending, end = set(pids), time.monotonic() + timeout_s
    while pending := {p for p in pending if not is_gone(p)}:
        if time.monotonic() > end:
            return None
        time.sleep(0.002)
    return time.monotonic()


def memory_mib(pid: int) -> tuple[float, float | None]:
    """(RSS, USS) of ``pid`` in MiB; USS is ``None`` where the platform can't tell."""
    proc = psutil.Process(pid)
    try:
        info = proc.memory_full_info()
        return info.rss / 2**20, getattr(info, "uss", None) and info.uss / 2**20
    except psutil.AccessDenied:
        return proc.memory_info().rss / 2**20, None


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Every live process (but this one) whose environment carries ``RUN_TAG_ENV=tag``."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.environ().get(RUN_TAG_ENV) == tag and _alive(proc):
                found.append(proc)
    return found


def describe(proc: psutil.Process) -> str:
    """``pid: command line`` (shortened), for a leak report."""
    cmd = "?"
    with contextlib.suppress(psutil.Error):
        cmd = " ".join(proc.cmdline()) or proc.name()
    return f"{proc.pid}: {cmd[:120]}"


def version(dist: str) -> str:
    """The installed version of distribution ``dist``, or ``"not installed"``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git_revision() -> str:
    """The repository's commit (``+dirty`` with changes in the working tree), or ``"?"``."""
    root = Path(__file__).resolve().parent.parent
    cmd = ["git", "-C", str(root), "describe", "--always", "--dirty=+dirty"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    return "?"


def package_digest() -> str:
    """A short digest of the package's source files: which code ran, where the working tree's
    commit is not known (the GPU machine's copy of the tree carries a stale git head)."""
    import hashlib

    root = Path(__file__).resolve().parent.parent / "precompile_executor"
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def stamp(cores: int, command: str) -> dict[str, str]:
    """Machine, versions and date: printed beside every table and figure."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        models = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in ln]
        cpu = models[0].split(":", 1)[1].strip() if models else cpu
    memory = psutil.virtual_memory().total / 2**30
    info = {
        "machine": f"{cpu}, {cores} cores usable ({os.cpu_count()} present), "
        f"{memory:.0f} GiB RAM, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }
    info |= {d: version(d) for d in ("torch", "triton", "loky", "pebble", "cloudpickle", "psutil")}
    info["precompile_executor"] = f"{version('precompile-executor')} ({git_revision()})"
    info["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    info["command"] = command
    return info


def stamp_line(info: dict[str, str]) -> str:
    """The stamp in one line, for a figure."""
    return (
        f"{info['machine']} | Python {info['python']}, torch {info['torch']}, "
        f"Triton {info['triton']}, loky {info['loky']}, pebble {info['pebble']} | {info['date']}"
    )


def load_shared(path: Path) -> dict[str, Any]:
    """Read what earlier scenarios left in ``path`` (see :attr:`Context.shared`)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    data["warm_times"] = {tuple(cfg): t for cfg, t in data.get("warm_times", [])}
    return data  # type: ignore[no-any-return]


def save_shared(path: Path, shared: dict[str, Any]) -> None:
    """Write :attr:`Context.shared` for the next scenario process."""
    warm = [[list(cfg), t] for cfg, t in shared.get("warm_times", {}).items()]
    path.write_text(json.dumps({**shared, "warm_times": warm}))
