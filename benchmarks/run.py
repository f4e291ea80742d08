"""The core suite's scenarios: run them and write ``benchmarks.md`` and ``benchmarks.png``.

Usage (from the repository root; ``python -m benchmarks core`` runs this with the suite's
settings)::

    python -m benchmarks.run                           # full run, 2 workers, 12 configs (~12 min)
    python -m benchmarks.run --quick --out /tmp/b      # every scenario at a tiny size (smoke test)
    python -m benchmarks.run --workers 16 --configs 64 --out DIR   # the 16-core GPU machine
    python -m benchmarks.run --only s9 --workers 2 --against HEAD~1   # before/after of a change

This supervisor imports neither torch nor triton: each scenario runs in a child interpreter of
its own (which imports them first, as an autotuner's process would), so no scenario inherits
another's warm workers, caches or broken pools. Every child carries a fresh run id
(:data:`._common.RUN_TAG_ENV`); after each scenario the supervisor reports and kills any process
still carrying it, and it samples the CPU used outside the run, so a shared machine shows.
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
    f"s{i}": f"benchmarks.s{i}_{name}"
    for i, name in enumerate(
        [
            "overhead",
            "batch",
            "faults",
            "kill",
            "memory",
            "scaling",
            "ordering",
            "starts",
            "versus",
        ],
        1,
    )
}
EXIT_FAILED, EXIT_LEAKED = 1, 3
LEAK_WAIT_S = 15.0
"""How long helpers (the library's guardian, loky's resource tracker) get to exit after their
scenario process did: they notice it through a closed pipe."""
SCENARIO_TIMEOUT_S = 1800.0
"""A scenario process that runs longer than this is hung: it is killed and reported."""
_REPO_ROOT = Path(__file__).resolve().parent.parent
_DEFAULT_OUT = _REPO_ROOT / "benchmarks" / "results" / "core"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="every scenario at a tiny size")
    p.add_argument("--out", default=str(_DEFAULT_OUT), help="output directory (%(default)s)")
    p.add_argument("--workers", type=int, help="workers (default: 2, or the usable cores if fewer)")
    p.add_argument("--configs", type=int, help="configs in the batch (12; 4 with --quick)")
    p.add_argument("--repeats", type=int, help="runs per strategy, median reported (3; 1 --quick)")
    p.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, e.g. s1,s4")
    p.add_argument("--contention", action="store_true", help="s7: fewer workers, pinned workers")
    p.add_argument(
        "--long",
        action="store_true",
        help="s9: 20,000 mapped no-ops and 4,000 round trips a pool (2,000 and 200 by default): "
        "long enough to see a 10 %% change on a noisy machine (docs/benchmarks.md)",
    )
    p.add_argument(
        "--against",
        default="HEAD",
        help="s9: a commit (taken with git archive) or a directory holding precompile_executor/; "
        "default HEAD, the last commit: what uncommitted changes are compared with",
    )
    for hidden in ("--_scenario", "--_state", "--_t0"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
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
        if (value := getattr(args, name)) is not None and value < 1:
            print(f"--{name} must be >= 1, got {value}", file=sys.stderr)
            return 2
    return _scenario_process(args) if args._scenario else _supervise(args, argv, keys)


def _settings(args: argparse.Namespace) -> tuple[int, int, int, int]:
    cores = usable_cores()
    return (
        cores,
        args.workers or min(2, cores),
        args.configs or (4 if args.quick else 12),
        args.repeats or (1 if args.quick else 3),
    )


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
    env = dict(os.environ, **{RUN_TAG_ENV: tag})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), env.get("PYTHONPATH")]))
    # Triton 3.9 warns once per process that this default will change; pin today's default.
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    state = Path(tempfile.mkdtemp(prefix="precompile-bench-"))
    load = LoadMonitor(tag)
    load.start()
    sections: list[_report.Section] = []
    leaked, status = 0, 0
    try:
        for key in keys:
            foreign, started = load.foreign_s, time.monotonic()
            code = _run_child(argv, key, state, t0, env)
            took = time.monotonic() - started
            section = _load_section(state, key, code)
            status = status or (EXIT_FAILED if code else 0)
            left = _wait_for_tagged(tag, LEAK_WAIT_S)
            leaked += len(left)
            busy = (load.foreign_s - foreign) / took
            section.notes.append(
                f"While this scenario ran ({took:.0f}s), processes outside the benchmark used "
                f"{busy:.2f} of the {cores} cores on average"
                + (" — a shared machine: expect noisier figures." if busy > 0.1 * cores else ".")
            )
            section.notes.append(
                f"Cleanup: {len(left)} process(es) outlived this scenario and were killed: "
                + "; ".join(map(describe, left))
                if left
                else "Cleanup: no process started by this scenario (workers, forked children, "
                "grandchildren, helpers) was alive after it ended."
            )
            _report.print_section(section)
            sections.append(section)
    finally:
        load.stop()
        shutil.rmtree(state, ignore_errors=True)
    png, md = out / "benchmarks.png", out / "benchmarks.md"
    _report.plot(sections, info, png)
    found = (
        f"**{leaked} process(es) leaked** (see the scenarios' notes)."
        if leaked
        else f"none was left after any of the {len(sections)} scenarios."
    )
    md.write_text(
        _report.markdown(sections, info, png.name, args.quick)
        + "\n## Cleanup\n\nEach scenario ran in its own process. After each one exited, the "
        "supervisor looked for any process carrying this run's id in its environment (workers, "
        f"forked children, fresh interpreters, `sleep` grandchildren, helpers): {found}\n"
    )
    print(f"wrote {md} and {png} in {time.monotonic() - t0:.0f}s", flush=True)
    print(
        f"cleanup check: {leaked} process(es) started by this run were still alive after "
        f"their scenario ended{' (killed, listed above)' if leaked else ' — none leaked'}",
        flush=True,
    )
    return EXIT_LEAKED if leaked else status


def _run_child(argv: list[str], key: str, state: Path, t0: float, env: dict[str, str]) -> int:
    own = ["--_scenario", key, "--_state", str(state), "--_t0", repr(t0)]
    child = subprocess.Popen([sys.executable, "-m", "benchmarks.run", *argv, *own], env=env)
    try:
        return child.wait(timeout=SCENARIO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"scenario {key} ran past {SCENARIO_TIMEOUT_S:.0f}s: killed", flush=True)
    except KeyboardInterrupt:  # the child got the same Ctrl-C; give it time to clean up
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=60)
        raise
    finally:
        if child.poll() is None:
            child.kill()
    return child.wait()


def _load_section(state: Path, key: str, code: int) -> _report.Section:
    with contextlib.suppress(OSError, pickle.UnpicklingError, EOFError):
        with (state / f"{key}.pickle").open("rb") as f:
            section: _report.Section = pickle.load(f)
        return section
    why = f"The scenario process exited with status {code} and left no results; see its output."
    return _report.Section(key, f"{key}: FAILED", why)


def _wait_for_tagged(tag: str, timeout_s: float) -> list:  # type: ignore[type-arg]
    end = time.monotonic() + timeout_s
    while (left := tagged_processes(tag)) and time.monotonic() < end:
        time.sleep(0.2)
    for proc in left:
        print(f"LEAKED {describe(proc)} — killing it", flush=True)
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGKILL)
    return left


def _scenario_process(args: argparse.Namespace) -> int:
    import precompile_executor as pe

    key, state = args._scenario, Path(args._state)
    cores, workers, configs, repeats = _settings(args)
    ctx = Context(
        quick=args.quick,
        workers=workers,
        n_configs=configs,
        repeats=repeats,
        tmp=state / f"scratch-{key}",
        cores=cores,
        started=float(args._t0) if args._t0 is not None else time.monotonic(),
        out=Path(args.out).resolve(),
        contention=args.contention,
        long=args.long,
        against=args.against,
        key=key,
    )
    ctx.tmp.mkdir()
    ctx.shared = load_shared(state / "shared.json")
    # Python 3.12+ warns at every fork() from a process with threads; forking from one is
    # exactly what the fork-based strategies under test do.
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork.*")
    seconds, _ = timed(
        lambda: (importlib.import_module("torch"), importlib.import_module("triton"))
    )
    ctx.log(f"{key}: imported torch and triton in this process in {seconds:.2f}s")
    status = 0
    try:
        section = importlib.import_module(SCENARIOS[key]).run(ctx)
    except Exception:  # noqa: BLE001 - report it as the scenario's result
        status, text = EXIT_FAILED, traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        notes = ["```\n" + text.strip() + "\n```"]
        section = _report.Section(key, f"{key}: FAILED", "This scenario raised:", notes=notes)
    finally:
        ctx.log(f"{key}: stopped {pe.stop_idle_workers()} idle PrecompileExecutor worker(s)")
        save_shared(state / "shared.json", ctx.shared)
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    with (state / f"{key}.pickle").open("wb") as f:
        pickle.dump(section, f)
    return status


if __name__ == "__main__":
    sys.exit(main())
