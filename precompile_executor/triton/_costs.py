"""The cost of a Triton compile: its features, a prior from its config, and where history lives.

:func:`compile_estimate` is the estimator of :func:`~._worker.compile_request` (see
:func:`precompile_executor.estimated_cost`): the executor calls it in the caller's process at
submit time, so :func:`~precompile_executor.triton.precompile`, :func:`~._warm.warm` and the
``AsyncCompileMode`` adapter order their batches longest first without being told anything.

* **history key**: ``triton:<module>.<kernel>``, and the config: its constexprs, ``num_warps``,
  ``num_stages``, ``num_ctas``, ``maxnreg``, the pointer element types and the target;
* **prior**: :func:`precompile_executor._costs.triton_prior_s` of the block-size constexprs
  (names containing ``BLOCK``) and ``num_warps``;
* **history file**: ``precompile_executor_costs.json`` in the directory that holds the caller's
  Triton cache directory (``~/.triton/precompile_executor_costs.json`` by default, beside
  ``~/.triton/cache``): beside it rather than inside, so clearing the cache keeps the history,
  and a per-run cache under one parent (as Helion's autotuner makes) shares it.
  ``PRECOMPILE_EXECUTOR_COST_HISTORY`` overrides the path; set it to an empty string to keep
  the history in memory only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from triton import knobs

from .._costs import Estimate, triton_prior_s
from ._messages import CompileRequest

HISTORY_FILE_NAME = "precompile_executor_costs.json"
HISTORY_ENV = "PRECOMPILE_EXECUTOR_COST_HISTORY"
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def history_path() -> str | None:
    """The cost history of Triton compiles for the caller's current Triton cache directory."""
    override = os.environ.get(HISTORY_ENV)
    if override is not None:
        return override or None
    try:
        cache_dir = knobs.cache.dir
    except Exception:  # noqa: BLE001 - no usable cache directory: learn in memory only
        return None
    if not cache_dir:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(cache_dir)), HISTORY_FILE_NAME)


def compile_estimate(request: CompileRequest) -> Estimate:
    """The :class:`~precompile_executor.Estimate` of one compile request."""
    names = list(request.signature)
    constexprs: dict[str, Any] = {}
    for path, value in request.constexprs.items():
        head = names[path[0]] if path and path[0] < len(names) else "?"
        name = head + "".join(f"[{i}]" for i in path[1:])
        inner = getattr(value, "value", value)  # tl.constexpr wraps its value
        if isinstance(inner, (bool, int, float, str)) or inner is None:
            constexprs[name] = inner
    options = {k: request.options.get(k) for k in _OPTIONS if request.options.get(k) is not None}
    dtypes = sorted({t[1:] for t in request.signature.values() if str(t).startswith("*")})
    features: dict[str, Any] = {**constexprs, **options}
    features["dtypes"] = "+".join(dtypes)
    features["target"] = ":".join(str(part) for part in request.target)
    prior = triton_prior_s(
        block_sizes(constexprs),
        num_warps=int(options.get("num_warps") or 4),
        num_stages=int(options.get("num_stages") or 3),
        dtype_bits=max((_bits(d) for d in dtypes), default=16),
    )
    return Estimate(
        seconds=prior,
        features=features,
        function=f"triton:{request.kernel.name}",
        history=history_path(),
    )


def block_sizes(values: Mapping[str, Any]) -> dict[str, int]:
    """The block-size constexprs among ``values`` (names containing ``BLOCK``, integer values):
    what :func:`~precompile_executor._costs.triton_prior_s` reads."""
    return {
        name: value
        for name, value in values.items()
        if "BLOCK" in name.upper() and isinstance(value, int) and not isinstance(value, bool)
    }


def _bits(dtype: str) -> int:
    digits = "".join(ch for ch in dtype if ch.isdigit())
    return int(digits) if digits else 16
