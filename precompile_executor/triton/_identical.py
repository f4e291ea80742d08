"""Which configs of one ``@triton.autotune`` tune compiled to the same kernel.

Real grids hold configs that differ only in an option the kernel does not use: ``num_stages``
pipelines loops, so a kernel without a pipelined loop (a row-wise norm, a softmax) compiles to
the same binary for every ``num_stages`` (``tests/test_triton_identical.py`` checks it for sm_90).
Two such configs run the same kernel with the same launch: timing both only adds noise to
Triton's ``min``. A tune times one config per :func:`identity` and gives the others its timing
(docs/triton.md, "Identical kernels").

Guarantees: :func:`identity` is equal for two configs only if their launches are the same —
the same binary, the same metadata the launch reads, the same meta-parameters (what a grid
function sees) —; it is ``None`` for anything it cannot show that of (a kernel not yet
compiled, a stand-in that raises, a binary that is not bytes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable
from typing import Any

NOT_LAUNCHED = frozenset({"hash", "num_stages"})
"""Metadata fields that cannot change what a launch of a compiled kernel runs (Triton 3.9):

* ``hash`` names the compile (its inputs, ``num_stages`` among them): the launch path only hands
  it to the load/unload hooks as a label (``triton/compiler/compiler.py:446,481,490``).
* ``num_stages`` is a compile option only: after the compile, the kernel's launch reads
  ``shared``, ``tmem_size``, ``target``, ``warp_size``, ``num_warps`` and ``name``
  (``CompiledKernel._init_handles``, ``triton/compiler/compiler.py:466-490``), the packed
  ``num_warps``, ``num_ctas``, ``shared`` (``CUDABackend.pack_metadata``,
  ``triton/backends/nvidia/compiler.py:259-264``), and ``tensordesc_meta``, the scratch sizes and
  alignments, ``launch_cooperative_grid``, ``launch_pdl``, ``instrumentation_mode``
  (``CudaLauncher.__init__``, ``triton/backends/nvidia/driver.py:275-299``); the grid function
  sees the kernel's parameters only, never the options (``JITFunction.run``,
  ``triton/runtime/jit.py:749,779``: ``bound_args`` holds parameters, options go to
  ``**options``). Whatever ``num_stages`` changed in the code is in the binary.

Every other field is kept, though most cannot differ once the binary is equal: dropping one
more could only merge kernels that should not be."""


def identity(kernel: Any, meta: dict[str, Any]) -> Hashable | None:
    """The launch a compiled kernel makes for a config with meta-parameters ``meta``, as a
    hashable key: a digest of its binary, its metadata less :data:`NOT_LAUNCHED`, its constant
    arguments (meta-parameters and ``@triton.heuristics`` values) and ``meta`` itself (a grid
    function reads them even where the binary does not); ``None`` if ``kernel`` is not a
    compiled kernel whose binary and metadata can be read.

    Args:
        kernel: a ``CompiledKernel`` (``asm``'s binary is ``kernel.kernel``:
            ``triton/compiler/compiler.py:431``).
        meta: the config's ``kwargs``.
    """
    try:
        binary = kernel.kernel
        fields = kernel.metadata._asdict()
    except Exception:  # noqa: BLE001 - a stand-in that raises, or no compiled kernel at all
        return None
    if not isinstance(binary, bytes) or not isinstance(fields, dict):
        return None
    constants = getattr(getattr(kernel, "src", None), "constants", None)
    described = {
        "metadata": {k: v for k, v in fields.items() if k not in NOT_LAUNCHED},
        "constants": sorted((repr(k), repr(v)) for k, v in (constants or {}).items()),
        "meta": sorted((k, repr(v)) for k, v in meta.items()),
    }
    return hashlib.sha256(binary).hexdigest(), json.dumps(described, sort_keys=True, default=repr)


def mergeable(autotuner: Any) -> bool:
    """Whether a tune of ``autotuner`` may time identical kernels once: not when it has its own
    ``do_bench=`` (a measure of the user's: it may time more than the kernel) or a
    ``pre_hook``/``post_hook`` of the user's (it sees every config's ``num_stages``: it may do
    something else for each)."""
    return (
        getattr(autotuner, "_do_bench", None) is None
        and not getattr(autotuner, "user_defined_pre_hook", True)
        and not getattr(autotuner, "user_defined_post_hook", True)
    )


def config_mergeable(config: Any) -> bool:
    """Whether ``config`` may share a timing: not with a ``pre_hook`` (or a ``post_hook``) of its
    own, which runs around each of its launches and may differ from another config's."""
    return (
        config is not None
        and getattr(config, "pre_hook", None) is None
        and getattr(config, "post_hook", None) is None
    )
