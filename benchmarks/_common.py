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
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")

RUN_TAG_ENV = "PRECOMPILE_BENCH_RUN"
"""Environment variable set to a fresh id for the whole run. Every process the run starts
inherits it (workers, forked children, fresh interpreters, their grandchildren), so the
supervisor finds any process left behind, even one re-parented to init."""


@dataclasses.dataclass
class Context:
    """Settings and shared results of one benchmark run.

    Attributes:
        quick: tiny sizes, one repeat (the smoke test).
        workers: parallel workers for the batch scenarios.
        n_configs: configs in the compile batch.
        repeats: runs per measured strategy (the median is reported).
        tmp: this scenario's scratch directory (caches, result files), removed at the end.
        cores: CPUs this process may use.
        shared: results one scenario leaves for a later one (e.g. warm compile times); they
            travel between the scenario processes in a JSON file.
        started: ``time.monotonic()`` at the start of the run (the clock is system-wide).
        out: the output directory (for a scenario's own figures, e.g. a Gantt chart).
        contention: also measure fewer workers than cores and pinned workers (scenario 7).
        against: the revision scenario 9 compares this tree with.
        key: the scenario's key (``s1``...), for its progress lines.
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
    against: str = "333c6ad"
    key: str = ""
    _dirs: int = 0

    def fresh_dir(self, label: str) -> str:
        """A new empty directory under the run's scratch directory (e.g. a fresh Triton cache)."""
        self._dirs += 1
        path = self.tmp / f"{self._dirs:03d}-{label}"
        path.mkdir(parents=True)
        return str(path)

    def log(self, message: str) -> None:
        """Print a progress line, stamped with the seconds since the run started."""
        print(f"[{time.monotonic() - self.started:7.1f}s] {message}", flush=True)


class LoadMonitor:
    """Samples, once a second, the CPU time that processes *outside* this run use.

    Other people's jobs on a shared machine slow a benchmark down; this says by how much the
    machine was shared while each scenario ran (in cores, averaged), so a reader can judge.
    Processes of this run carry :data:`RUN_TAG_ENV` in their environment and are left out.
    """

    INTERVAL_S = 1.0

    def __init__(self, tag: str | None) -> None:
        self._tag = tag
        self._ours: dict[int, bool] = {}
        self._last: dict[int, float] = {}
        self._last_time = 0.0
        self._foreign_s = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-load", daemon=True)

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def foreign_cpu_s(self) -> float:
        """CPU seconds used by processes outside this run since :meth:`start`."""
        with self._lock:
            return self._foreign_s

    def _loop(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            self._sample()

    def _is_ours(self, proc: psutil.Process) -> bool:
        known = self._ours.get(proc.pid)
        if known is None:
            try:
                env = proc.environ()
            except psutil.Error:
                env = {}
            known = self._tag is not None and env.get(RUN_TAG_ENV) == self._tag
            known = known or proc.pid == os.getpid()
            self._ours[proc.pid] = known
        return known

    def _sample(self) -> None:
        total = 0.0
        seen: dict[int, float] = {}
        now = time.time()
        for proc in psutil.process_iter(["cpu_times", "create_time"]):
            times = proc.info.get("cpu_times")
            if times is None or self._is_ours(proc):
                continue
            used = times.user + times.system
            seen[proc.pid] = used
            if proc.pid in self._last:
                total += used - self._last[proc.pid]
            elif (proc.info.get("create_time") or 0) > self._last_time:
                total += used  # started since the last sample: all of its time is new
        with self._lock:
            if self._last_time:
                self._foreign_s += max(0.0, total)
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
    if not data:
        return "—"
    if len(data) == 1:
        return fmt.format(data[0])
    return f"{fmt.format(median(data))} ({fmt.format(data[0])}–{fmt.format(data[-1])})"


# -- processes -------------------------------------------------------------------------------


def descendants() -> dict[int, psutil.Process]:
    """This process's live descendants, by pid."""
    procs = {}
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                procs[proc.pid] = proc
    return procs


def is_gone(pid: int) -> bool:
    """True when ``pid`` does not exist or is a zombie (dead, only its exit status left)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def wait_gone(pids: Iterable[int], timeout_s: float, poll_s: float = 0.002) -> float | None:
    """Wait until every pid is gone; return ``time.monotonic()`` then, or ``None`` on timeout."""
    pending = set(pids)
    end = time.monotonic() + timeout_s
    while True:
        pending = {p for p in pending if not is_gone(p)}
        now = time.monotonic()
        if not pending:
            return now
        if now > end:
            return None
        time.sleep(poll_s)


def memory_mib(pid: int) -> tuple[float, float | None]:
    """(RSS, USS) of ``pid`` in MiB; USS is ``None`` where the platform can't tell."""
    proc = psutil.Process(pid)
    try:
        info = proc.memory_full_info()
        return info.rss / 2**20, getattr(info, "uss", None) and info.uss / 2**20
    except psutil.AccessDenied:
        return proc.memory_info().rss / 2**20, None


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Every process (but this one) whose environment carries ``RUN_TAG_ENV=tag``."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(RUN_TAG_ENV) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def describe(proc: psutil.Process) -> str:
    """``pid: command line`` (shortened) of a process, for a leak report."""
    try:
        cmd = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        cmd = "?"
    return f"{proc.pid}: {cmd[:120]}"


# -- the stamp -------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def version(dist: str) -> str:
    """The installed version of distribution ``dist``, or ``"not installed"``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git_revision() -> str:
    """The repository's commit (``+dirty`` when the working tree has changes), or ``"?"``."""
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty=+dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.strip() or "?"


def stamp(cores: int, command: str) -> dict[str, str]:
    """Machine, versions and date: printed beside every table and figure."""
    memory = psutil.virtual_memory().total / 2**30
    return {
        "machine": f"{cpu_model()}, {cores} cores usable ({os.cpu_count()} present), "
        f"{memory:.0f} GiB RAM, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": version("torch"),
        "triton": version("triton"),
        "loky": version("loky"),
        "pebble": version("pebble"),
        "cloudpickle": version("cloudpickle"),
        "psutil": version("psutil"),
        "precompile_executor": f"{version('precompile-executor')} ({git_revision()})",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
    }


def stamp_line(info: dict[str, str]) -> str:
    """The stamp in one line, for a figure."""
    return (
        f"{info['machine']} | Python {info['python']}, torch {info['torch']}, "
        f"Triton {info['triton']}, loky {info['loky']}, pebble {info['pebble']} | {info['date']}"
    )


def scratch_dir() -> Path:
    """A new scratch directory for one run."""
    return Path(tempfile.mkdtemp(prefix="precompile-bench-"))


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
    data = dict(shared)
    data["warm_times"] = [[list(cfg), t] for cfg, t in shared.get("warm_times", {}).items()]
    path.write_text(json.dumps(data))
