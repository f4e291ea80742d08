"""What a fork costs the process that forks: copy-on-write faults on its next touches of its heap.

    python -m benchmarks.fork_cow_probe [--forks 8] [--helion] [--cuda]

Helion's fork mode forks the autotuning process once per config. Each fork marks every private
page of the parent copy-on-write again, so the parent's next write to a page — in Python, any
object it touches, through its reference count — takes a page fault and a copy while a child
still shares it. Streamed (docs/helion.md, "Streaming"), the parent generates code and measures
between forks; Helion's own batch does all its codegen first and measures after its children
have exited.

The probe imports torch (``--helion``: and Helion, as the autotuning process has; ``--cuda``: and
opens a CUDA context), then times one pass over every object the garbage collector tracks
(touching each one's reference count): with no child, then after each of ``--forks`` forks whose
children sleep until the end — the first pass after the fork and a second one (its pages are
private again). Output: a markdown table, the passes relative to the no-fork pass.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import statistics
import sys
import time


def _pass(objects: list[object]) -> float:
    t = time.perf_counter()
    for obj in objects:
        type(obj)  # a reference-count write on the object's page
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    """Entry point: the table on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--forks", type=int, default=8)
    parser.add_argument("--helion", action="store_true", help="import helion too")
    parser.add_argument("--cuda", action="store_true", help="open a CUDA context too")
    args = parser.parse_args(argv)
    import torch

    if args.helion:
        import helion  # noqa: F401
    if args.cuda:
        torch.zeros(1, device="cuda")
    from benchmarks._common import stamp, usable_cores

    shown = " ".join(sys.argv[1:] if argv is None else argv)
    info = stamp(usable_cores(), f"python -m benchmarks.fork_cow_probe {shown}")
    objects = gc.get_objects()
    base = statistics.median(_pass(objects) for _ in range(5))
    children: list[int] = []
    rows = []
    try:
        for n in range(1, args.forks + 1):
            t = time.perf_counter()
            pid = os.fork()
            if pid == 0:  # the child: share the pages until the parent is done
                time.sleep(600)
                os._exit(0)
            fork_s = time.perf_counter() - t
            children.append(pid)
            rows.append((n, fork_s, _pass(objects), _pass(objects)))
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    print("\n".join(f"- {k}: {v}" for k, v in info.items()))
    print(f"- objects: {len(objects)}, one pass without a child: {base * 1e3:.1f} ms\n")
    print("| live children | fork ms | first pass after it | second pass |")
    print("|---|---|---|---|")
    for n, fork_s, first, second in rows:
        print(f"| {n} | {fork_s * 1e3:.1f} | {first / base:.1f}× | {second / base:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
