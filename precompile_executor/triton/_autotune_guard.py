"""Where each autotuned config compiled, per kernel, and the guard that is never silent about it.

A tune sends every pruned config to the workers, compiled for the arguments its launch will
have (``_warm.compile_configs``). If a launch's specialisation differs from the one the tune
reproduced — a hook this integration does not run, an argument that changes between the
submission and the launch — Triton finds no kernel under the launch's key and compiles the
config again, in this process: correct, but slower than stock, which compiles each config once.

The guard watches for that around each benchmark (:func:`jit_cache_keys` before and after):
a key the launch added to the JIT's memory cache for a config whose compile a worker was to
provide is a *miss*. The first miss of a kernel logs one WARNING naming the kernel and the
argument whose specialisation differs (:func:`differing_arguments`), and from then on the
kernel is tuned by stock Triton (:func:`goes_to_stock`): nothing is compiled twice again. The
tune that met the miss stops sending (its queued compiles are cancelled) and its remaining
configs compile here, as in stock Triton.

Per kernel, :func:`statistics` says how many configs compiled in workers, in caller lanes, on
the tune's thread, and failed; the records live in ``_state.STATE.compiles``
(``state.reset()`` forgets them). docs/triton.md, "Where each config compiled".

Threads: records are changed under ``STATE.lock``, by the tune's own thread.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ._kernel_ref import unwrap_jit_function
from ._state import STATE

logger = logging.getLogger("precompile_executor.triton.autotune")


@dataclasses.dataclass(frozen=True)
class KernelCompiles:
    """Where one autotuned kernel's configs compiled in this process, from
    :func:`precompile_executor.triton.autotune.statistics`.

    Attributes:
        kernel: the kernel, ``module.qualname`` of its ``@triton.jit`` function.
        tunes: tunes that went through the integration (a new tuning key each).
        workers: configs whose kernel a worker compiled and the launch used.
        lanes: configs a caller lane compiled (a thread of this process, beside the tune's
            thread): taken back from a queue no worker was ready for, then installed and used
            exactly as a worker's (``_lanes.py``; docs/triton.md, "Never slower than stock").
        caller: configs this process compiled through Triton's own launch, on the tune's thread:
            taken back from a queue no worker was ready for while no lane was free, not
            sendable, or missed (the launch specialised otherwise than the compile sent).
        failed: configs whose compile failed in a worker or a lane (a compiler error, a crash,
            a timeout); Triton handled each as it handles its own failures.
        cached: configs already in this process's caches: nothing to compile.
        identical: configs not timed because another config of the same tune compiled to an
            identical kernel (same binary and launch): they took its timing (docs/triton.md,
            "Identical kernels"). Counted in the fields above too, by where they compiled.
        screened: with screening (docs/triton.md, "Screening"), distinct kernels timed with the
            short budget.
        rescreened: of those, screened a second time, quietly, because compiles still ran during
            their first screen.
        timed_in_full: distinct kernels of screened tunes timed with Triton's full budget (the
            finalists and challengers).
        stock_tunes: tunes handed to stock Triton whole, after :attr:`stock_reason`.
        stock_reason: why this kernel's tunes go to stock Triton (the WARNING's text), else
            ``None``.
    """

    kernel: str
    tunes: int = 0
    workers: int = 0
    lanes: int = 0
    caller: int = 0
    failed: int = 0
    cached: int = 0
    identical: int = 0
    screened: int = 0
    rescreened: int = 0
    timed_in_full: int = 0
    stock_tunes: int = 0
    stock_reason: str | None = None


def kernel_name(autotuner: Any) -> str:
    """``module.qualname`` of the ``@triton.jit`` function under ``autotuner``."""
    fn = unwrap_jit_function(autotuner)
    inner = getattr(fn, "fn", None)
    qualname = getattr(inner, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    return f"{getattr(fn, 'module', None) or getattr(inner, '__module__', '?')}.{qualname}"


def _record(autotuner: Any) -> KernelCompiles:
    """The kernel's record (under ``STATE.lock``)."""
    jit = unwrap_jit_function(autotuner)
    found = STATE.compiles.get(jit)
    if found is None:
        found = STATE.compiles[jit] = KernelCompiles(kernel_name(autotuner))
    return found


