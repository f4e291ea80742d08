"""A cross-process GPU lease: Helion's measurements on a GPU exclude our workers' runs on it.

In spawn mode our workers run each config once on the GPU while Helion, streaming, already
measures the configs that landed. A measurement must see the GPU to itself, so both sides take a
lease on the physical device (by UUID, since pinned workers number their GPUs differently from
the parent):

* a worker's run of a config takes it **shared** (workers still run side by side, as Helion's own
  spawn mode does);
* each measurement takes it **exclusive** (no worker kernel runs while it holds it).

The lease is an ``fcntl.flock`` on a file per device in a private directory
(:func:`lease_dir`), so the kernel releases it when its holder dies, SIGKILL included. ``flock``
does not queue a waiting exclusive request ahead of new shared ones; a second lock, the
*turnstile*, gives the measurement its turn: every request first takes the turnstile exclusively,
then the lease, then lets the turnstile go, so a waiting measurement stops new worker runs from
starting until the running ones are done.

Threads: one :class:`GpuLease` per holder; flock locks belong to the open file, so two holders in
one process exclude each other too. Worker-side code: this module imports nothing of the
parent-side executor.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator

__all__ = ["GpuLease", "lease_dir"]


def lease_dir() -> str:
    """This user's directory of lease files (created, mode 0700)."""
    path = os.path.join(tempfile.gettempdir(), f"precompile-executor-{os.getuid()}", "gpu-lease")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


class GpuLease:
    """The lease on one GPU, for one holder.

    Args:
        key: the device's stable name (its UUID, ``"GPU-…"``); any file-name-safe text.
        directory: where the lease files live (default :func:`lease_dir`).

    Example::

        lease = GpuLease(uuid)
        with lease.exclusive():
            measure()
    """

    def __init__(self, key: str, directory: str | None = None) -> None:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"lease key must be a plain file name, got {key!r}")
        base = directory if directory is not None else lease_dir()
        self.path = os.path.join(base, f"{key}.lock")
        self._turnstile_path = os.path.join(base, f"{key}.turnstile")

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lease alongside other shared holders (a worker's run of a config)."""
        with self._hold(fcntl.LOCK_SH):
            yield

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lease alone (a measurement)."""
        with self._hold(fcntl.LOCK_EX):
            yield

    @contextlib.contextmanager
    def _hold(self, mode: int) -> Iterator[None]:
        lease = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            turnstile = os.open(self._turnstile_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(turnstile, fcntl.LOCK_EX)
                fcntl.flock(lease, mode)
            finally:
                os.close(turnstile)  # releases the turnstile
            yield
        finally:
            os.close(lease)  # releases the lease


def device_lease(directory: str | None = None) -> GpuLease | None:
    """The lease of this process's current CUDA device, or ``None`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return GpuLease(_uuid_name(props.uuid), directory)


def lease_for(device: object, directory: str | None = None) -> GpuLease | None:
    """The lease of a ``torch.device`` (``None`` unless it is a CUDA device)."""
    import torch

    dev = torch.device(device)  # type: ignore[call-overload]
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return GpuLease(_uuid_name(torch.cuda.get_device_properties(index).uuid), directory)


def _uuid_name(uuid: object) -> str:
    text = str(uuid)
    return text if text.startswith("GPU-") else "GPU-" + text
