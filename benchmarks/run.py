"""Run every benchmark scenario and write ``benchmarks.md`` and ``benchmarks.png``.

Usage (from the repository root)::

    python -m benchmarks.run                      # full run, 2 workers, 12 configs (~12 min)
    python -m benchmarks.run --quick --out /tmp/b # every scenario at a tiny size (smoke test)
    python -m benchmarks.run --workers 16 --configs 64   # the 16-core GPU machine

Options: ``--out DIR`` (default ``docs``), ``--workers N`` (default 2, or the usable cores if
fewer), ``--configs N`` (default 12; 4 with ``--quick``), ``--repeats N`` (runs per measured
strategy, median reported; default 3, 1 with ``--quick``), ``--only s1,s4`` (a subset),
``--contention`` (scenario 7 also measures fewer workers than cores, and pinned workers),
``--against REV`` (the version scenario 9 compares with; default 333c6ad, v0.1).

This command is a supervisor that imports neither torch nor triton. It runs each scenario in a
child interpreter of its own (which imports torch and triton first, as an autotuner's process
would), so no scenario inherits another's warm workers, caches or broken pools. Every child's
environment carries a fresh run id (:data:`._common.RUN_TAG_ENV`); after each scenario the
supervisor looks for any process still carrying it — a worker, a forked child, a ``sleep``
grandchild that outlived its pool — reports it on stdout and in ``benchmarks.md``, and kills
it. It also samples the CPU used by processes outside the run, so a shared machine shows.
Exit status: 0; 1 when a scenario failed; 3 when a process leaked.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path

from . import _report
from ._common import (
    RUN_TAG_ENV,
    Context,
    LoadMonitor,
    describe,
    load_shared,
    save_shared,
    stamp,
    stamp_line,
    tagged_processes,
    timed,
    usable_cores,
)

SCENARIOS = {
    "s1": "benchmarks.s1_overhead",
    "s2": "benchmarks.s2_batch",
    "s3": "benchmarks.s3_faults",
    "s4": "benchmarks.s4_kill",
    "s5": "benchmarks.s5_memory",
    "s6": "benchmarks.s6_scaling",
    "s7": "benchmarks.s7_ordering",
    "s8": "benchmarks.s8_starts",
    "s9": "benchmarks.s9_versus",
}

EXIT_FAILED = 1
EXIT_LEAKED = 3
LEAK_WAIT_S = 15.0
"""How long helpers (the library's guardian, loky's resource tracker) get to exit after a
scenario process did: they notice it through a closed pipe."""
SCENARIO_TIMEOUT_S = 1800.0
"""A scenario process that runs longer than this is hung: it is killed and reported."""

_REPO_ROOT = Path(__file__).resolve().parent.parent


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description="Run the precompile_executor benchmarks."
    )
    p.add_argument("--quick", action="store_true", help="every scenario at a tiny size")
    p.add_argument("--out", default="docs", help="output directory (default: docs)")
    p.add_argument("--workers", type=int, default=None, help="workers (default: 2)")
    p.add_argument("--configs", type=int, default=None, help="configs in the batch (12)")
    p.add_argument("--repeats", type=int, default=None, help="runs per strategy (3)")
    p.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, e.g. s1,s4")
    p.add_argument(
        "--contention",
        action="store_true",
        help="s7: also measure fewer workers than cores, and workers pinned to cores",
    )
    p.add_argument(
        "--against",
        default="333c6ad",
        help="s9: the git revision to compare with (default: 333c6ad, v0.1)",
    )
    p.add_argument("--_scenario", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_state", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_t0", type=float, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    keys = [k for k in args.only.split(",") if k]
    unknown = set(keys) - set(SCENARIOS)
    if unknown or not keys:
        print(
            f"unknown scenario(s): {', '.join(sorted(unknown)) or '(none given)'}", file=sys.stderr
        )
        return 2
    for name in ("workers", "configs", "repeats"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"--{name} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if args._scenario:
        return _scenario_process(args)
    return _supervise(args, argv, keys)


def _settings(args: argparse.Namespace) -> tuple[int, int, int, int]:
    cores = usable_cores()
    workers = args.workers or min(2, cores)
    configs = args.configs or (4 if args.quick else 12)
    repeats = args.repeats or (1 if args.quick else 3)
    return cores, workers, configs, repeats


# -- the supervisor ----------------------------------------------------------------------------


def _supervise(args: argparse.Namespace, argv: list[str], keys: list[str]) -> int:
    t0 = time.monotonic()
    cores, workers, configs, repeats = _settings(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = stamp(cores, " ".join(["python -m benchmarks.run", *argv]))
    print(stamp_line(info), flush=True)
    if workers > cores:
        print(f"note: --workers {workers} is more than the {cores} usable cores", flush=True)
    print(
        f"workers={workers} configs={configs} repeats={repeats} quick={args.quick} "
        f"scenarios={','.join(keys)}",
        flush=True,
    )

    tag = uuid.uuid4().hex
    env = dict(os.environ)
    env[RUN_TAG_ENV] = tag
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), env.get("PYTHONPATH")]))
    # Triton 3.9 warns once per process that this default will change; pin today's default.
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    state = Path(tempfile.mkdtemp(prefix="precompile-bench-"))
    load = LoadMonitor(tag)
    load.start()
    sections: list[_report.Section] = []
    leaked_total = 0
    status = 0
    try:
        for key in keys:
            foreign = load.foreign_cpu_s()
            started = time.monotonic()
            code = _run_child(argv, key, state, t0, env)
            took = time.monotonic() - started
            section = _load_section(state, key, code)
            if code != 0:
                status = EXIT_FAILED
            left = _wait_for_tagged(tag, LEAK_WAIT_S)
            leaked_total += len(left)
            busy = (load.foreign_cpu_s() - foreign) / took
            section.notes.append(
                f"While this scenario ran ({took:.0f}s), processes outside the benchmark used "
                f"{busy:.2f} of the {cores} cores on average"
                + (" — a shared machine: expect noisier figures." if busy > 0.1 * cores else ".")
            )
            section.notes.append(_leak_note(left))
            _report.print_section(section)
            sections.append(section)
    finally:
        load.stop()
        shutil.rmtree(state, ignore_errors=True)
    png = out / "benchmarks.png"
    _report.plot(sections, info, png)
    md = out / "benchmarks.md"
    md.write_text(
        _report.markdown(sections, info, png.name, args.quick)
        + _cleanup_markdown(leaked_total, len(sections))
    )
    print(f"wrote {md} and {png} in {time.monotonic() - t0:.0f}s", flush=True)
    print(
        f"cleanup check: {leaked_total} process(es) started by this run were still alive after "
        f"their scenario ended{' (killed, listed above)' if leaked_total else ' — none leaked'}",
        flush=True,
    )
    return EXIT_LEAKED if leaked_total else status


def _run_child(argv: list[str], key: str, state: Path, t0: float, env: dict[str, str]) -> int:
    own = ["--_scenario", key, "--_state", str(state), "--_t0", repr(t0)]
    child = subprocess.Popen([sys.executable, "-m", "benchmarks.run", *argv, *own], env=env)
    try:
        return child.wait(timeout=SCENARIO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"scenario {key} ran past {SCENARIO_TIMEOUT_S:.0f}s: killed", flush=True)
        child.kill()
        return child.wait()
    except KeyboardInterrupt:  # the child got the same Ctrl-C; give it time to clean up
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise


def _load_section(state: Path, key: str, code: int) -> _report.Section:
    with contextlib.suppress(OSError, pickle.UnpicklingError, EOFError):
        with (state / f"{key}.pickle").open("rb") as f:
            section: _report.Section = pickle.load(f)
        return section
    why = f"The scenario process exited with status {code} and left no results; see its output."
    return _report.Section(key, f"{key}: FAILED", why)


def _wait_for_tagged(tag: str, timeout_s: float) -> list:  # type: ignore[type-arg]
    end = time.monotonic() + timeout_s
    while True:
        left = tagged_processes(tag)
        if not left or time.monotonic() > end:
            break
        time.sleep(0.2)
    for proc in left:
        print(f"LEAKED {describe(proc)} — killing it", flush=True)
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGKILL)
    return left


def _leak_note(left: list) -> str:  # type: ignore[type-arg]
    if not left:
        return (
            "Cleanup: no process started by this scenario (workers, forked children, "
            "grandchildren, helpers) was alive after it ended."
        )
    killed = "; ".join(describe(p) for p in left)
    return f"Cleanup: {len(left)} process(es) outlived this scenario and were killed: {killed}"


def _cleanup_markdown(leaked: int, scenarios: int) -> str:
    found = (
        f"**{leaked} process(es) leaked** (see the scenarios' notes)."
        if leaked
        else f"none was left after any of the {scenarios} scenarios."
    )
    return (
        "\n## Cleanup\n\nEach scenario ran in its own process. After each one exited, the "
        "supervisor looked for any process carrying this run's id in its environment (workers, "
        f"forked children, fresh interpreters, `sleep` grandchildren, helpers): {found}\n"
    )


# -- one scenario's process --------------------------------------------------------------------


def _scenario_process(args: argparse.Namespace) -> int:
    import precompile_executor as pe

    key = args._scenario
    state = Path(args._state)
    cores, workers, configs, repeats = _settings(args)
    ctx = Context(
        quick=args.quick,
        workers=workers,
        n_configs=configs,
        repeats=repeats,
        tmp=state / f"scratch-{key}",
        cores=cores,
        started=args._t0 if args._t0 is not None else time.monotonic(),
        out=Path(args.out).resolve(),
        contention=args.contention,
        against=args.against,
        key=key,
    )
    ctx.tmp.mkdir()
    shared_path = state / "shared.json"
    ctx.shared = load_shared(shared_path)
    # Python 3.12+ warns at every fork() from a process with threads; forking from one is
    # exactly what the fork-based strategies under test do.
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork.*")
    seconds, _ = timed(_import_torch_triton)
    ctx.log(f"{key}: imported torch and triton in this process in {seconds:.2f}s")
    status = 0
    try:
        section = importlib.import_module(SCENARIOS[key]).run(ctx)
    except Exception:  # noqa: BLE001 - report it as the scenario's result
        status = EXIT_FAILED
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        section = _report.Section(
            key, f"{key}: FAILED", "This scenario raised:", notes=["```\n" + text.strip() + "\n```"]
        )
    finally:
        stopped = pe.stop_idle_workers()
        ctx.log(f"{key}: stopped {stopped} idle PrecompileExecutor worker(s)")
        save_shared(shared_path, ctx.shared)
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    with (state / f"{key}.pickle").open("wb") as f:
        pickle.dump(section, f)
    return status


def _import_torch_triton() -> None:
    import torch  # noqa: F401
    import triton  # noqa: F401


if __name__ == "__main__":
    sys.exit(main())
