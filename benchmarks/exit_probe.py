"""How long a program that used the library takes to exit, against the same program without it.

    python -m benchmarks.exit_probe [--against REV ...] [--rounds 5] [--modes triton,inductor]

A user's whole-process wall time ends when the interpreter exits, and the library's hub stops
every worker and warm template at that exit and waits for each (docs/design.md, "Process
lifecycle"). With torch imported, a process's own teardown takes about a second; so would each
stopped template's, if it tore itself down.

Each measurement is a child interpreter that imports what the integration imports (``triton``:
torch and Triton; ``inductor``: torch and Inductor's compile modules) and, for ``ours``, calls the
integration's ``install()`` and waits for the shared default executor's warm-up (its template
has imported torch and Triton or Inductor, its workers are forked), then prints the time and
returns. The parent times the child from its start to its exit (**whole process**) and from the
printed time to its exit (**exit**). ``stock`` is the same child without ``install()``: the
difference in exit is what the library adds to it. Trees: this one and each ``--against REV``
(a commit or a directory holding ``precompile_executor/``, as ``benchmarks/s9_versus.py`` takes
it), each child run in its tree's directory (``-m`` puts it first on ``sys.path``). Rounds
interleave everything; medians are printed as a Markdown table with the machine and versions.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._common import median

CHILD_TIMEOUT_S = 300.0
WARM_UP_TIMEOUT_S = 240.0
MARK = "EXIT-PROBE-RETURNS "
MODES = ("triton", "inductor")


def child(mode: str, variant: str) -> None:
    """One measured program: import, maybe install and warm, print the time, return."""
    import torch  # noqa: F401 - what the program imports

    if mode == "triton":
        import triton  # noqa: F401

        if variant == "ours":
            from precompile_executor.triton import _submit, autotune

            autotune.install()
            _submit.default_executor().warm_up(WARM_UP_TIMEOUT_S)
    else:
        import torch._inductor.async_compile  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401

        if variant == "ours":
            import precompile_executor.inductor as pe_inductor
            from precompile_executor.inductor import _default

            pe_inductor.install()
            _default.default_executor().warm_up(WARM_UP_TIMEOUT_S)
    print(MARK + repr(time.time()), flush=True)


def _run_child(tree: str, pythonpath: str, mode: str, variant: str) -> dict[str, float] | str:
    """Whole-process and exit seconds of one child, or why it failed."""
    started = time.time()
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.exit_probe", "--child", mode, variant],
        env=dict(os.environ, PYTHONPATH=pythonpath),
        cwd=tree,  # -m puts the working directory first on sys.path: the tree measured
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    ended = time.time()
    marks = [ln for ln in out.stdout.splitlines() if ln.startswith(MARK)]
    if out.returncode != 0 or not marks:
        return f"rc {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"
    returned = float(marks[-1][len(MARK) :])
    return {"process_s": ended - started, "exit_s": ended - returned}


def main(argv: list[str] | None = None) -> int:
    """Run the probe (or, with ``--child``, one measured program)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--against", action="append", default=[], help="a commit or directory")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes a comma-separated subset of {','.join(MODES)}")
    repo = str(Path(__file__).resolve().parent.parent)
    from .s9_versus import extract_all

    with tempfile.TemporaryDirectory(prefix="pe-exit-probe-") as scratch:
        trees = {"this tree": (repo, repo)}
        for name, into in extract_all(args.against, Path(scratch)):
            trees[f"against {name}"] = (str(into), f"{into}{os.pathsep}{repo}")
        stock_tree = next(iter(trees))  # stock imports nothing of the library: run once
        cells = [
            (tree, mode, variant)
            for mode in modes
            for tree, variant in [(stock_tree, "stock")] + [(t, "ours") for t in trees]
        ]
        rows: dict[tuple[str, str, str], list[dict[str, float]]] = {c: [] for c in cells}
        for r in range(args.rounds):
            shift = r % len(cells)
            for tree, mode, variant in cells[shift:] + cells[:shift]:
                got = _run_child(*trees[tree], mode, variant)
                if isinstance(got, dict):
                    rows[(tree, mode, variant)].append(got)
                print(f"round {r + 1} {tree} {mode} {variant}: {got}", flush=True)
    from ._common import version

    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
        f"python {sys.version.split()[0]}, torch {version('torch')}, triton {version('triton')}, "
        f"loky {version('loky')}; `python -m benchmarks.exit_probe "
        f"{' '.join(sys.argv[1:])}`; medians of {args.rounds} rounds.\n"
    )
    columns = ["stock"] + [f"ours, {tree}" for tree in trees]
    print(f"| integration | {' | '.join(c + ': process s / exit s' for c in columns)} |")
    print("|---|" + "---|" * len(columns))
    for mode in modes:
        text = []
        for tree, variant in [(stock_tree, "stock")] + [(t, "ours") for t in trees]:
            got = rows[(tree, mode, variant)]
            if not got:
                text.append("failed")
                continue
            process = median([g["process_s"] for g in got])
            exit_s = median([g["exit_s"] for g in got])
            text.append(f"{process:.2f} / {exit_s:.2f}")
        print(f"| {mode} | {' | '.join(text)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
