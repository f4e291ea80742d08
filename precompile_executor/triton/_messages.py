"""The two messages between caller and worker: a compile request and the compiled artifacts.

Both are frozen dataclasses of plain data (strings, numbers, bytes, tuples, dicts and
:class:`~._kernel_ref.KernelRef`), so they pickle with the standard library as well as with
cloudpickle, and neither side needs the other's Triton objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from triton.runtime.jit import JITFunction

from ._kernel_ref import KernelRef, LoadedBy, kernel_ref
from ._kernel_ref import load_kernel as _load_kernel


@dataclasses.dataclass(frozen=True)
class CompileRequest:
    """What a worker needs to run ``triton.compile(ASTSource(...), target, options)``.

    Attributes:
        kernel: the kernel to compile.
        signature: argument name to Triton type (``"*fp16"``, ``"i32"``, ``"constexpr"``).
        constexprs: argument path (a tuple of indices) to value; ``JITFunction`` values are
            :class:`KernelRef`.
        attrs: argument path to Triton attributes (``[["tt.divisibility", 16]]``).
        target: ``(backend, arch, warp_size)``.
        options: the backend options, as ``triton.compile`` takes them.
        env_vars: the caller's cache-invalidating environment variables; the worker compiles
            under them and hashes with them.
        expected_hash: the cache hash the caller computed; the worker's must match.
        caller_pid: the caller's process id; a task running in the caller's own process (a
            thread pool) compiles straight into the caller's cache.
    """

    kernel: KernelRef
    signature: Mapping[str, Any]
    constexprs: Mapping[tuple[int, ...], Any]
    attrs: Mapping[tuple[int, ...], Any]
    target: tuple[str, int | str, int]
    options: Mapping[str, Any]
    env_vars: Mapping[str, str]
    expected_hash: str
    caller_pid: int

    @property
    def description(self) -> str:
        """A short human-readable name: kernel, constexprs and the main options."""
        consts = ", ".join(
            f"{self._arg_name(path)}={_short(value)}" for path, value in self.constexprs.items()
        )
        opts = ", ".join(
            f"{k}={self.options[k]}"
            for k in ("num_warps", "num_stages", "num_ctas", "maxnreg")
            if self.options.get(k) is not None
        )
        return f"{self.kernel.qualname}[{', '.join(p for p in (consts, opts) if p)}]"

    def _arg_name(self, path: tuple[int, ...]) -> str:
        names = list(self.signature)
        head = names[path[0]] if path and path[0] < len(names) else "?"
        return head + "".join(f"[{i}]" for i in path[1:])


@dataclasses.dataclass(frozen=True)
class CompiledArtifacts:
    """The files of one Triton cache group, as bytes, and where they came from.

    Attributes:
        hash: the cache hash: the group belongs in ``get_cache_manager(hash)``.
        metadata_filename: the group's name, ``"<kernel>.json"``.
        files: file name (``"<kernel>.cubin"``, ``"<kernel>.json"``, …) to content.
        compile_time_s: seconds the worker spent in ``triton.compile``.
        worker_pid: the process that compiled.
        loaded_by: ``"reference"`` or ``"source"``: how the worker got the kernel.
        shared_memory_bytes: the kernel's static shared memory, from its metadata.
    """

    hash: str
    metadata_filename: str
    files: Mapping[str, bytes]
    compile_time_s: float
    worker_pid: int
    loaded_by: LoadedBy
    shared_memory_bytes: int = 0


def encode_constexprs(constants: Mapping[Any, Any]) -> dict[tuple[int, ...], Any]:
    """Return ``constants`` with every ``JITFunction`` value replaced by its ``KernelRef``."""
    return {tuple(path): _encode(value) for path, value in constants.items()}


def decode_constexprs(constants: Mapping[tuple[int, ...], Any]) -> dict[tuple[int, ...], Any]:
    """Undo :func:`encode_constexprs` (worker side)."""
    return {path: _decode(value) for path, value in constants.items()}


def _encode(value: Any) -> Any:
    if isinstance(value, JITFunction):
        return kernel_ref(value)
    if type(value) is tuple:
        return tuple(_encode(v) for v in value)
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, KernelRef):
        return _load_kernel(value)[0]
    if type(value) is tuple:
        return tuple(_decode(v) for v in value)
    return value


def _short(value: Any) -> str:
    inner = getattr(value, "value", value)  # tl.constexpr wraps its value
    if isinstance(inner, KernelRef):
        return inner.qualname
    text = str(inner)
    return text if len(text) <= 24 else text[:21] + "..."
