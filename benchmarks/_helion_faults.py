"""Faults injected into Helion configs for the GPU runs (importable by spawn workers).

:func:`inject_fault` makes every ``every``-th config that Helion serialises for spawn-mode
precompile fault when it runs: the generated module's function is wrapped so that it first calls
one of the functions below. Helion's own benchmarking runs the parent's unwrapped function, so a
faulted config fails its precompile only — exactly as a config that faults on its own would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import triton
import triton.language as tl

HANG_CYCLES = 10**12
"""GPU clock cycles ``torch.cuda._sleep`` spins: minutes on any GPU, far past any timeout."""


def segfault() -> None:
    """Crash the process with SIGSEGV (a read of address 0)."""
    import ctypes

    ctypes.string_at(0)


def hang() -> None:
    """Keep the GPU busy for minutes: a kernel that does not finish."""
    import torch

    torch.cuda._sleep(HANG_CYCLES)
    torch.cuda.synchronize()


def illegal_memory_access() -> None:
    """Store far outside any allocation: a sticky 'illegal memory access' CUDA error."""
    import torch

    buf = torch.zeros(1, device="cuda")
    oob_store[(1,)](buf, 1 << 40)
    torch.cuda.synchronize()


@triton.jit
def oob_store(ptr, offset):
    """Store one value ``offset`` elements past ``ptr``."""
    tl.store(ptr + offset, 1.0)


FAULTS = ("segfault", "hang", "illegal_memory_access")


@contextlib.contextmanager
def inject_fault(kind: str, *, every: int = 3) -> Iterator[None]:
    """While active, every ``every``-th spawn-mode config (the 1st, the ``every+1``-th, ...)
    runs ``benchmarks._helion_faults.<kind>()`` before its kernel."""
    if kind not in FAULTS:
        raise ValueError(f"unknown fault {kind!r}; one of {sorted(FAULTS)}")
    from helion.autotuner import precompile_future

    real = precompile_future._serialize_compiled_fn
    counter = itertools.count()

    def serialize(fn: Any) -> Any:
        spec = real(fn)
        if next(counter) % every:
            return spec
        name = spec.function_name
        wrapper = (
            f"\n\n_pe_unfaulted_{name} = {name}\n"
            f"def {name}(*args, **kwargs):\n"
            f"    import benchmarks._helion_faults as _faults\n"
            f"    _faults.{kind}()\n"
            f"    return _pe_unfaulted_{name}(*args, **kwargs)\n"
        )
        return dataclasses.replace(spec, source_code=spec.source_code + wrapper)

    precompile_future._serialize_compiled_fn = serialize
    try:
        yield
    finally:
        precompile_future._serialize_compiled_fn = real
