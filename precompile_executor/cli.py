"""The ``precompile-executor`` command (also ``python -m precompile_executor``).

``warm FILE_OR_MODULE --target cuda:90``
    Compile every config of the kernels that the module's ``PRECOMPILE_SPECS`` lists, in
    parallel worker processes, into this machine's Triton cache; show a progress bar and a
    summary table.
    With ``--scheduler ADDRESS`` (dask) or ``--ray-address ADDRESS`` (Ray) the compiles run on
    the cluster's nodes (CPU machines do: no GPU is needed for an explicit target) and the files
    come back into this machine's cache.
``demo``
    ``warm`` the example kernels shipped in :mod:`precompile_executor.examples.kernels` for
    ``cuda:90``, into a temporary cache (no GPU needed).

Exit status: 0 when every config compiled, was cached, or failed in an expected way (a resource
or ``ptxas`` limit, a timeout); 1 when a config failed unexpectedly; 2 for bad input (no such
file, no specs, unknown target), reported in one line on stderr. Triton is imported only when a
command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from precompile_executor.triton import ConfigResult, WarmReport

EXIT_OK = 0
EXIT_COMPILE_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
DEMO_MODULE = "precompile_executor.examples.kernels"
DEMO_TARGET = "cuda:90"
DEFAULT_TIMEOUT_S = 300.0
"""Per-config compile timeout: generous, so only a hung ``ptxas`` reaches it."""


class _BadInput(Exception):
    """Input the user must fix; printed as one line, no traceback."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (``sys.argv[1:]`` by default) and return the exit status."""
    args = _parser().parse_args(argv)
    try:
        status: int = args.run(args)
        return status
    except _BadInput as exc:
        print(f"precompile-executor: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("precompile-executor: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="precompile-executor",
        description="Compile Triton autotune configs in parallel worker processes.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    warm = commands.add_parser(
        "warm",
        help="compile every config of the kernels a module lists in PRECOMPILE_SPECS",
        description="Compile every config of the kernels that FILE_OR_MODULE lists in its "
        "PRECOMPILE_SPECS dict, into this machine's Triton cache.",
    )
    warm.add_argument("module", metavar="FILE_OR_MODULE", help="a .py file or a dotted module")
    warm.add_argument(
        "--target", required=True, help="e.g. cuda:90, cuda:80, hip:gfx942 (no GPU needed)"
    )
    warm.add_argument(
        "--force", action="store_true", help="compile even the configs already in the cache"
    )
    _common_options(warm)
    warm.set_defaults(run=_run_warm)
    demo = commands.add_parser(
        "demo",
        help="warm the bundled example kernels (matmul, softmax, layer norm, add+GELU)",
        description=f"Warm {DEMO_MODULE} for a target; compiles into a temporary cache unless "
        "--cache-dir is given.",
    )
    demo.add_argument("--target", default=DEMO_TARGET, help=f"default: {DEMO_TARGET}")
    _common_options(demo)
    demo.set_defaults(run=_run_demo)
    return parser


