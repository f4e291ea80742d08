"""One warm ``submit().result()`` crosses at most six modules of the package (docs/design.md,
"Reading the code").

A fresh interpreter (``tests/module_trace.py``) profiles every thread of the caller — the
caller's own, the hub's monitor, its job and settle threads — and the worker, and reports the
package modules whose code ran for one round trip of a warm executor. The modules that carry
the task (the public layer, the executor, scheduling, processes, the wire, the worker) must be
six at most. A few modules are called on the way as pure helpers — they hold no task and no
executor state, and return at once: the scheduling rules (``_policy``), the cost model
(``_costs``), the records and their counting rule (``_records``), the private stdlib names
(``_stdlib``). They are listed here by name, so any other module that creeps onto the path
fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

HERE = Path(__file__).resolve().parent
MAX_MODULES_CROSSED = 6
PURE_HELPERS = {
    "precompile_executor._policy",
    "precompile_executor._costs",
    "precompile_executor._records",
    "precompile_executor._stdlib",
}


def traced_modules() -> tuple[set[str], set[str]]:
    """The package modules one warm round trip enters: (the caller's threads, the worker)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE)]))
    done = subprocess.run(
        [sys.executable, str(HERE / "module_trace.py")],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return set(report["caller"]), set(report["worker"])


def test_one_warm_round_trip_crosses_at_most_six_modules() -> None:
    caller, worker = traced_modules()
    assert "precompile_executor._worker" in worker  # the worker's side was traced
    assert "precompile_executor._base" in caller  # and the caller's
    crossed = (caller | worker) - PURE_HELPERS
    assert len(crossed) <= MAX_MODULES_CROSSED, sorted(crossed)
