"""The guardian: a process that SIGKILLs every watched process group when its parent dies."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from precompile_executor import _process
from precompile_executor._process import Guardian


class _Recorder:
    """The guardian's stdin, with every line written to it kept."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe
        self.lines: list[str] = []

    def write(self, data: bytes) -> int:
        self.lines.append(data.decode().strip())
        return int(self.pipe.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pipe, name)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A process that leads its own group and would live a minute (killed after the test)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=20)


@pytest.mark.timeout(60)
def test_a_group_watched_twice_is_sent_once_and_still_killed_when_the_parent_goes(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    guardian = Guardian()
    guardian.fileno()  # starts it
    proc = guardian._proc
    assert proc is not None
    recorder = _Recorder(proc.stdin)
    proc.stdin = recorder  # type: ignore[assignment]
    # A line goes out through the held write when the pipe has room, else through stdin.
    held_write = _process.write_now

    ours = recorder.fileno()

    def recorded(fd: int, data: bytes) -> int | None:
        written = held_write(fd, data)
        # Only this guardian's lines: a thread of an earlier test's pool may still be telling
        # the process-wide guardian of its workers.
        if written is not None and fd == ours:
            recorder.lines.append(data.decode().strip())
        return written

    monkeypatch.setattr(_process, "write_now", recorded)
    # Watched at birth, then again at its hello: one line; forgotten and watched again (a pid
    # the system reused): both lines.
    guardian.watch(child.pid)
    guardian.watch(child.pid)
    guardian.forget(child.pid)
    guardian.watch(child.pid)
    assert recorder.lines == [f"+{child.pid}", f"-{child.pid}", f"+{child.pid}"]
    # The pipe closes as it does when the parent dies: the guardian kills what is watched.
    proc.stdin = recorder.pipe
    guardian.stop()
    assert child.wait(timeout=20) == -9


@pytest.mark.timeout(60)
def test_a_new_guardian_is_told_of_a_group_the_old_one_watched(
    child: subprocess.Popen[bytes],
) -> None:
    guardian = Guardian()
    guardian.watch(child.pid)
    old = guardian._proc
    assert old is not None
    old.kill()  # the guardian died: the next call starts another, which knows nothing yet
    old.wait(timeout=20)
    guardian.watch(child.pid)
    assert guardian._proc is not old
    guardian.stop()
    assert child.wait(timeout=20) == -9