def _common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=None,
        help="worker processes (default: one per CPU); on a cluster: compiles at once per node "
        "(default: its dask threads or Ray CPUs)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="compile on the nodes of this dask cluster (tcp://host:8786) instead of here; the "
        "files come back into this machine's cache",
    )
    where.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        default=None,
        help="compile on the nodes of this Ray cluster (host:6379) instead of here",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds one config may compile (default: {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--cache-dir", default=None, help="Triton cache directory to fill (default: Triton's own)"
    )
    parser.add_argument(
        "--verbose", "-v", action="store_true", help="also list expected failures (resource limits)"
    )


def _run_warm(args: argparse.Namespace) -> int:
    return _warm_module(args.module, args, force=args.force, cache_note=None)


def _run_demo(args: argparse.Namespace) -> int:
    if args.cache_dir is not None:
        return _warm_module(DEMO_MODULE, args, force=False, cache_note=None)
    with tempfile.TemporaryDirectory(prefix="precompile-executor-demo-") as cache_dir:
        args.cache_dir = cache_dir
        note = "compiled into a temporary cache (use --cache-dir DIR to keep the results)"
        return _warm_module(DEMO_MODULE, args, force=False, cache_note=note)


def _warm_module(
    name: str, args: argparse.Namespace, *, force: bool, cache_note: str | None
) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise _BadInput(f"--jobs must be at least 1, got {args.jobs}")
    if args.timeout is not None and args.timeout <= 0:
        raise _BadInput(f"--timeout must be positive, got {args.timeout:g}")
    # Triton warns about its own defaults on first use; that is not this command's news.
    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    from precompile_executor import stop_idle_workers
    from precompile_executor.triton import classify, count_configs, parse_target, warm
    from precompile_executor.triton._discover import SpecsError, find_specs, load_module

    try:
        target = parse_target(args.target)
        specs = find_specs(load_module(name))
    except (ValueError, SpecsError) as exc:
        raise _BadInput(str(exc)) from None
    from rich.console import Console
    from triton import knobs

    out, err = Console(), Console(stderr=True)
    total = count_configs(specs)
    with knobs.cache.scope():
        if args.cache_dir is not None:
            knobs.cache.dir = args.cache_dir
        try:
            with (
                _executor(args, classify) as executor,
                _progress(err, total, f"compiling for {args.target}") as advance,
            ):
                report = warm(
                    specs, target=target, executor=executor, force=force, on_result=advance
                )
        finally:
            stop_idle_workers()  # a one-shot command keeps no warm workers: exit now
    _print_report(out, report, args, cache_note)
    return EXIT_COMPILE_FAILED if report.unexpected_failures else EXIT_OK


SCHEDULER_CONNECT_TIMEOUT_S = 30.0
"""Longest ``--scheduler`` waits to reach the dask scheduler before it reports bad input."""


@contextlib.contextmanager
def _executor(args: argparse.Namespace, classify: Any) -> Iterator[Any]:
    """The executor the compiles run in: this machine's pool, or a dask or Ray cluster's nodes
    (each node compiles for the caller's ``--target``; the files come back here)."""
    if args.scheduler is None and args.ray_address is None:
        from precompile_executor import PrecompileExecutor

        with PrecompileExecutor(args.jobs, timeout=args.timeout, classify=classify) as executor:
            yield executor
        return
    settings = {"timeout": args.timeout, "classify": classify, "max_workers_per_node": args.jobs}
    if args.ray_address is not None:
        try:
            from precompile_executor.ray import RayPrecompileExecutor
        except ImportError as exc:
            raise _BadInput(
                f"--ray-address needs Ray: pip install 'precompile-executor[ray]' ({exc})"
            ) from None
        try:
            cluster = RayPrecompileExecutor(address=args.ray_address, **settings)
        except ConnectionError as exc:
            raise _BadInput(
                f"could not join the Ray cluster at {args.ray_address}: {exc}"
            ) from None
        with cluster:
            yield cluster
        return
    try:
        from distributed import Client

        from precompile_executor.dask import DaskPrecompileExecutor
    except ImportError as exc:
        raise _BadInput(
            f"--scheduler needs dask: pip install 'precompile-executor[dask]' ({exc})"
        ) from None
    try:
        client = Client(args.scheduler, timeout=SCHEDULER_CONNECT_TIMEOUT_S)  # type: ignore[no-untyped-call]
    except (OSError, ValueError) as exc:
        raise _BadInput(f"could not reach the dask scheduler {args.scheduler}: {exc}") from None
    with client, DaskPrecompileExecutor(client, **settings) as on_dask:
        yield on_dask


class _progress:
    """A rich progress bar on stderr, advanced once per config result."""

    def __init__(self, console: Any, total: int, description: str) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task = self._bar.add_task(description, total=total)

    def __enter__(self) -> Any:
        self._bar.start()
        return self._advance

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def _advance(self, result: ConfigResult) -> None:
        self._bar.advance(self._task)


def _print_report(
    console: Any, report: WarmReport, args: argparse.Namespace, cache_note: str | None
) -> None:
    from rich.table import Table

    table = Table(title=f"precompiled for {report.target}")
    for header in ("kernel", "configs", "ok", "cached", "failed", "timed out", "compile s"):
        table.add_column(header, justify="left" if header == "kernel" else "right")
    kernels = list(dict.fromkeys(r.kernel for r in report.results))
    for kernel in [*kernels, None]:
        rows = [r for r in report.results if kernel is None or r.kernel == kernel]
        cells = [
            len(rows),
            sum(r.status == "ok" for r in rows),
            sum(r.status == "cached" for r in rows),
            sum(r.status == "failed" for r in rows),
            sum(r.status == "timed out" for r in rows),
        ]
        seconds = f"{sum(r.compile_time_s for r in rows):.1f}"
        name = kernel if kernel is not None else "[bold]total[/bold]"
        if kernel is None:
            table.add_section()
        table.add_row(name, *(str(c) for c in cells), seconds)
    console.print(table)
    console.print(
        f"wall time {report.wall_time_s:.1f} s, sum of compile times "
        f"{report.compile_time_s:.1f} s, speed-up over sequential {report.speedup:.2f}x"
    )
    for result in report.results:
        if result.error is None or (result.classification == "debug" and not args.verbose):
            continue
        kind = getattr(result.error, "exc_type", None) or type(result.error).__name__
        console.print(
            f"{result.status.upper()} ({result.classification}) "
            f"{result.kernel}[{result.config}]: {kind}: {_summary(result.error)}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if cache_note:
        console.print(cache_note)


def _summary(error: BaseException) -> str:
    """One line for an error: its first line, plus the line that says what went wrong.

    Triton's messages put the location first and the cause last (``CompilationError``), or bury
    the cause in ``ptxas`` output after a generic first line (``PTXASError``).
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    cause = next(
        (line for line in lines[1:] if "error" in line.lower() or "fatal" in line.lower()),
        lines[-1],
    )
    return f"{lines[0]} ... {cause}"
