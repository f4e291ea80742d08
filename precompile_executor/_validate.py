"""Validation of the per-task settings every executor here takes (one message per mistake)."""

from __future__ import annotations


def check_timeout(value: object, name: str = "timeout") -> float | None:
    """A timeout in seconds (> 0) or ``None``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
    if not value > 0:
        raise ValueError(f"{name} must be > 0 seconds (or None for no limit), got {value!r}")
    return float(value)


def check_priority(value: object) -> float:
    """A priority: any number (higher starts first)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"priority must be a number, got {value!r}")
    return float(value)


def check_flag(value: object, name: str) -> bool:
    """A ``bool`` setting (``with_output``, ``ignore_errors``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value
