"""The worker side of the Inductor integration: what the warm template imports once.

A worker of the default executor is forked from a template that ran :func:`import_inductor`, so
each compile task finds Inductor's code cache, its C++ builder and Triton's installation hash
already loaded. Nothing here imports the parent side of the library.
"""

from __future__ import annotations


def import_inductor() -> None:
    """Initializer for compile workers: import Inductor's compile code and warm what it reuses.

    * ``torch._inductor.async_compile`` imports the code cache, the C++ builder and the worker
      entry points (``_worker_compile_triton``, ``_worker_compile_cpp``) every task calls;
    * ``compile_worker.utils._IN_TOPLEVEL_PROCESS = False`` is what Inductor's own pool workers
      set (``_async_compile_initializer``): ``PyCodeCache`` then keeps no module of a compiled
      kernel alive in the worker. Inductor's initializer itself is not called: it starts a
      watchdog thread, and a template with a thread of its own cannot fork (docs/design.md,
      "Warm templates"); the executor's guardian does that thread's job.
    * with Triton installed, ``triton_key()`` hashes Triton's installation once in the
      template (Inductor's ``pre_fork_setup`` does the same before its pool forks), rather
      than in each worker's first Triton compile. ``pre_fork_setup`` is not called: it reads
      the CUDA device's properties, and a template must not initialise CUDA.
    """
    import torch._inductor.async_compile  # noqa: F401
    from torch._inductor.compile_worker import utils

    utils._IN_TOPLEVEL_PROCESS = False
    from torch._inductor.runtime.triton_compat import HAS_TRITON, triton_key

    if HAS_TRITON:
        triton_key()
