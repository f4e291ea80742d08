"""How a ``@triton.jit`` function travels to a worker process.

A ``JITFunction`` does not pickle (it holds an ``RLock`` and per-device caches), so a compile
request carries a :class:`KernelRef` instead:

* **by reference** — the module name and qualified name. The worker imports the module and takes
  the attribute, unwrapping ``@triton.autotune``/``@triton.heuristics`` wrappers. This is the
  faithful path for kernels defined at module level in an importable module.
* **by source** — the function's source lines, the file name and first line they came from, and
  the global (or closed-over) names the body uses, each value encoded as plain data: modules by
  name, other Triton functions as nested :class:`KernelRef`, anything else as itself (it must
  pickle). The worker rebuilds the function with the same file name and line numbers, so Triton
  computes the same ``cache_key`` and embeds the same line info. This covers kernels defined in
  ``__main__``, inside a function, or in a file loaded by path.

The caller ships both when it can. The worker tries the reference first and keeps it only if the
imported kernel's ``cache_key`` equals the caller's (same source, same dependencies, same constexpr
globals); otherwise it rebuilds from source, and the functions the kernel calls too. Either way the
worker compiles exactly the kernel the caller hashed, or fails with :class:`KernelTransferError`.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import dataclasses
import importlib
import inspect
import linecache
import os
import sys
import textwrap
import threading
import types
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

import cloudpickle
import triton
from triton.runtime.jit import JITCallable, JITFunction

from ._errors import KernelTransferError

LoadedBy = Literal["reference", "source"]
"""How a worker obtained a kernel."""

_IDENTITY_DECORATOR = "__precompile_executor_identity__"
"""Name bound to ``lambda f: f`` in a rebuilt kernel's namespace; it stands in for the original
decorators so that the rebuilt code object starts on the same line as the original."""

_FUTURE_FLAGS = 0
for _feature_name in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature_name).compiler_flag


@dataclasses.dataclass(frozen=True)
class ModuleRef:
    """A module, sent by name and imported in the worker."""

    name: str


@dataclasses.dataclass(frozen=True)
class CallableRef:
    """A Triton callable that is not a ``JITFunction`` (e.g. a ``constexpr_function``), sent by
    reference only."""

    module: str
    qualname: str


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """Everything needed to rebuild a ``JITFunction`` from its source in another process.

    Attributes:
        filename: the file the function was defined in (kept for line info and ``cache_key``).
        first_line: the line of the first decorator (or of ``def``), as ``inspect`` reports it.
        lines: the source lines from ``first_line`` to the end of the function, decorators
            included, exactly as the caller's ``inspect.getsourcelines`` returned them.
        names: the global and closed-over names the function uses, encoded for transport.
        future_flags: the ``from __future__`` compiler flags the function was compiled with.
        jit_options: the ``triton.jit`` keyword arguments that affect compilation.
    """

    filename: str
    first_line: int
    lines: tuple[str, ...]
    names: Mapping[str, Any]
    future_flags: int
    jit_options: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class KernelRef:
    """A picklable stand-in for a ``JITFunction``.

    Attributes:
        module: the function's ``__module__``.
        qualname: the function's ``__qualname__``.
        cache_key: the caller's ``JITFunction.cache_key``; the worker's copy must match it.
        source: the function's source, or ``None`` where it could not be captured.
        source_error: why the source could not be captured, for error messages.
        importable: whether the worker may import ``module`` to find it. ``False`` for a kernel
            of a package that calls kernels while it imports (:func:`imports_that_launch`): the
            worker rebuilds it from source, never running that import.
    """

    module: str
    qualname: str
    cache_key: str
    source: KernelSource | None
    source_error: str = ""
    importable: bool = True

    @property
    def name(self) -> str:
        """``module.qualname``, for messages."""
        return f"{self.module}.{self.qualname}"


_refs: weakref.WeakKeyDictionary[Any, KernelRef] = weakref.WeakKeyDictionary()
_refs_lock = threading.Lock()

_launching_imports: set[str] = set()
"""Modules (and packages) seen being imported while one of their kernels was sent to a worker:
their import runs kernels, so no worker imports them (caller side; see ``imports_that_launch``)."""


def imports_that_launch() -> frozenset[str]:
    """Return the modules this process has seen calling kernels while they import.

    A library that warms its kernels at import time calls them while its module (or a package
    above it) is still being imported. A worker that imported that module to find the kernel
    would run those calls again — a stock autotune of its own, a GPU context, or, if the library
    also opens ``precompile_executor.triton.autotune``, compiles sent on from inside a worker.
    So a kernel sent while its module or a parent package is initializing is sent by source
    only, and every later kernel under those names too.
    """
    with _refs_lock:
        return frozenset(_launching_imports)


def initializing_modules(module: str) -> set[str]:
    """Return ``module`` and the packages above it that are being imported right now."""
    names = set()
    parts = module.split(".")
    for end in range(1, len(parts) + 1):
        name = ".".join(parts[:end])
        spec = getattr(sys.modules.get(name), "__spec__", None)
        if spec is not None and getattr(spec, "_initializing", False):
            names.add(name)
    return names


def launches_at_import(module: str) -> str:
    """Return the name among ``module`` and its packages known to call kernels while they
    import (``""``: none)."""
    parts = module.split(".")
    with _refs_lock:
        for end in range(1, len(parts) + 1):
            name = ".".join(parts[:end])
            if name in _launching_imports:
                return name
    return ""


def unwrap_jit_function(kernel: Any) -> Any:
    """Return the ``JITFunction`` under ``@triton.autotune``/``@triton.heuristics`` wrappers.

    Raises:
        TypeError: ``kernel`` is not a Triton kernel.
    """
    seen = 0
    obj = kernel
    while not isinstance(obj, JITFunction):
        inner = getattr(obj, "fn", None)
        seen += 1
        if inner is None or seen > 16:
            raise TypeError(
                f"{kernel!r} is not a @triton.jit kernel (nor an autotune/heuristics wrapper of "
                "one); pass the function that @triton.jit decorated"
            )
        obj = inner
    return obj


def kernel_ref(fn: Any) -> KernelRef:
    """Return the :class:`KernelRef` that sends ``fn`` to a worker.

    Args:
        fn: a ``JITFunction``.

    Raises:
        KernelTransferError: ``fn`` cannot be imported by name in another process and its source
            cannot be captured either.
    """
    importing = initializing_modules(fn.fn.__module__)
    with _refs_lock:
        _launching_imports.update(importing)
        cached = _refs.get(fn)
    cache_key = fn.cache_key
    if cached is not None and cached.cache_key == cache_key:
        return cached
    ref = _make_ref(fn, cache_key, active=set())
    with _refs_lock:
        _refs[fn] = ref
    return ref


def _make_ref(fn: Any, cache_key: str, active: set[int]) -> KernelRef:
    module = fn.fn.__module__
    qualname = fn.fn.__qualname__
    active.add(id(fn))
    try:
        source: KernelSource | None = _capture_source(fn, active)
        error = ""
    except KernelTransferError as exc:
        source, error = None, str(exc)
    finally:
        active.discard(id(fn))
    why_not = _why_not_importable(fn)
    if source is None and why_not:
        raise KernelTransferError(
            f"cannot send kernel {module}.{qualname} to a worker: it is not importable by name "
            f"({why_not}) and {error}. Define it at module level in an importable module, or "
            "make the globals it uses picklable."
        )
    return KernelRef(
        module, qualname, cache_key, source, error, importable=not launches_at_import(module)
    )


def _why_not_importable(fn: Any) -> str:
    module, qualname = fn.fn.__module__, fn.fn.__qualname__
    if module == "__main__":
        return "it is defined in __main__"
    if "<locals>" in qualname:
        return "it is defined inside a function"
    launching = launches_at_import(module)
    if launching:
        return f"importing {launching} calls kernels (imports_that_launch())"
    loaded = sys.modules.get(module)
    if loaded is None or getattr(loaded, "__spec__", None) is None:
        return f"module {module} was not imported through the import system"
    try:
        found = unwrap_jit_function(_resolve(loaded, qualname))
    except Exception as exc:
        return f"{module}.{qualname} does not resolve: {type(exc).__name__}: {exc}"
    if found is not fn:
        return f"{module}.{qualname} names a different object"
    return ""


def _resolve(module: types.ModuleType, qualname: str) -> Any:
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _capture_source(fn: Any, active: set[int]) -> KernelSource:
    func = fn.fn
    try:
        lines, first_line = inspect.getsourcelines(func)
    except (OSError, TypeError) as exc:
        raise KernelTransferError(f"its source is not available ({exc})") from exc
    code = func.__code__
    names: dict[str, Any] = {}
    scope = dict(func.__globals__)
    if func.__closure__:
        for name, cell in zip(code.co_freevars, func.__closure__, strict=True):
            scope[name] = cell.cell_contents
    for name in sorted(_referenced_names(lines, code)):
        if name == func.__name__ or name not in scope:
            continue  # the function itself is bound by the rebuild; the rest are builtins/locals
        names[name] = _encode_value(name, scope[name], active)
    jit_options = {
        "do_not_specialize": list(getattr(fn, "do_not_specialize", []) or []),
        "do_not_specialize_on_alignment": list(
            getattr(fn, "do_not_specialize_on_alignment", []) or []
        ),
        "debug": getattr(fn, "debug", None),
        "noinline": getattr(fn, "noinline", None),
    }
    return KernelSource(
        filename=code.co_filename,
        first_line=first_line,
        lines=tuple(lines),
        names=names,
        future_flags=code.co_flags & _FUTURE_FLAGS,
        jit_options=jit_options,
    )


def _referenced_names(lines: list[str], code: types.CodeType) -> set[str]:
    """Return the names the function may read from its globals or closure."""
    found: set[str] = set(code.co_freevars)
    stack = [code]
    while stack:
        current = stack.pop()
        found.update(current.co_names)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    # Default values and annotations are evaluated outside the function's code object.
    tree = ast.parse(textwrap.dedent("".join(lines)))
    func_def = tree.body[0]
    if isinstance(func_def, ast.FunctionDef | ast.AsyncFunctionDef):
        for node in ast.walk(func_def.args):
            if isinstance(node, ast.Name):
                found.add(node.id)
    return found


def _encode_value(name: str, value: Any, active: set[int]) -> Any:
    if isinstance(value, types.ModuleType):
        return ModuleRef(value.__name__)
    if isinstance(value, JITFunction):
        if id(value) in active:
            # Mutual recursion: send the inner reference by name only.
            return KernelRef(value.fn.__module__, value.fn.__qualname__, value.cache_key, None)
        return _make_ref(value, value.cache_key, active)
    if isinstance(value, JITCallable):
        return CallableRef(value.fn.__module__, value.fn.__qualname__)
    try:
        cloudpickle.dumps(value)
    except Exception as exc:
        raise KernelTransferError(
            f"the global {name!r} ({type(value).__name__}) does not pickle: {exc}"
        ) from exc
    return value


_loaded: dict[tuple[str, str, str], tuple[Any, LoadedBy]] = {}
"""Kernels this process has loaded, by (module, qualname, the caller's cache_key)."""
_verified: set[tuple[str, str, str]] = set()
"""The subset of ``_loaded`` whose own ``cache_key`` has been checked against the caller's."""
_loaded_lock = threading.RLock()


def load_kernel(ref: KernelRef) -> tuple[Any, LoadedBy]:
    """Return the ``JITFunction`` that ``ref`` describes, and how it was obtained (worker side).

    The reference is tried first, then the source. Either is kept only if the kernel's
    ``cache_key`` equals the caller's: then its source and everything it depends on are the
    caller's, and it compiles into the cache entry the caller will look up.

    Raises:
        KernelTransferError: neither way gives a kernel whose ``cache_key`` equals the caller's.
    """
    key = (ref.module, ref.qualname, ref.cache_key)
    with _loaded_lock:
        if key in _verified:
            return _loaded[key]
        reasons: list[str] = []
        if key in _loaded:  # loaded earlier as another kernel's dependency, not yet checked
            candidates = [_loaded[key]]
        else:
            candidates = []
            imported = _import(ref, reasons)
            if imported is not None:
                candidates.append((imported, "reference"))
        for fn, how in candidates:
            if _has_cache_key(fn, ref.cache_key):
                return _remember(key, fn, how)
            reasons.append(f"the {how} copy differs from the caller's (edited since?)")
        if ref.source is not None and not any(how == "source" for _, how in candidates):
            fn = _rebuild(ref, ref.source)
            if _has_cache_key(fn, ref.cache_key):
                return _remember(key, fn, "source")
            reasons.append(
                "rebuilt from source it hashes differently (a global it uses may not have "
                "travelled faithfully)"
            )
        if ref.source_error:
            reasons.append(f"its source could not be sent ({ref.source_error})")
        raise KernelTransferError(
            f"cannot load kernel {ref.name} in worker process {os.getpid()}: "
            + "; ".join(reasons or ["no way to send it"])
            + ". Define it at module level in a module the worker can import."
        )


def _import(ref: KernelRef, reasons: list[str]) -> Any:
    if ref.module == "__main__" or "<locals>" in ref.qualname:
        return None
    if not ref.importable:
        reasons.append(f"its module {ref.module} calls kernels while it imports: not imported")
        return None
    try:
        return unwrap_jit_function(_resolve(importlib.import_module(ref.module), ref.qualname))
    except Exception as exc:
        reasons.append(f"importing it failed ({type(exc).__name__}: {exc})")
        return None


def _remember(key: tuple[str, str, str], fn: Any, how: LoadedBy) -> tuple[Any, LoadedBy]:
    _loaded[key] = (fn, how)
    _verified.add(key)
    return fn, how


def _has_cache_key(fn: Any, expected: str) -> bool:
    """Return whether ``fn.cache_key`` is ``expected``, in either order of computation.

    Up to Triton 3.6, a kernel's key includes the constexpr globals of the functions it calls
    only if their keys were computed before its own, so the same kernel can have two keys
    depending on what ran first. If the first computation disagrees, compute the key again now
    that every dependency's key is known.
    """
    if fn.cache_key == expected:
        return True
    fn.hash = None  # JITCallable caches its key here; forget it to recompute
    fn.used_global_vals = {}
    return bool(fn.cache_key == expected)


def _load_dependency(ref: KernelRef) -> Any:
    """Load a function another kernel calls, without checking its key yet.

    Its key is part of the caller's key, so checking the caller checks it; computing it now
    would change the order of computation that ``_has_cache_key`` has to match. The caller's own
    source is preferred: an importable copy may have been edited since.
    """
    key = (ref.module, ref.qualname, ref.cache_key)
    with _loaded_lock:
        if key in _loaded:
            return _loaded[key][0]
        how: LoadedBy
        if ref.source is not None:
            fn, how = _rebuild(ref, ref.source), "source"
        else:
            fn, how = _import(ref, []), "reference"
            if fn is None:
                return load_kernel(ref)[0]  # raises the full explanation
        _loaded[key] = (fn, how)
        return fn


def _decode_value(value: Any) -> Any:
    if isinstance(value, ModuleRef):
        return importlib.import_module(value.name)
    if isinstance(value, KernelRef):
        return _load_dependency(value)
    if isinstance(value, CallableRef):
        return _resolve(importlib.import_module(value.module), value.qualname)
    return value


def _rebuild(ref: KernelRef, source: KernelSource) -> Any:
    namespace: dict[str, Any] = {"__name__": ref.module, "__builtins__": builtins}
    for name, value in source.names.items():
        namespace[name] = _decode_value(value)
    namespace[_IDENTITY_DECORATOR] = _identity
    tree = ast.parse(textwrap.dedent("".join(source.lines)))
    func_def = tree.body[0]
    if not isinstance(func_def, ast.FunctionDef):
        raise KernelTransferError(f"the source sent for {ref.name} is not a function definition")
    if func_def.decorator_list:
        first = func_def.decorator_list[0]
        # One stand-in decorator on the first decorator's line: the code object then starts on
        # that line, as the original did, and the originals (autotune, jit) are not re-run.
        func_def.decorator_list = [
            ast.copy_location(ast.Name(id=_IDENTITY_DECORATOR, ctx=ast.Load()), first)
        ]
    ast.increment_lineno(tree, source.first_line - 1)
    ast.fix_missing_locations(tree)
    code = compile(tree, source.filename, "exec", flags=source.future_flags, dont_inherit=True)
    padded = ["\n"] * (source.first_line - 1) + list(source.lines)
    with _source_lines(source.filename, padded):
        exec(code, namespace)
        func = namespace[func_def.name]
        func.__qualname__ = ref.qualname
        options = dict(source.jit_options)
        options = {k: v for k, v in options.items() if v not in (None, [])}
        return triton.jit(**options)(func)


def _identity(fn: Any) -> Any:
    return fn


@contextmanager
def _source_lines(filename: str, lines: list[str]) -> Iterator[None]:
    """Make ``inspect`` see ``lines`` as the content of ``filename`` for the duration."""
    previous = linecache.cache.get(filename)
    # An mtime of None marks the entry as not backed by a file: checkcache leaves it alone.
    linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    try:
        yield
    finally:
        if previous is None:
            linecache.cache.pop(filename, None)
        else:
            linecache.cache[filename] = previous
