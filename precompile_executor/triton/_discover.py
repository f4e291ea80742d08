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

    A file is imported under its stem, with its directory put first on ``sys.path`` as
    ``python FILE`` would, so it can import its neighbours.

    Raises:
        SpecsError: there is no such file or module, or importing it raised.
    """
    path = Path(file_or_module)
    if file_or_module.endswith(".py") or path.exists():
        if not path.is_file():
            raise SpecsError(f"no such file: {file_or_module}")
        return _load_file(path.resolve())
    try:
        return importlib.import_module(file_or_module)
    except ModuleNotFoundError as exc:
        if exc.name and file_or_module.startswith(exc.name):
            raise SpecsError(f"no such file or module: {file_or_module}") from None
        raise SpecsError(f"importing {file_or_module} failed: {exc}") from exc
    except Exception as exc:
        raise SpecsError(f"importing {file_or_module} failed: {type(exc).__name__}: {exc}") from exc


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
