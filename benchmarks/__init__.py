"""Benchmarks: ``PrecompileExecutor`` against the stock ways to run a compile batch.

``python -m benchmarks`` lists the suites; ``python -m benchmarks SUITE`` runs one (``--plan``
prints what it would run, ``--quick`` runs each benchmark at a tiny size); see
:mod:`benchmarks.suites`. The current figures and how each was measured: ``docs/benchmarks.md``.

* :mod:`benchmarks.suites` — the suites (core, triton, helion, inductor, cluster): each
  benchmark, what it compares, what to read in its output, the machine it needs.
* :mod:`benchmarks.run` — the core suite's scenarios: a supervisor that runs each in a child
  and checks afterwards that no process it started is left; ``s1_overhead`` … ``s9_versus``,
  one module per scenario, each shaped measure → rows → ``Section``; ``s9_versus`` compares
  with another commit (``--against``, taken with ``git archive``).
* ``gil_probe`` — the core suite's busy caller: tasks flowing while the caller holds the GIL.
* ``triton_autotune_bench``, ``triton_library_bench``, ``gpu_runonce`` (triton suite),
  ``helion_bench`` (helion), ``inductor_bench`` (inductor), ``dask_bench``, ``ray_bench``,
  ``fleet_bench`` (cluster). On the GPU machine their stages run through ``bash
  benchmarks/gpu_session.sh STAGE`` (``docs/gpu-runs.md``).
* Shared parts: :mod:`benchmarks._report` (rows → tables, ratios, targets, plots),
  :mod:`benchmarks._common` (run context, timing, process inspection, the machine stamp),
  :mod:`benchmarks._kernels` (the compile task), :mod:`benchmarks._batch`,
  :mod:`benchmarks._tasks`, :mod:`benchmarks._helion_modes` (Helion's two modes re-implemented),
  :mod:`benchmarks._pools` (the other pools), ``gantt`` (drawn by s7).

Nothing here is imported by the library; ``tests/test_benchmarks_smoke.py`` checks every suite's
plan and runs the core suite's quick forms.
"""
