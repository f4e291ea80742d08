"""A stand-in Triton driver that lets the JIT specialise and compile for a target with no GPU.

``JITFunction.run(..., warmup=True)`` — the path a real launch takes up to the compile — asks the
active driver for the current device, stream and target. With no GPU there is no active driver.
:func:`compile_only_driver` installs one that answers those three questions for an explicit
target and refuses anything else, so the JIT computes exactly the signature, specialisation,
constexprs, options and cache key a launch on that target would, and hands the compile to
``AsyncCompileMode``. Nothing is launched or loaded.

The driver is process-wide in Triton, so while it is installed (only while the warm-up submits its
compiles, not while they run) other threads of this process must not launch kernels.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from triton.runtime.driver import driver

from ._target import format_target

_swap_lock = threading.RLock()


class CompileOnlyDriver:
    """Answers the JIT's device, stream and target questions for one ``GPUTarget``.

    Attributes:
        target: the target compiles are for.
        device: the device key the JIT files its per-device caches under; not a real device.
    """

    def __init__(self, target: Any) -> None:
        """Create a driver for ``target``."""
        self.target = target
        self.device = f"precompile-executor:{format_target(target)}"

    def get_current_device(self) -> str:
        """Return the stand-in device key."""
        return self.device

    def get_current_stream(self, device: Any = None) -> int:
        """Return 0: no stream exists; nothing is launched."""
        return 0

    def get_current_target(self) -> Any:
        """Return the target compiles are for."""
        return self.target

    def is_active(self) -> bool:
        """Return True: this driver is installed on purpose."""
        return True

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(
            f"Triton asked the compile-only driver for {name!r} while warming kernels for "
            f"{format_target(self.target)}: that needs a real GPU. Warm-up must only compile; "
            "launch kernels after it has finished."
        )


@contextmanager
def compile_only_driver(target: Any) -> Iterator[CompileOnlyDriver]:
    """Install a :class:`CompileOnlyDriver` for ``target`` as Triton's active driver.

    The previous driver (or none) is restored on exit.
    """
    stand_in = CompileOnlyDriver(target)
    with _swap_lock:
        previous = driver.__dict__.get("_active")
        driver.set_active(stand_in)
        try:
            yield stand_in
        finally:
            driver.set_active(previous)


def forget_device(kernel: Any, device: str) -> None:
    """Drop the per-device JIT caches that warming under a stand-in device created."""
    caches = getattr(kernel, "device_caches", None)
    if isinstance(caches, dict):
        caches.pop(device, None)