def count(autotuner: Any, **added: int) -> None:
    """Add ``added`` (field name → number) to the kernel's record."""
    with STATE.lock:
        record = _record(autotuner)
        STATE.compiles[unwrap_jit_function(autotuner)] = dataclasses.replace(
            record, **{k: getattr(record, k) + v for k, v in added.items()}
        )


def goes_to_stock(autotuner: Any) -> bool:
    """Whether this kernel's tunes go to stock Triton (a miss was seen: see the module)."""
    with STATE.lock:
        record = STATE.compiles.get(unwrap_jit_function(autotuner))
    return record is not None and record.stock_reason is not None


def fall_back(autotuner: Any, reason: str) -> None:
    """Hand this kernel's tunes to stock Triton from now on; the first time, log ``reason`` as
    one WARNING (never again for this kernel)."""
    with STATE.lock:
        record = _record(autotuner)
        if record.stock_reason is not None:
            return
        STATE.compiles[unwrap_jit_function(autotuner)] = dataclasses.replace(
            record, stock_reason=reason
        )
    logger.warning("%s", reason)


def statistics() -> Mapping[str, KernelCompiles]:
    """Kernel name → :class:`KernelCompiles`, for every kernel tuned through the integration in
    this process (an immutable snapshot)."""
    with STATE.lock:
        return MappingProxyType({r.kernel: r for r in STATE.compiles.values()})


def jit_cache_keys(autotuner: Any) -> frozenset[tuple[Any, Any]]:
    """The (device, key) pairs in the JIT's memory caches of the kernel under ``autotuner``.

    ``JITFunction.device_caches`` maps a device to ``(kernel_cache, kernel_key_cache, target,
    backend, binder)`` in Triton 3.6 and 3.9; a launch that compiles adds its key to
    ``kernel_cache``.
    """
    jit = unwrap_jit_function(autotuner)
    caches = getattr(jit, "device_caches", None) or {}
    keys: set[tuple[Any, Any]] = set()
    for device, entry in list(caches.items()):
        kernel_cache = entry[0] if isinstance(entry, tuple) and entry else None
        if isinstance(kernel_cache, dict):
            keys.update((device, key) for key in list(kernel_cache))
    return frozenset(keys)


def differing_arguments(
    autotuner: Any,
    sent: tuple[Sequence[Any], Mapping[str, Any]],
    launched: tuple[Sequence[Any], Mapping[str, Any]],
) -> list[tuple[str, Any, Any]]:
    """The arguments whose specialisation differs between the compile sent and the launch:
    ``(name, sent's, launch's)``, each as Triton's binder specialises it
    (``native_specialize_impl``, Triton 3.6 and 3.9: the type, e.g. ``tensordesc<bf16[64,
    64]>``, and the attribute, e.g. ``"D"`` for divisible by 16). Empty where none differs (the
    difference is elsewhere: a heuristic's value, an option) or Triton cannot say."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:
        return []
    jit = unwrap_jit_function(autotuner)
    found = []
    for param in getattr(jit, "params", ()):
        values = []
        for args, kwargs in (sent, launched):
            if param.num < len(args):
                values.append(args[param.num])
            elif param.name in kwargs:
                values.append(kwargs[param.name])
        if len(values) != 2 or param.is_constexpr:
            continue
        try:
            specs = [
                native_specialize_impl(
                    BaseBackend,
                    value,
                    param.is_const,
                    not param.do_not_specialize,
                    not param.do_not_specialize_on_alignment,
                )
                for value in values
            ]
        except Exception:  # noqa: BLE001 - naming the argument is best effort
            continue
        if specs[0] != specs[1]:
            found.append((param.name, _shown(specs[0]), _shown(specs[1])))
    return found


def _shown(spec: Any) -> Any:
    """A specialisation as it reads best: its type alone when it has no attribute."""
    if isinstance(spec, tuple) and len(spec) == 2 and spec[1] is None:
        return spec[0]
    return spec
