"""The one entry point: ``python -m benchmarks SUITE`` runs a named suite of benchmarks.

Usage (from the repository root)::

    python -m benchmarks                        # the suites, what each compares, what it needs
    python -m benchmarks core --plan            # what a run would do; runs nothing
    python -m benchmarks core --quick           # every benchmark of the suite at a tiny size
    python -m benchmarks core --only s9 --against HEAD~1   # before/after of a change
    python -m benchmarks triton --out DIR       # on a CUDA machine
    python -m benchmarks core --only s2 -- --workers 16 --configs 64   # options of its own

Each benchmark compares the library with the stock form it replaces (the stdlib's pool,
Triton's, Inductor's or Helion's own machinery, dask's and Ray's executors) on the same machine
in the same run, interleaved where it has rounds, and prints the ratios. Every benchmark runs in a
child interpreter of its own; its output is shown as it comes and kept in
``OUT/NAME.log`` beside what it writes itself (``--out``, default
``benchmarks/results/SUITE-DATE``, which git ignores). A benchmark that needs a CUDA GPU is
skipped, with a line saying so, on a machine without one. Where the figures go:
``docs/benchmarks.md`` (the current figures and how each was measured).

Arguments after ``--`` go to each chosen benchmark as they are (``python -m benchmarks.MODULE
--help`` lists a benchmark's own options). Exit status: 0; 1 when a benchmark failed; 2 for a
usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = _REPO_ROOT / "benchmarks" / "results"
"""Where a run's outputs go unless ``--out`` says otherwise (ignored by git)."""
WIDTH = 100
"""Columns of the printed plan."""
GPU_CHECK_TIMEOUT_S = 120.0
"""How long the check for a CUDA device (a child that imports torch) may take."""


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One benchmark of a suite: a module of ``benchmarks/`` and how the suite runs it.

    In ``full`` and ``quick`` an argument ``{out}`` becomes the run's output directory.
    ``quick`` is ``None`` where the benchmark has no small form; ``gpu`` marks a benchmark that
    needs a CUDA device, ``quick_on_cpu`` one whose quick form runs without one.
    ``against`` is the option that takes ``--against REV``, where the benchmark has one;
    ``parts`` are names ``--only`` may pick within it, passed on as ``--only PART,...``.
    """

    name: str
    module: str
    compares: str
    read: str
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] | None = None
    gpu: bool = False
    quick_on_cpu: bool = False
    against: str | None = None
    parts: tuple[str, ...] = ()

    def argv(
        self,
        *,
        quick: bool,
        out: Path,
        against: str | None,
        parts: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> list[str]:
        """The child's command line, ``python -m`` and its arguments."""
        args = self.quick if quick and self.quick is not None else self.full
        argv = [a.replace("{out}", str(out)) for a in args]
        if against and self.against:
            argv += [self.against, against]
        if parts:
            argv += ["--only", ",".join(parts)]
        argv += extra
        return [sys.executable, "-m", self.module, *argv]

    def needs_gpu(self, *, quick: bool) -> bool:
        """Whether this run of it needs a CUDA device."""
        return self.gpu and not (quick and self.quick_on_cpu)


