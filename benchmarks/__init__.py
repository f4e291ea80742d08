"""Benchmarks: ``PrecompileExecutor`` side by side with the other ways to run a compile batch.

Run everything with ``python -m benchmarks.run`` (``--quick`` for a tiny smoke run); it writes
``docs/benchmarks.md`` and ``docs/benchmarks.png``. See :mod:`benchmarks.run` for the options.

Layout (one job per module):

* :mod:`benchmarks.run` — the command line; a supervisor process that runs the benchmark in a
  child and checks afterwards that no process it started is left.
* :mod:`benchmarks._tasks` — the module-level task functions the pools run (no-op, hangs,
  crashes, the torch+triton initializer).
* :mod:`benchmarks._kernels` — the configs of the package's example matmul kernel
  (``precompile_executor/examples/kernels.py``) and ``compile_config``.
* :mod:`benchmarks._seed` — minimal re-implementations of Helion's two modes: one forked child
  per task and one fresh interpreter per task.
* :mod:`benchmarks._pools` — uniform handles on the alternative pools (stdlib, loky, pebble).
* :mod:`benchmarks._common` — the run context, timing, process inspection, the machine stamp.
* :mod:`benchmarks._report` — the one renderer: tables (``Table.of(rows)``), target ratios,
  plot panels (``bars``), Markdown and the PNG.
* ``s1_overhead`` … ``s9_versus`` — one module per scenario, each shaped measure → rows →
  ``Section``; ``s9_versus`` compares with another revision of the library (``--against``).
* :mod:`benchmarks._replace_latency` — run on its own: where the time from a worker's crash (or
  timeout kill) to its replacement starting the next task goes, step by step.

Nothing here is imported by the library or its tests except ``tests/test_benchmarks_smoke.py``,
which runs the command in ``--quick`` mode.
"""
