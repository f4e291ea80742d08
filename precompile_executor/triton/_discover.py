"""Find what to warm in a file or module: the ``PRECOMPILE_SPECS`` convention.

A module opts in by defining, at module level::

    PRECOMPILE_SPECS = {
        "matmul_kernel": [launch(a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride())],
    }

mapping the *name* of each kernel (an ``@triton.autotune`` kernel, or a plain ``@triton.jit``
one, which has a single config) to the launches to warm it for: :func:`~._warm.launch` objects,
or tuples of positional arguments, with :class:`~._warm.TensorSpec` for tensors.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from triton.runtime.autotuner import Autotuner

from ._kernel_ref import unwrap_jit_function
from ._warm import Launch

SPECS_ATTRIBUTE = "PRECOMPILE_SPECS"
"""The module attribute that lists what to warm."""


class SpecsError(ValueError):
    """A file or module cannot be warmed; the message says what to change."""


def load_module(file_or_module: str) -> types.ModuleType:
    """Import a Python file (by path) or a module (by dotted name).

    A file of a package (its directory, and each above it up to the package's top, holds an
    ``__init__.py``) is imported by its dotted name, with the top package's parent directory
    put first on ``sys.path``, as ``python -m`` from there would: its relative imports work
    (its own directory follows, so absolute imports of its neighbours work as for a file).
    Any other file is imported under its stem, with its directory put first on ``sys.path`` as
    ``python FILE`` would, so it can import its neighbours.

    Raises:
        SpecsError: there is no such file or module, or importing it raised.
    """
    path = Path(file_or_module)
    if file_or_module.endswith(".py") or path.exists():
        if not path.is_file():
            raise SpecsError(f"no such file: {file_or_module}")
        path = path.resolve()
        found = _in_package(path)
        if found is None:
            return _load_file(path)
        dotted, root = found
        for directory in (str(path.parent), root):  # then `import neighbour` works too
            if directory not in sys.path:
                sys.path.insert(0, directory)
        module = _import(dotted, shown=str(path))
        if Path(getattr(module, "__file__", "") or "").resolve() != path:
            raise SpecsError(
                f"{path} is the module {dotted}, but {dotted} comes from {module.__file__} in "
                f"this process: warm that module by name, or this file from another directory"
            )
        return module
    return _import(file_or_module, shown=file_or_module)


def _import(name: str, shown: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise SpecsError(f"no such file or module: {shown}") from None
        raise SpecsError(f"importing {shown} failed: {exc}") from exc
    except Exception as exc:
        raise SpecsError(f"importing {shown} failed: {type(exc).__name__}: {exc}") from exc


def _in_package(path: Path) -> tuple[str, str] | None:
    """``path``'s module name within its package and the directory that holds the package's
    top (``None``: not in a package, or a name on the way up is not an identifier)."""
    parts = [] if path.stem == "__init__" else [path.stem]
    directory = path.parent
    while (directory / "__init__.py").is_file():
        parts.insert(0, directory.name)
        directory = directory.parent
    if len(parts) < 2 and path.stem != "__init__":
        return None  # a file beside no __init__.py: imported as a file
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts), str(directory)


def _load_file(path: Path) -> types.ModuleType:
    name = path.stem if path.stem.isidentifier() else "precompile_executor_warm_target"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) != str(path):
        name = f"precompile_executor_warm_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SpecsError(f"{path} is not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    directory = str(path.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise SpecsError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def find_specs(module: types.ModuleType) -> dict[Any, list[Launch | Sequence[Any]]]:
    """Return kernel to launches, as ``module.PRECOMPILE_SPECS`` declares them.

    Raises:
        SpecsError: the module declares no specs (naming the autotuned kernels it has, if any),
            or the specs name something that is not a Triton kernel of the module, or a kernel
            has no launches.
    """
    where = getattr(module, "__file__", None) or module.__name__
    declared = getattr(module, SPECS_ATTRIBUTE, None)
    if declared is None:
        tuned = sorted(n for n, v in vars(module).items() if isinstance(v, Autotuner))
        if not tuned:
            raise SpecsError(f"no @triton.autotune kernels found in {where}")
        raise SpecsError(
            f"{where} has autotuned kernels ({', '.join(tuned)}) but no {SPECS_ATTRIBUTE}: add "
            f"{SPECS_ATTRIBUTE} = {{{tuned[0]!r}: [launch(...)]}} (see docs/triton.md)"
        )
    if not isinstance(declared, dict) or not declared:
        raise SpecsError(
            f"{SPECS_ATTRIBUTE} in {where} must be a non-empty dict of kernel name to launches"
        )
    specs: dict[Any, list[Launch | Sequence[Any]]] = {}
    for name, launches in declared.items():
        kernel = getattr(module, name, None) if isinstance(name, str) else None
        if kernel is None:
            raise SpecsError(f"{SPECS_ATTRIBUTE} in {where} names {name!r}, which is not defined")
        try:
            unwrap_jit_function(kernel)
        except TypeError:
            raise SpecsError(
                f"{SPECS_ATTRIBUTE} in {where} names {name!r}, which is not a Triton kernel"
            ) from None
        if isinstance(launches, (Launch, str)) or not isinstance(launches, (list, tuple)):
            raise SpecsError(f"{SPECS_ATTRIBUTE}[{name!r}] in {where} must be a list of launches")
        items = list(launches)
        if not items or not all(isinstance(x, (Launch, tuple)) for x in items):
            raise SpecsError(
                f"{SPECS_ATTRIBUTE}[{name!r}] in {where} must list at least one launch(...) "
                "or tuple of arguments"
            )
        specs[kernel] = items
    return specs