SUITES: dict[str, tuple[str, tuple[Benchmark, ...]]] = {
    "core": (
        "the executor against the stdlib, loky and pebble pools, threads and Helion's two modes "
        "(2 cores suffice; no GPU)",
        (
            Benchmark(
                "scenarios",
                "benchmarks.run",
                "s1 no-op overhead, s2 a 12-config sm_90 compile batch, s3 faults, s4 kill "
                "latency, s5 memory, s6 scaling, s7 ordering, s8 worker starts: ours against the "
                "stdlib, loky and pebble pools, threads and Helion's fork and spawn modes; s9: "
                "this tree against the stdlib fork pool and another commit (--against, default "
                "HEAD: the last commit, so uncommitted changes are what is compared), interleaved",
                "each scenario's table and its 'Targets' lines (ratios: '× ideal', '× stdlib', "
                "'× REV'); the whole report in OUT/benchmarks.md and OUT/benchmarks.png",
                ("--out", "{out}"),
                ("--quick", "--out", "{out}"),
                against="--against",
                parts=tuple(f"s{i}" for i in range(1, 10)),
            ),
            Benchmark(
                "busy-caller",
                "benchmarks.gil_probe",
                "tasks flowing while a caller thread holds the GIL in long C calls (as Inductor's "
                "lowering or a compile in the caller does): ours against the stdlib fork pool "
                "(and --against REV), rounds interleaved",
                "'hog ÷ quiet': how much the busy caller slows each pool's warm batch",
                ("--rounds", "3", "--hog-ms", "20"),
                ("--rounds", "1", "--workers", "1", "--tasks", "3", "--task-ms", "1")
                + ("--hog-ms", "2", "--warm-tasks", "10", "--round-trips", "5"),
                against="--against",
            ),
        ),
    ),
    "triton": (
        "@triton.autotune's first call and run-once GPU batches: stock Triton and Helion's modes "
        "against ours (a CUDA GPU; 16 cores)",
        (
            Benchmark(
                "autotune",
                "benchmarks.triton_autotune_bench",
                "@triton.autotune's first call (compile and benchmark every config) of matmul, "
                "softmax, cross-entropy, layer norm, attention: stock Triton against "
                "autotune.use(), each run a fresh process with a cold cache",
                "'× vs stock' per kernel and mode; 'ours / stock' per config",
                ("--out", "{out}/autotune-bench.md"),
                ("--only", "matmul", "--out", "{out}/autotune-bench.md"),
                gpu=True,
            ),
            Benchmark(
                "libraries",
                "benchmarks.triton_library_bench",
                "the first training step of real Triton libraries (fla-core, liger-kernel): "
                "stock against use() and install() first, whole process, rounds interleaved",
                "'step vs stock' per library and mode; 'worst vs stock' per kernel",
                ("--out", "{out}/library-bench.md", "--results", "{out}/library-runs.jsonl"),
                ("--plan",),
                gpu=True,
                quick_on_cpu=True,
            ),
            Benchmark(
                "run-once",
                "benchmarks.gpu_runonce",
                "64 matmul configs compiled and run once: warm workers with shared arguments "
                "against Helion's fork mode and an interpreter per config, on one GPU and all",
                "'Helion fork mode / ours', 'Helion spawn mode / ours' and the other 'A / B = Nx' "
                "lines",
                ("--json", "{out}/gpu-runonce.json"),
                ("--quick", "--json", "{out}/gpu-runonce.json"),
                gpu=True,
            ),
        ),
    ),
    "helion": (
        "Helion's autotuning, whole process: its native fork mode against ours (a CUDA GPU)",
        (
            Benchmark(
                "autotune",
                "benchmarks.helion_bench",
                "Helion autotuning (skewed softmax with timeouts, matmul RandomSearch, LFBO, "
                "softmax with a compile that hangs, bmm), "
                "whole process: Helion's native fork mode against precompile_executor.helion, "
                "rounds interleaved",
                "'vs native-fork' (whole process) per scenario and mode",
                ("--out", "{out}/helion-bench.md"),
                ("--quick", "--rounds", "1", "--out", "{out}/helion-bench.md"),
                gpu=True,
            ),
        ),
    ),
    "inductor": (
        "a cold torch.compile, default and max-autotune: Inductor's own compile pool against "
        "precompile_executor.inductor (a CUDA GPU; --quick runs on a CPU)",
        (
            Benchmark(
                "compile",
                "benchmarks.inductor_bench",
                "a GPT-2-width decoder and a ResNet-18-shaped network compiled cold, whole "
                "process: stock Inductor against use(), rounds interleaved",
                "'process wall s', stock's row against use()'s, per model and mode (seconds: "
                "the table has no ratio column)",
                ("--out", "{out}/inductor-bench.json", "--results", "{out}/inductor-runs.jsonl"),
                ("--smoke", "--out", "{out}/inductor-bench.json"),
                gpu=True,
                quick_on_cpu=True,
            ),
            Benchmark(
                "train",
                "benchmarks.inductor_bench",
                "a Llama-style decoder's training step (2 blocks, bf16) compiled cold in default "
                "mode, whole process: stock Inductor against use() and install(), 2 rounds "
                'interleaved (docs/inductor.md, "Readiness")',
                "'whole-process wall, medians' lines: 'ours/stock' and 'ours-install/stock' "
                "(at most 1.0 is never slower)",
                (
                    "--only",
                    "llama:default",
                    "--variants",
                    "stock,ours,ours-install",
                    "--rounds",
                    "2",
                    "--no-instruments",
                    "--out",
                    "{out}/inductor-train.json",
                ),
                (
                    "--smoke",
                    "--only",
                    "llama:default",
                    "--variants",
                    "stock,ours,ours-install",
                    "--no-instruments",
                    "--out",
                    "{out}/inductor-train.json",
                ),
                gpu=True,
                quick_on_cpu=True,
            ),
            Benchmark(
                "train-autotune",
                "benchmarks.inductor_bench",
                "the same training step in max-autotune at a smaller size (1 block, MLP = "
                "width, vocabulary 8192: fewer distinct GEMMs), stock against use()",
                "'whole-process wall, medians': stock's seconds over use()'s",
                (
                    "--only",
                    "llama:max-autotune",
                    "--variants",
                    "stock,ours",
                    "--rounds",
                    "2",
                    "--layers",
                    "1",
                    "--mlp",
                    "1024",
                    "--vocab",
                    "8192",
                    "--no-instruments",
                    "--out",
                    "{out}/inductor-train-autotune.json",
                ),
                None,
                gpu=True,
            ),
        ),
    ),
    "cluster": (
        "the dask and Ray backends against those clusters' own executors, and compiling on "
        "GPU-less nodes against stock and the local executor",
        (
            Benchmark(
                "dask",
                "benchmarks.dask_bench",
                "a no-op through DaskPrecompileExecutor against dask's Client.get_executor(), "
                "and 12 sm_90 configs on two nodes against one (a loopback cluster)",
                "'ratio ours / dask' and 'speed-up over 1 node'",
                quick=("--quick",),
            ),
            Benchmark(
                "ray",
                "benchmarks.ray_bench",
                "a no-op through RayPrecompileExecutor against a bare Ray task and the dask "
                "backend, and a compile batch on two nodes against one",
                "the ratio rows and 'speed-up over 1 node'",
                quick=("--quick",),
            ),
            Benchmark(
                "fleet",
                "benchmarks.fleet_bench",
                "a GPU process's autotunes (a 48-config GEMM, Helion) compiled on CPU-only dask "
                "nodes: stock against the local executor and the cluster, and a node lost "
                "mid-tune",
                "'process vs stock or native', 'vs local' and 'per-task cost' (--quick on a CPU: "
                "the plumbing only)",
                ("--out-dir", "{out}/fleet"),
                ("--cpu-smoke", "--out-dir", "{out}/fleet"),
                gpu=True,
                quick_on_cpu=True,
            ),
        ),
    ),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(__doc__ or "").split("\n")[0],
        epilog="suites: " + "; ".join(f"{name}: {about}" for name, (about, _) in SUITES.items()),
    )
    p.add_argument("suite", nargs="?", choices=list(SUITES), help="the suite to run")
    p.add_argument("--plan", action="store_true", help="print what would run, run nothing")
    p.add_argument("--quick", action="store_true", help="each benchmark at a tiny size")
    p.add_argument(
        "--only",
        default="",
        help="benchmarks of the suite (or core's scenarios s1…s9), comma-separated",
    )
    p.add_argument("--against", help="a commit (or a directory with precompile_executor/)")
    p.add_argument("--out", type=Path, help="output directory (default: benchmarks/results/…)")
    return p


