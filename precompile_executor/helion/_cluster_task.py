"""Fork mode on a cluster: one config's compile as a compile-only Triton task for a node.

A node cannot fork the autotuning process, so Helion's precompiler closure (``finish_it``, built
by ``runtime/precompile_shim.make_precompiler`` from this call's specialization) is taken apart
here, in the parent, into what ``triton.compile`` needs: the generated ``JITFunction``, its
signature, constexprs and attributes, the backend's options and the target of the caller's
device (``fn.device_caches[device]``: never a node's). :func:`submit` sends it as
``triton/_submit.submit_compile`` does for any kernel: the generated kernel travels by reference
or by source, the node compiles into a private cache, the files come back by value into this
process's ``TRITON_CACHE_DIR`` (while Helion autotunes, the temporary one its benchmark
subprocess reads, as a fork child's do), and a compile whose node was lost is sent again.

What ``finish_it`` also does — store the kernel in the JIT's memory cache, flag
``_helion_compilation_success`` — it does only in the process that compiled; a fork child's copy
of memory is lost as a node's is, so the parent's memory stays as fork mode leaves it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from concurrent.futures import Executor
from typing import Any

from ._errors import UnsupportedHelionError

_CLOSURE_NAME = "finish_it"
_NEEDED = ("fn", "signature", "constexprs", "attrs", "target", "options")
"""What ``finish_it`` (Helion 1.5.1) closes over and the compile needs."""


@dataclasses.dataclass(frozen=True)
class ClusterCompile:
    """One config's compile as a node runs it: ``triton.compile(src, target, options)``.

    Attributes:
        src: the ``ASTSource`` of the generated kernel for this call's specialization.
        target: the ``GPUTarget`` of the caller's device.
        options: the backend's options, as a dict.
        env_vars: the caller's cache-invalidating environment variables.
        label: the config's decorator text, for messages.
    """

    src: Any
    target: Any
    options: dict[str, Any]
    env_vars: dict[str, str]
    label: str


def cluster_compile(precompiler: Any, label: str) -> ClusterCompile:
    """Take Helion's ``finish_it`` closure apart into a :class:`ClusterCompile`.

    Raises:
        UnsupportedHelionError: the closure does not capture what Helion 1.5.1's does.
    """
    from triton._C.libtriton import get_cache_invalidating_env_vars

    code = getattr(precompiler, "__code__", None)
    captured: dict[str, Any] = {}
    if code is not None and getattr(precompiler, "__name__", None) == _CLOSURE_NAME:
        cells = getattr(precompiler, "__closure__", None) or ()
        for name, cell in zip(code.co_freevars, cells, strict=False):
            with contextlib.suppress(ValueError):  # an empty cell has no contents
                captured[name] = cell.cell_contents
    missing = [name for name in _NEEDED if name not in captured]
    if missing or not hasattr(captured.get("options"), "__dict__"):
        lacking = ", ".join(missing) or "the backend's options"
        raise UnsupportedHelionError(
            f"Helion's precompiler {precompiler!r} does not capture {lacking} as Helion "
            "1.5.1's finish_it does: fork mode cannot send its compile to a cluster. Autotune "
            "with a local PrecompileExecutor."
        )
    fn = captured["fn"]
    src = fn.ASTSource(fn, captured["signature"], captured["constexprs"], captured["attrs"])
    return ClusterCompile(
        src,
        captured["target"],
        dict(vars(captured["options"])),
        dict(get_cache_invalidating_env_vars()),
        label,
    )


def submit(executor: Executor, task: ClusterCompile) -> Any:
    """Send ``task`` to ``executor`` (a cluster executor or a view of it); return the
    ``CompileJob`` (``job.future``: the ``CompiledKernel`` loaded from this process's cache)."""
    from ..triton._submit import submit_compile

    return submit_compile(executor, task.src, task.target, task.options, task.env_vars)
