"""Benchmarks: ``PrecompileExecutor`` side by side with the other ways to run a compile batch.

``python -m benchmarks.run --out DIR`` runs every scenario (``--quick`` for a tiny smoke run) and
writes ``DIR/benchmarks.md`` and ``DIR/benchmarks.png``; see :mod:`benchmarks.run`.

* :mod:`benchmarks.run` — the command line; a supervisor that runs each scenario in a child and
  checks afterwards that no process it started is left.
* ``s1_overhead`` … ``s9_versus`` — one module per scenario, each shaped measure → rows →
  ``Section``; ``s9_versus`` compares with another revision of the library (``--against``).
* :mod:`benchmarks._report` — the one renderer: rows → ``Table.of``, ``Target`` ratios, plot
  panels (``bars``), text, Markdown and the PNG.
* :mod:`benchmarks._common` — the run context, timing, process inspection, the machine stamp.
* :mod:`benchmarks._kernels` — the compile task: configs of the package's example matmul kernel
  (``precompile_executor/examples/kernels.py``), and its layer norm to warm a compiler.
* :mod:`benchmarks._batch` — one compile batch under each strategy, and its ideal.
* :mod:`benchmarks._tasks` — module-level tasks (no-op, hangs, crashes, initializers).
* :mod:`benchmarks._helion_modes` — Helion's two modes re-implemented: a fork or a fresh
  interpreter per task (and, run as a module, the cold parent of scenario 2).
* :mod:`benchmarks._pools` — uniform handles on the other pools (stdlib, loky, pebble).
* Run on their own: ``_replace_latency`` (crash → replacement, step by step), ``gantt`` (drawn
  by s7), ``dask_bench`` and ``ray_bench`` (one shared body), ``limits_probe``,
  ``fork_cow_probe``, ``helion_stream_cpu``; on a GPU machine ``gpu_runonce``,
  ``gpu_fork_probe``, ``helion_bench``, ``triton_autotune_bench`` (``bash
  benchmarks/gpu_session.sh <stage>``).

The question each script answers, and its latest answer: ``docs/benchmarks.md``, "Questions".
Nothing here is imported by the library; ``tests/test_benchmarks_smoke.py`` runs the quick run.
"""
