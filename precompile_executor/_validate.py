"""Validation of what every executor here takes: per-task settings, and calls that must pickle
(one message per mistake, naming the culprit)."""

from __future__ import annotations

import importlib
import importlib.metadata
import math
from collections.abc import Mapping
from typing import Any, Literal

import cloudpickle


def check_timeout(value: object, name: str = "timeout") -> float | None:
    """A timeout in seconds (finite, > 0) or ``None`` (no limit; an infinite one is refused
    rather than read as ``None``, so a NaN or inf computed by mistake does not pass unseen)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(
            f"{name} must be a finite number of seconds (None for no limit), got {value!r}"
        )
    if not value > 0:
        raise ValueError(f"{name} must be > 0 seconds (or None for no limit), got {value!r}")
    return float(value)


def check_priority(value: object) -> float:
    """A priority: any number but NaN (higher starts first; a NaN compares false with every
    priority, so the queue's heap would no longer order the tasks around it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"priority must be a number, got {value!r}")
    if math.isnan(value):
        raise ValueError("priority must be a number, not NaN")
    return float(value)


def check_cost(value: object) -> float | None:
    """A cost hint: seconds >= 0, or ``None`` for none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"cost must be a number of seconds or None, got {value!r}")
    if not value >= 0:
        raise ValueError(f"cost must be >= 0 seconds, got {value!r}")
    return float(value)


def check_path(value: object) -> Literal["spawn", "fork", "auto"]:
    """A task's path: ``"spawn"``, ``"fork"`` or ``"auto"``."""
    if value not in ("spawn", "fork", "auto"):
        raise ValueError(f"path must be one of 'spawn', 'fork' or 'auto', got {value!r}")
    return value


def check_count(value: object, name: str, minimum: int, *, optional: bool = False) -> int | None:
    """An ``int`` setting >= ``minimum`` (``max_workers``, ``spare_workers``); ``None`` passes
    where ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        more = " or None" if optional else ""
        raise TypeError(f"{name} must be an int >= {minimum}{more}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_initializer(initializer: object, initargs: object, classify: object) -> None:
    """The settings every backend takes: ``initializer``, ``initargs``, ``classify``."""
    if initializer is not None and not callable(initializer):
        raise TypeError(f"initializer must be callable or None, got {initializer!r}")
    if not isinstance(initargs, tuple):
        raise TypeError(f"initargs must be a tuple, got {type(initargs).__name__}")
    if classify is not None and not callable(classify):
        raise TypeError(f"classify must be callable or None, got {classify!r}")


def check_chunksize(value: object) -> int:
    """``map``'s ``chunksize``: an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"chunksize must be an int >= 1, got {value!r}")
    return value


def check_buffersize(value: object) -> int | None:
    """``map``'s ``buffersize`` (Python 3.14's meaning): an int >= 1, or ``None`` for none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"buffersize must be an int >= 1 or None, got {value!r}")
    if value < 1:
        raise ValueError(f"buffersize must be >= 1 (or None: submit everything), got {value!r}")
    return value


def check_flag(value: object, name: str) -> bool:
    """A ``bool`` setting (``with_output``, ``ignore_errors``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def describe_unpicklable(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Name the first of ``fn``, ``args`` and ``kwargs`` that cloudpickle cannot serialize."""
    candidates: list[tuple[str, Any]] = [("the callable", fn)]
    candidates += [(f"positional argument {i}", a) for i, a in enumerate(args)]
    candidates += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for what, obj in candidates:
        try:
            cloudpickle.dumps(obj)
        except Exception as exc:  # noqa: BLE001
            return f"{what} {short_repr(obj)} ({type(obj).__qualname__}): {exc}"
    return "the call"


def short_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001
        text = object.__repr__(obj)
    return text if len(text) <= 80 else text[:77] + "..."


def check_max_tasks_per_child(value: object) -> int | None:
    """``max_tasks_per_child`` as the stdlib's ``ProcessPoolExecutor`` takes it: an int >= 1, or
    ``None`` (workers live on). A ``bool`` is refused, unlike the stdlib, as for every count
    here: ``True`` is surely a mistake."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_tasks_per_child must be an integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"max_tasks_per_child must be >= 1, got {value}")
    return value


def check_memory_limit(value: object) -> int | None:
    """A memory limit in bytes (> 0), or ``None`` for none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"memory_limit must be a number of bytes or None, got {value!r}")
    if not value >= 1:
        raise ValueError(
            f"memory_limit must be >= 1 byte (e.g. 2 * 1024**3 for 2 GiB; None for no limit), "
            f"got {value!r}"
        )
    return int(value)


def check_resources(value: object, name: str = "resources") -> tuple[tuple[str, float], ...]:
    """``{"GPU": 1}``-style amounts a node must have, as a sorted tuple (hashable)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of resource name -> amount, got {value!r}")
    items: list[tuple[str, float]] = []
    for key, amount in value.items():
        if not isinstance(key, str):
            raise TypeError(f"{name} names must be strings, got {key!r}")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise ValueError(f"{name}[{key!r}] must be a number >= 0, got {amount!r}")
        items.append((key, float(amount)))
    return tuple(sorted(items))


def installed_version(distribution: str) -> str:
    """The installed version of ``distribution`` (e.g. ``"3.6.0"``), from its metadata, else
    from the module's ``__version__`` (a source checkout has no metadata)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return str(importlib.import_module(distribution).__version__)


def release_series(version: str) -> str:
    """``"major.minor"`` of a version string: ``"2.13.0+cpu"`` → ``"2.13"``."""
    return ".".join(version.split("+")[0].split(".")[:2])
