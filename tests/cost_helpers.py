"""Tasks with known costs for the ordering tests (importable by workers)."""

from __future__ import annotations

import time

from precompile_executor import Estimate, estimated_cost


@estimated_cost(lambda label, hint: hint)
def hinted(label: str, hint: float) -> str:
    """Return ``label`` at once; its estimator says it costs ``hint`` seconds."""
    return label


@estimated_cost(lambda label, hint: Estimate(seconds=hint, features={"label": label}))
def hinted_features(label: str, hint: float) -> str:
    return label


def sleep_for(seconds: float) -> float:
    """Sleep ``seconds`` and return them: a task whose cost the history learns."""
    time.sleep(seconds)
    return seconds


def broken_estimate(x: int) -> int:
    return x


def _raise(*args: object) -> float:
    raise RuntimeError("estimator bug")


broken_estimate.__precompile_cost__ = _raise  # type: ignore[attr-defined]
