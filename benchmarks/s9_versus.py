"""Scenario 9: warm per-task overhead against another version of the library and the stdlib pool.

Three pools, each measured in a child interpreter of its own: this tree's
``PrecompileExecutor``, the one of ``--against REV`` (default ``HEAD``, the last commit, so a
change not yet committed is measured against the tree before it; its ``precompile_executor/``
from ``git archive``, first on ``PYTHONPATH``), and
``ProcessPoolExecutor(mp_context=fork)``. Rounds interleave them (the order rotates each round),
so a noisy machine slows all three alike. Each child imports torch and triton (as an autotuner's
process has), starts the workers with an initializer that imports them too, warms them, then
times a no-op ``map`` (µs per task), sequential ``submit().result()`` round trips (µs; then
the median of each leg: from ``submit`` until the task runs in its worker, and from there until
``result()`` returns) and, for
the two library versions, the compile batch of scenario 2 on the warm workers (every worker
compiled an unrelated kernel first), into a fresh Triton cache. The batch compiles the example
matmul kernel of each version's own tree (``precompile_executor/examples/kernels.py``); the
cubin bytes column is a check that both compiled the same configs (the sizes also hold the
source file's path in the line info, so they differ by a little).

Run alone: ``python -m benchmarks.run --only s9 --out DIR [--against REV] [--repeats N]``;
``REV`` is a commit, or a directory holding an extracted ``precompile_executor/``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import Context, median
from ._report import Section, Table, Target, bars, fmt_us

CHILD_TIMEOUT_S = 900.0
_REPO = Path(__file__).resolve().parent.parent


def extract(rev: str, into: Path) -> str:
    """Put ``rev``'s ``precompile_executor/`` under ``into``; return ``rev``'s short hash.

    ``rev`` may also be a directory that holds an extracted ``precompile_executor/`` (for a
    machine without the repository's history): it is linked, and named by its path.
    """
    if (Path(rev) / "precompile_executor").is_dir():
        (into / "precompile_executor").symlink_to(Path(rev).resolve() / "precompile_executor")
        return rev
    git = ["git", "-C", str(_REPO)]
    short = subprocess.run(
        [*git, "rev-parse", "--short", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    archive = into / "rev.tar"
    with archive.open("wb") as f:
        subprocess.run([*git, "archive", short, "precompile_executor"], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return short


def extract_all(revs: list[str], scratch: Path) -> list[tuple[str, Path]]:
    """Each of ``revs`` extracted (:func:`extract`) into a directory of its own under
    ``scratch``: its name and that directory, in order. A child that imports the package from
    one runs in it (``-m`` puts the working directory first on ``sys.path``)."""
    trees = []
    for i, rev in enumerate(revs):
        into = scratch / str(i)
        into.mkdir()
        trees.append((extract(rev, into), into))
    return trees


def _measure(which: str, workers: int, n_map: int, n_rt: int, cfgs: list[Any], cache: str) -> Any:
    """The child's side: start one pool, warm it, time it; return the figures."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import torch  # noqa: F401 - an autotuner's process has them loaded
    import triton  # noqa: F401

    from ._tasks import import_torch_triton, noop, now

    pool: Any
    if which == "stdlib":
        pool = ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("fork"), initializer=import_torch_triton
        )
        stop = pool.shutdown
        where = "stdlib"
    else:
        import precompile_executor as pe

        pool = pe.PrecompileExecutor(workers, initializer=import_torch_triton)
        pool.warm_up(timeout=CHILD_TIMEOUT_S)
        stop = pool.terminate_workers
        where = str(Path(pe.__file__).parent)
    try:
        assert list(pool.map(noop, range(max(64, n_map // 8)))) == list(range(max(64, n_map // 8)))
        for i in range(20):
            pool.submit(noop, i).result(timeout=60)
        start = time.perf_counter()
        assert list(pool.map(noop, range(n_map))) == list(range(n_map))
        map_s = (time.perf_counter() - start) / n_map
        start = time.perf_counter()
        for i in range(n_rt):
            pool.submit(noop, i).result(timeout=60)
        rt_s = (time.perf_counter() - start) / n_rt
        # The two legs of a round trip: submit until the task runs in its worker, and from
        # there until result() returns (CLOCK_MONOTONIC is one clock for every process).
        outs, backs = [], []
        for _ in range(max(1, n_rt // 4)):
            sent = time.monotonic()
            ran = pool.submit(now).result(timeout=60)
            back = time.monotonic()
            outs.append(ran - sent)
            backs.append(back - ran)
        out_s, back_s = statistics.median(outs), statistics.median(backs)
        batch_s = cubin = None
        if which != "stdlib":
            from ._kernels import compile_config, warm_compile

            for _ in range(2):  # a short sleep in each keeps one worker from taking two
                for f in [pool.submit(warm_compile, 0.3) for _ in range(workers)]:
                    f.result(timeout=CHILD_TIMEOUT_S)
            start = time.perf_counter()
            futures = [pool.submit(compile_config, tuple(c), cache) for c in cfgs]
            results = [f.result(timeout=CHILD_TIMEOUT_S) for f in futures]
            batch_s = time.perf_counter() - start
            cubin = sum(r["cubin_bytes"] for r in results)
    finally:
        stop()
    return {
        "map_s": map_s,
        "rt_s": rt_s,
        "out_s": out_s,
        "back_s": back_s,
        "batch_s": batch_s,
        "cubin": cubin,
        "where": where,
    }


def _child(which: str, path: str | None, args: dict[str, Any], ctx: Context) -> dict[str, Any]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.s9_versus", which, json.dumps(args)],
        env=env,
        cwd=path or _REPO,  # ``-m`` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the {which} child failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    ctx.log(
        f"s9: {which}: map {result['map_s'] * 1e6:.0f} µs/task, round trip "
        f"{result['rt_s'] * 1e6:.0f} µs"
        + (f", batch {result['batch_s']:.2f}s" if result["batch_s"] is not None else "")
    )
    return result


def run(ctx: Context) -> Section:
    from ._kernels import configs

    w = ctx.workers
    n_map, n_rt = (200, 50) if ctx.quick else (20_000, 4_000) if ctx.long else (2000, 200)
    cfgs = configs(ctx.n_configs, ctx.quick)
    rev_dir = ctx.tmp / "against"
    rev_dir.mkdir()
    notes: list[str] = []
    try:
        short = extract(ctx.against, rev_dir)
    except (OSError, subprocess.SubprocessError, tarfile.TarError) as exc:
        short = ""
        notes.append(f"{ctx.against}: skipped, its tree could not be extracted ({exc})")
    ours = "PrecompileExecutor, this tree"
    theirs = f"PrecompileExecutor at {short or ctx.against}"
    stdlib = "stdlib PPE (fork)"
    pools = {ours: ("ours", str(_REPO)), stdlib: ("stdlib", None)}
    if short:
        pools[theirs] = ("rev", str(rev_dir))
    ctx.log(f"s9: {', '.join(pools)}; {ctx.repeats} interleaved round(s)")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in pools}
    for rnd in range(ctx.repeats):
        names = list(pools)
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            which, path = pools[name]
            args = {"workers": w, "n_map": n_map, "n_rt": n_rt, "cfgs": cfgs}
            args["cache"] = ctx.fresh_dir(f"cache-{which}")
            runs[name].append(_child(which, path, args, ctx))

    def med(name: str, key: str) -> float:
        return median(r[key] for r in runs.get(name, []) if r[key] is not None)

    def vs(name: str, other: str, *keys: str) -> str:
        return " / ".join(f"{med(name, k) / med(other, k):.2f}" for k in keys)

    against = short or ctx.against
    rows = [
        {
            "pool": name,
            "map (µs/task)": fmt_us(med(name, "map_s")),
            "round trip (µs)": fmt_us(med(name, "rt_s")),
            "legs: to the task / back (µs)": f"{fmt_us(med(name, 'out_s'))} / "
            f"{fmt_us(med(name, 'back_s'))}",
            "batch (s)": med(name, "batch_s"),
            "map × stdlib": vs(name, stdlib, "map_s"),
            "round trip × stdlib": vs(name, stdlib, "rt_s"),
            f"× {against}: map / round trip / batch": vs(name, theirs, "map_s", "rt_s", "batch_s")
            if short and name != stdlib
            else "—",
            "cubin bytes": runs_[0]["cubin"],
        }
        for name, runs_ in runs.items()
    ]
    title = (
        f"Warm pools of {w} workers: no-op map of {n_map} tasks, {n_rt} round trips, "
        f"{len(cfgs)} sm_90 matmul configs (medians of {ctx.repeats} interleaved runs)"
    )
    where = {name: r[0]["where"] for name, r in runs.items() if name != stdlib}
    notes.append("Library imported from: " + "; ".join(f"{n}: `{p}`" for n, p in where.items()))
    # The project's overhead goals (docs/benchmarks.md, "per-task overhead"); single rounds of one
    # tree differ by up to 30 % here, so judge them on --long --repeats 9 or more.
    targets = [
        Target("map, ours / stdlib fork", med(ours, "map_s") / med(stdlib, "map_s"), "<=", 0.6),
        Target(
            "round trip, ours / stdlib fork",
            med(ours, "rt_s") / med(stdlib, "rt_s"),
            "<=",
            0.8,
        ),
    ]
    if short:
        batch = med(ours, "batch_s") / med(theirs, "batch_s")
        targets.append(Target(f"compile batch, ours / {short}", batch, "<=", 1.0))
    section = Section(
        "s9",
        f"9. Per-task overhead against {against} and the stdlib pool",
        " ".join(__doc__.split("\n\n")[1].split()),
        [Table.of(title, rows)],
        targets,
        notes,
    )
    section.plot = bars(
        f"9. Warm per-task overhead vs {against}, {w} workers (µs)",
        list(runs),
        {
            f"map, µs per task ({n_map})": ([med(n, "map_s") * 1e6 for n in runs], "tab:orange"),
            "round trip, µs": ([med(n, "rt_s") * 1e6 for n in runs], "tab:blue"),
        },
        "µs",
        fmt="{:,.0f}",
    )
    return section


def main(argv: Sequence[str]) -> int:
    """``python -m benchmarks.s9_versus ours|rev|stdlib ARGS_JSON``: one child's measurement."""
    args = json.loads(argv[1])
    print(json.dumps(_measure(argv[0], **args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
