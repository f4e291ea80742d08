"""How much busy compile workers slow the autotuning thread: ``os.nice`` vs leaving a core free.

    python -m benchmarks.nice_proxy [--repeats 5] [--work 3000000]

A CPU-bound stand-in for both sides, so it runs anywhere (the GPU box must confirm it with real
compiles and ``do_bench``): the *caller* times a fixed pure-Python loop — what Triton's launch
path and ``do_bench``'s host side are, one thread that must get a core — while *workers* spin
(what compiles are to the scheduler). Modes: no workers (the floor); one worker per usable core
at nice 0, 5 and 10 (CFS weights 1024, 335, 110 against the caller's 1024); one worker fewer than
the cores, at nice 0. Reports the caller's median loop time and its slowdown over the floor.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

from benchmarks._common import stamp, stamp_line, usable_cores


def _spin(niceness: int, stop: mp.synchronize.Event) -> None:  # type: ignore[name-defined]
    if niceness:
        os.nice(niceness)
    x = 0
    while not stop.is_set():
        for _ in range(10_000):
            x += 1


def _caller_loop(work: int) -> float:
    start = time.perf_counter()
    x = 0
    for i in range(work):
        x += i & 7
    return time.perf_counter() - start


def measure(workers: int, niceness: int, repeats: int, work: int) -> float:
    """The caller's median loop time with ``workers`` spinners at ``niceness``."""
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(niceness, stop), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    try:
        time.sleep(0.3 if workers else 0.0)  # let them reach the run queue
        return statistics.median(_caller_loop(work) for _ in range(repeats))
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def main(argv: list[str] | None = None) -> int:
    """Run every mode and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", type=int, default=3_000_000)
    args = parser.parse_args(argv)
    cores = usable_cores()
    modes = [
        ("no workers", 0, 0),
        (f"{cores} workers, nice 0", cores, 0),
        (f"{cores} workers, nice 5", cores, 5),
        (f"{cores} workers, nice 10", cores, 10),
        (f"{max(cores - 1, 0)} workers (a core left), nice 0", max(cores - 1, 0), 0),
    ]
    floor = None
    print(stamp_line(stamp(cores, "python -m benchmarks.nice_proxy " + " ".join(sys.argv[1:]))))
    print("\n| mode | caller's loop, median s | vs no workers |\n| --- | --- | --- |")
    for name, workers, niceness in modes:
        seconds = measure(workers, niceness, args.repeats, args.work)
        floor = floor if floor is not None else seconds
        print(f"| {name} | {seconds:.3f} | {seconds / floor:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
