"""Running a benchmark script the way its smoke tests do: a fresh interpreter in a session of
its own, every process it starts tagged (``benchmarks._common.RUN_TAG_ENV``), so a run that
overstays is stopped whole and any process it leaves — an orphan re-parented to init included —
is found and killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_tagged(
    argv: list[str], timeout_s: float, *, stop: int = signal.SIGKILL, merge: bool = False
) -> tuple[int, str, str, list[str]]:
    """Run ``python -m *argv`` from the repository's root.

    Past ``timeout_s`` its process group gets ``stop`` (``SIGTERM`` for a script that tears its
    cluster down on it) and the test fails. ``merge`` sends stderr into stdout.

    Returns:
        (exit code, stdout, stderr, the tagged processes still alive), each of those killed.
    """
    from benchmarks._common import RUN_TAG_ENV, describe, tagged_processes

    tag = uuid.uuid4().hex
    env = dict(os.environ, **{RUN_TAG_ENV: tag})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge else subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        output, errors = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, stop)
        output, errors = proc.communicate(timeout=30)
        pytest.fail(f"{' '.join(argv)} took over {timeout_s} s:\n{(errors or output)[-4000:]}")
    left = [describe(p) for p in tagged_processes(tag)]
    for p in tagged_processes(tag):  # never leave them to the next test
        p.kill()
    return proc.returncode, output, errors or "", left
