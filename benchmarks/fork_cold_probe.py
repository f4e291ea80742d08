"""What a Triton compile costs in a child forked from a process that never compiled.

    python -m benchmarks.fork_cold_probe [--rounds 3] [--children 6] [--target cuda:90]

Helion's fork mode (and the executor's fork path) compiles each config in a child forked from
the autotuning process. The child inherits that process's Triton as it is: if the process never
compiled, each child hashes Triton's installation (``triton_key``) and sets up the backend in its
own first compile. Helion's native fork mode happens to compile its accuracy baseline in the
autotuning process before it forks; ours defers that baseline to overlap the first batch, so
``use()``/``install()`` warm the caller on a background thread instead
(``precompile_executor.helion._warm.start_caller_warm_up``; docs/helion.md, "Streaming").

Each run is a fresh interpreter (``--child MODE``) that imports torch and Triton, prepares the
caller per mode, then forks ``--children`` children one after another, each compiling a
different small kernel for ``--target`` (no GPU needed) into a fresh cache, and times each
compile inside the child. Modes, interleaved per round:

* ``cold``: nothing before the forks (a process that has not compiled);
* ``key``: the caller computed one cache key for ``--target`` first (what ``use()`` does:
  ``warm_caller``, no compile);
* ``key-other``: the same for another target (``cuda:80``: what ``install()`` does before the
  process has a CUDA context to ask for its own);
* ``compiled``: the caller compiled one tiny kernel first (what native fork's baseline does).

Output: a markdown table — the caller's preparation, the children's compile (median), and that
against ``cold``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

MODES = ("cold", "key", "key-other", "compiled")


def _child(mode: str, children: int, target: str) -> dict[str, Any]:
    """One run in this process: prepare per ``mode``, then fork and time ``children`` compiles."""
    import torch  # noqa: F401 - the autotuning process has it
    import triton
    import triton.language as tl
    from triton.compiler import ASTSource

    from precompile_executor.triton import parse_target
    from precompile_executor.triton._prewarm import prewarm, warm_caller

    @triton.jit  # type: ignore[untyped-decorator]
    def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):  # type: ignore[no-untyped-def]
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        value = tl.load(x_ptr + offsets, mask=mask)
        for i in tl.static_range(STEPS):
            value = value * 1.5 + i
        tl.store(y_ptr + offsets, value, mask=mask)

    signature = {
        "x_ptr": "*fp32",
        "y_ptr": "*fp32",
        "n": "i32",
        "BLOCK": "constexpr",
        "STEPS": "constexpr",
    }
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="fork-cold-probe-")
    t0 = time.perf_counter()
    if mode == "key":
        warm_caller(target)
    elif mode == "key-other":
        warm_caller("cuda:80" if target != "cuda:80" else "cuda:90")
    elif mode == "compiled":
        prewarm(target)  # compiles into a throw-away cache of its own
    prepare_s = time.perf_counter() - t0
    compile_s = []
    for i in range(children):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one compile, timed, then out
            status = 1
            try:
                os.close(read)
                t = time.perf_counter()
                source = ASTSource(
                    fn=scale,
                    signature=signature,
                    constexprs={"BLOCK": 256 << (i % 3), "STEPS": 4 + i},
                )
                triton.compile(source, target=parse_target(target), options={"num_warps": 4})
                os.write(write, f"{time.perf_counter() - t}".encode())
                status = 0
            finally:
                os._exit(status)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        text = os.read(read, 64).decode()
        os.close(read)
        if status != 0 or not text:
            raise RuntimeError(f"child {i} failed (status {status})")
        compile_s.append(float(text))
    return {"mode": mode, "prepare_s": prepare_s, "compile_s": compile_s}


def main(argv: list[str] | None = None) -> int:
    """Entry point: the table on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--children", type=int, default=6)
    parser.add_argument("--target", default="cuda:90")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.children, args.target)))
        return 0
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.fork_cold_probe",
                    "--child",
                    mode,
                    "--children",
                    str(args.children),
                    "--target",
                    args.target,
                ],
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    import triton

    print(
        f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
        f"Python {sys.version.split()[0]}, Triton {triton.__version__}, target {args.target}, "
        f"{args.rounds} rounds × {args.children} children, modes interleaved per round\n"
    )
    print(
        "| caller before the forks | its own time s (median) | a child's compile s (median) "
        "| vs cold |"
    )
    print("|---|---|---|---|")
    cold = statistics.median(s for run in runs["cold"] for s in run["compile_s"])
    for mode in MODES:
        child = statistics.median(s for run in runs[mode] for s in run["compile_s"])
        prepare = statistics.median(run["prepare_s"] for run in runs[mode])
        print(f"| {mode} | {prepare:.3f} | {child:.3f} | {child / cold:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
