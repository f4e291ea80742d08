"""A dry-run sm_90 GPU for Triton: everything up to the launch is Triton's own, no launch runs.

Tests install :class:`DryRunGPU` as Triton's active driver: binding, specialisation, the JIT's
caches and loading checks (its shared-memory limit is sm_90's, so Triton raises a real
``OutOfResources``) are Triton's, and a launch is only recorded. :class:`FakeTensor` is what the
JIT reads of a tensor argument.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from triton import knobs
from triton.runtime.driver import driver

from precompile_executor.triton import CompileOnlyDriver, parse_target

TARGET = "cuda:90"
SM90_MAX_SHARED_BYTES = 232448
"""The opt-in shared memory per block of an H100/H200 (227 KiB): what Triton checks at load."""


class FakeTensor:
    """What the JIT reads of a tensor argument: its dtype and a 16-byte-aligned address.

    ``zero_``, ``clone`` and ``copy_`` (what ``reset_to_zero``/``restore_value`` call) are
    recorded in ``log``.
    """

    def __init__(self, dtype: Any, log: list[str] | None = None) -> None:
        self.dtype = dtype
        self.log = log if log is not None else []

    def data_ptr(self) -> int:
        return 1 << 20

    def zero_(self) -> FakeTensor:
        self.log.append("zero_")
        return self

    def clone(self) -> FakeTensor:
        self.log.append("clone")
        return FakeTensor(self.dtype, self.log)

    def copy_(self, other: FakeTensor) -> FakeTensor:
        self.log.append("copy_")
        return self


class DryRunGPU(CompileOnlyDriver):
    """Triton's active driver for an sm_90 device: launches are recorded, never run.

    Each instance is a different device to the JIT, so no test sees another's in-memory kernels.
    """

    def __init__(self) -> None:
        super().__init__(parse_target(TARGET))
        self.device = f"dry-run-sm90-{uuid.uuid4().hex[:8]}"
        self.launches: list[dict[str, Any]] = []
        self.utils = _DryRunUtils()
        self.launcher_cls = self._launcher

    def _launcher(self, src: Any, metadata: Any) -> Callable[..., None]:
        names = src.fn.arg_names
        constants = {names[path[0]]: value for path, value in src.constants.items()}

        def launch(*_: Any) -> None:
            self.launches.append({**constants, "num_warps": metadata.num_warps})

        return launch


GPU = TypeVar("GPU", bound="DryRunGPU")


@contextlib.contextmanager
def installed(stand_in: GPU, cache_dir: str | Path, jits: Iterable[Any]) -> Iterator[GPU]:
    """``stand_in`` as Triton's active driver and ``cache_dir`` as Triton's cache while inside;
    on leaving, the driver before it back and each of ``jits``' in-memory kernels for the
    stand-in's device dropped (so no later test launches them)."""
    previous = driver.__dict__.get("_active")
    with knobs.cache.scope():
        knobs.cache.dir = str(cache_dir)
        driver.set_active(stand_in)
        try:
            yield stand_in
        finally:
            driver.set_active(previous)
            for jit in jits:
                jit.device_caches.pop(stand_in.device, None)


class _DryRunUtils:
    def get_device_properties(self, device: Any) -> dict[str, int]:
        return {"max_shared_mem": SM90_MAX_SHARED_BYTES, "multiprocessor_count": 132}

    def load_binary(self, name: str, kernel: Any, shared: int, device: Any) -> tuple[Any, ...]:
        return None, None, 32, 0, 1024  # module, function, registers, spills, max threads