def print_suites() -> None:
    """Each suite, what it compares, and its benchmarks."""
    print("python -m benchmarks SUITE [--plan] [--quick] [--only NAME,...] [--against REV]\n")
    for name, (about, benchmarks) in SUITES.items():
        print(_wrap(f"{name}: {about}"))
        for b in benchmarks:
            where = "GPU" if b.gpu else "any machine"
            print(f"    {b.name:12} {where:12} {b.module}")
    print("\nMore: python -m benchmarks SUITE --plan; figures: docs/benchmarks.md")


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent="    ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def _has_cuda() -> bool:
    """Whether torch in a child interpreter sees a CUDA device (this process stays free of it)."""
    code = "import torch; print(torch.cuda.is_available())"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=GPU_CHECK_TIMEOUT_S,
        )
        return done.stdout.strip().endswith("True")
    return False


def _run(argv: list[str], log: Path) -> int:
    """Run one benchmark, its output shown as it comes and copied into ``log``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), env.get("PYTHONPATH")]))
    with (
        log.open("w") as f,
        subprocess.Popen(
            argv,
            cwd=_REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as child,
    ):
        assert child.stdout is not None
        try:
            for line in child.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                f.write(line)
        except KeyboardInterrupt:  # the child got the same Ctrl-C: let it clean up
            child.wait()
            raise
        return child.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Print the suites, a suite's plan, or run a suite; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = _parser().parse_args(argv[: len(argv) - len(extra) - (1 if "--" in argv else 0)])
    if args.suite is None:
        print_suites()
        return 0
    about, benchmarks = SUITES[args.suite]
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - {n for b in benchmarks for n in (b.name, *b.parts)})
    if unknown:
        known = ", ".join(
            b.name + (f" ({b.parts[0]}…{b.parts[-1]})" if b.parts else "") for b in benchmarks
        )
        print(
            f"{args.suite} has no benchmark {', '.join(unknown)}; it has: {known}", file=sys.stderr
        )
        return 2
    chosen = [b for b in benchmarks if not names or {b.name, *b.parts} & set(names)]
    parts = {b.name: [p for p in b.parts if p in names and b.name not in names] for b in chosen}
    date = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    # Absolute: the children run at the repository's root, not where this was started.
    out: Path = (args.out or RESULTS_DIR / f"{args.suite}-{date}").resolve()
    print(_wrap(f"suite {args.suite}: {about}"))
    print(f"output: {out}" + (" (not written: --plan)" if args.plan else ""))
    for b in chosen:
        command = " ".join(
            b.argv(
                quick=args.quick, out=out, against=args.against, parts=parts[b.name], extra=extra
            )[1:]
        )
        needs = "a CUDA GPU" if b.needs_gpu(quick=args.quick) else "any machine"
        print("\n" + _wrap(f"[{b.name}] compares: {b.compares}"))
        print(_wrap(f"read: {b.read}", "    "))
        print(_wrap(f"needs: {needs}; runs: python {command}", "    "))
    if args.plan:
        return 0
    cuda = _has_cuda() if any(b.needs_gpu(quick=args.quick) for b in chosen) else False
    out.mkdir(parents=True, exist_ok=True)
    status, summary = 0, []
    for b in chosen:
        if b.needs_gpu(quick=args.quick) and not cuda:
            summary.append(f"{b.name}: skipped, no CUDA device here")
            print(f"\n[{b.name}] skipped: it needs a CUDA GPU and torch sees none", flush=True)
            continue
        print(f"\n[{b.name}] running", flush=True)
        started = time.monotonic()
        code = _run(
            b.argv(
                quick=args.quick, out=out, against=args.against, parts=parts[b.name], extra=extra
            ),
            out / f"{b.name}.log",
        )
        took = time.monotonic() - started
        summary.append(f"{b.name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {took:.0f}s")
        status = status or (1 if code else 0)
    print(f"\nsuite {args.suite}: " + "; ".join(summary) + f"\noutputs and logs: {out}")
    return status
