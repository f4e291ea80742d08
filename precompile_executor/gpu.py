"""Run-once GPU tasks: kernel arguments shared once per batch, launches between synchronisations.

Before an autotuner times its candidate configs it runs each one once, in a worker, to catch the
configs that hang or fault on the GPU: an illegal memory access leaves the CUDA context of its
process unusable, and a kernel that never finishes cannot be stopped from inside its process.
This module gives such a batch what it needs:

* :func:`share_args` writes the kernel arguments (tensors and scalars) once per batch, with
  ``torch.save``, to a private file; its picklable handle, :class:`SharedArgs`, travels with every
  task, and :meth:`SharedArgs.load` loads the file at most once per worker process, onto that
  worker's GPU, and then reuses the same tensors for every task of the batch.
* :func:`run_once` makes a picklable task, :class:`RunOnce`: in a worker it loads the arguments,
  synchronises the device, compiles (a ``@triton.jit`` kernel) and launches once, synchronises
  again and returns a :class:`RunReport` (process, device, timings, your ``check``'s value).

Data flow::

    caller                                      worker (pinned with devices=[...], or not)
    ------                                      ------
    with share_args(args) as shared:
      torch.save(args) ─► private file (0600)
      executor.submit(run_once(kernel, shared,
                      grid=..., **config)) ───► RunOnce():
                                                  shared.load(): first use in this process?
                                                    torch.load(map_location=this GPU), cached
                                                    under the batch's token; else the cache
                                                  synchronize; compile (kernel.warmup)
                                                  synchronize; launch; synchronize
                                                  check(args) (optional)
      RunReport ◄──────────────────────────────── pid, device uuid, load/compile/launch times
    exit: delete the file; each worker drops the arguments of released batches on its next load

A fault surfaces at the second synchronisation as the task's exception: a sticky CUDA error
(illegal memory access, misaligned address, unspecified launch failure, …) makes the worker retire
after reporting it, and the executor replaces it; a hang runs into the executor's per-task timeout,
which kills the worker's process group (and with it the CUDA context and the kernel). Neither
touches other tasks.

Importing ``precompile_executor`` does not import this module; importing this module does not
import torch or Triton either (they are imported where they are needed), and nothing here
initialises CUDA until a task loads arguments or launches: workers that only compile never create
a CUDA context.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._worker import worker_device

__all__ = [
    "DeviceIdentity",
    "Grid",
    "RunOnce",
    "RunReport",
    "SharedArgs",
    "cuda_initialized",
    "device_identity",
    "run_once",
    "share_args",
]

Grid = tuple[int, ...] | Callable[[Mapping[str, Any]], tuple[int, ...]]
"""A Triton launch grid: a tuple, or a callable of the bound arguments (Triton's ``meta``)."""

_ARGS_FILE = "args.pt"


# -- shared arguments ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SharedArgs:
    """A picklable handle on kernel arguments saved once for a batch (see :func:`share_args`).

    Pickling it sends only the token and the file's path, never the tensors. Use it as a context
    manager, or call :meth:`release` when the batch is done.

    Attributes:
        token: identifies the batch's arguments; workers cache the loaded tensors under it.
        path: the file ``torch.save`` wrote.
        count: how many arguments there are.
        nbytes: the file's size in bytes.
        owner_pid: the process that wrote the file; only it can release it.
    """

    token: str
    path: str
    count: int
    nbytes: int
    owner_pid: int

    def load(self, device: Any = None) -> tuple[Any, ...]:
        """Return the arguments in this process, loading them on first use only.

        The first call in a process loads the file onto ``device`` (default: this process's
        current CUDA device, or the CPU where no GPU is visible) and keeps the result; later calls
        return the *same* objects, so tasks of one batch that write into an output tensor write
        into one shared buffer. Arguments of batches released since are dropped first.

        Raises:
            FileNotFoundError: the batch was released before this process loaded it.
        """
        with _cache_lock:
            _drop_released()
            hit = _cache.get(self.token)
            if hit is not None:
                return hit[1]
        try:
            loaded = _torch_load(self.path, device)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"the shared arguments {self.token} ({self.path}) were released before worker "
                f"pid {os.getpid()} loaded them: keep the share_args() block open until every "
                "task of the batch has finished"
            ) from None
        with _cache_lock:
            return _cache.setdefault(self.token, (self.path, loaded))[1]

    def loaded_here(self) -> bool:
        """Whether this process holds the loaded arguments now (without loading them)."""
        with _cache_lock:
            return self.token in _cache

    def release(self) -> None:
        """Delete the file (in the process that wrote it; elsewhere, only forget the tensors).

        Workers drop their copy on their next :meth:`load` of any batch; a task that has not
        loaded these arguments yet then fails with ``FileNotFoundError``.
        """
        with _cache_lock:
            _cache.pop(self.token, None)
        if os.getpid() == self.owner_pid:
            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)

    def __enter__(self) -> SharedArgs:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __len__(self) -> int:
        return self.count


def share_args(args: Sequence[Any], *, dir: str | None = None) -> SharedArgs:
    """Save kernel arguments once for a batch and return the handle tasks carry instead of them.

    ``torch.save`` writes ``args`` (tensors on any device, numbers, strings, ``None``, dtypes) to a
    file in a new private directory (mode 0700). Each worker that runs a task of the batch loads
    the file once, onto its own GPU, whatever device the tensors were saved from. Views keep
    sharing their storage.

    Example::

        with share_args((a, b, c, M, N, K)) as shared:
            futures = [executor.submit(run_once(matmul, shared, grid=g, **cfg)) for cfg in configs]
            wait_for_all(futures)

    Args:
        args: the positional arguments of the kernel (or function) the tasks run.
        dir: where to create the private directory (default: the system's temporary directory;
            a RAM-backed one such as ``/dev/shm`` spares the disk for large arguments).

    Returns:
        A :class:`SharedArgs`; leaving its ``with`` block (or :meth:`SharedArgs.release`) deletes
        the file. Keep it open until every task of the batch has finished.
    """
    import torch

    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError(f"args must be a sequence of kernel arguments, got {type(args).__name__}")
    folder = tempfile.mkdtemp(prefix="precompile-executor-args-", dir=dir)
    path = os.path.join(folder, _ARGS_FILE)
    try:
        torch.save(tuple(args), path)
        nbytes = os.path.getsize(path)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return SharedArgs(secrets.token_hex(8), path, len(args), nbytes, os.getpid())


_cache: dict[str, tuple[str, tuple[Any, ...]]] = {}
"""This process's loaded arguments by batch token, with the path of the batch's file."""
_cache_lock = threading.RLock()


def _torch_load(path: str, device: Any) -> tuple[Any, ...]:
    import torch

    where = _current_device() if device is None else torch.device(device)
    # weights_only: tensors and plain data only; loading never runs code from the file.
    loaded = torch.load(path, map_location=where, weights_only=True)
    return tuple(loaded)


def _drop_released() -> None:
    """Forget the arguments of batches whose file is gone (``_cache_lock`` held)."""
    dropped = False
    for token, (path, _) in list(_cache.items()):
        if not os.path.exists(path):
            del _cache[token]
            dropped = True
    if dropped and cuda_initialized():
        import torch

        torch.cuda.empty_cache()  # hand the memory back to the other processes on this GPU


# -- devices ---------------------------------------------------------------------------------------


def cuda_initialized() -> bool:
    """Whether this process has created a CUDA context through torch (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a half-imported torch: treat as not initialised
        return False


def _current_device() -> Any:
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class DeviceIdentity:
    """Which physical device a process runs on.

    Attributes:
        kind: ``"cuda"`` or ``"cpu"``.
        uuid: the GPU's UUID as ``nvidia-smi -L`` prints it (``"GPU-681e12d9-..."``), the same
            whatever ``CUDA_VISIBLE_DEVICES`` says; ``"cpu"`` without a GPU.
        name: e.g. ``"NVIDIA H200"``.
        pci_bus_id: ``"0000:19:00.0"``-style bus id where torch reports it, else ``""``.
        pinned: the device this worker was pinned to (``devices=[...]``), or ``None``.
    """

    kind: str
    uuid: str
    name: str
    pci_bus_id: str
    pinned: str | None


_identity: DeviceIdentity | None = None


def device_identity() -> DeviceIdentity:
    """Return the identity of this process's current device (initialises CUDA if visible)."""
    global _identity
    if _identity is not None:
        return _identity
    import torch

    if not torch.cuda.is_available():
        _identity = DeviceIdentity("cpu", "cpu", "cpu", "", worker_device())
        return _identity
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    bus = ""
    if hasattr(props, "pci_bus_id"):
        bus = (
            f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:"
            f"{getattr(props, 'pci_device_id', 0):02x}.0"
        )
    uuid = str(props.uuid)
    if not uuid.startswith("GPU-"):  # torch prints the bare hex; nvidia-smi says "GPU-<hex>"
        uuid = "GPU-" + uuid
    _identity = DeviceIdentity("cuda", uuid, props.name, bus, worker_device())
    return _identity


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


# -- run-once tasks --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunReport:
    """What one :class:`RunOnce` task did, returned to the caller.

    Attributes:
        label: the task's label (default: the kernel's name and its keyword arguments).
        worker_pid: the process that ran it.
        device: the device it ran on (its UUID tells GPUs apart across processes).
        args_loaded: this task loaded the shared arguments (the first task of the batch on this
            worker); ``False`` when it reused them.
        load_s: seconds spent getting the arguments (near zero when reused).
        compile_s: seconds to compile, or to find the compiled kernel (``kernel.warmup``); ``0.0``
            for a plain function.
        launch_s: seconds from the synchronisation before the launch to the one after it.
        checked: what ``check(args)`` returned, or ``None``.
    """

    label: str
    worker_pid: int
    device: DeviceIdentity
    args_loaded: bool
    load_s: float
    compile_s: float
    launch_s: float
    checked: Any = None


@dataclasses.dataclass(frozen=True)
class RunOnce:
    """A picklable task that launches a kernel (or calls a function) once on the worker's GPU.

    Build it with :func:`run_once` and submit it with no arguments: ``executor.submit(task)``.

    Attributes:
        kernel: a :class:`~precompile_executor.triton.KernelRef` for a ``@triton.jit`` kernel, or
            the function to call.
        args: the shared arguments, or a tuple sent with this task (tensors on the CPU).
        grid: the launch grid of a Triton kernel; ``None`` for a function.
        kwargs: keyword arguments of the launch (constexprs, ``num_warps``, ``num_stages``, …) or
            of the function.
        check: called as ``check(args)`` after the launch and the synchronisation; its value
            (which must pickle) comes back in :attr:`RunReport.checked`.
        label: names the task in reports.
    """

    kernel: Any
    args: SharedArgs | tuple[Any, ...]
    grid: Any
    kwargs: Mapping[str, Any]
    check: Callable[[tuple[Any, ...]], Any] | None
    label: str

    def __call__(self) -> RunReport:
        """Run in a worker: load the arguments, compile, launch between synchronisations."""
        start = time.perf_counter()
        if isinstance(self.args, SharedArgs):
            loaded_before = self.args.loaded_here()
            args = self.args.load()
            args_loaded = not loaded_before
        else:
            args = _to_device(self.args, _current_device())
            args_loaded = True
        load_s = time.perf_counter() - start
        identity = device_identity()
        compile_s = 0.0
        if self.grid is None:
            target = self.kernel if callable(self.kernel) else _load_jit(self.kernel)
            launch: Callable[..., Any] = target
        else:
            jit = _load_jit(self.kernel)
            t0 = time.perf_counter()
            jit.warmup(*args, grid=self.grid, **self.kwargs)
            compile_s = time.perf_counter() - t0
            launch = jit[self.grid]
        _synchronize()  # a fault of an earlier kernel must not be blamed on this one
        t1 = time.perf_counter()
        launch(*args, **self.kwargs)
        _synchronize()
        launch_s = time.perf_counter() - t1
        checked = self.check(args) if self.check is not None else None
        return RunReport(
            self.label,
            os.getpid(),
            identity,
            args_loaded,
            load_s,
            compile_s,
            launch_s,
            checked,
        )


def run_once(
    kernel: Any,
    args: SharedArgs | Sequence[Any],
    *,
    grid: Grid | None = None,
    check: Callable[[tuple[Any, ...]], Any] | None = None,
    label: str | None = None,
    **kwargs: Any,
) -> RunOnce:
    """Make a task that runs ``kernel`` once on a worker's GPU; submit it to an executor.

    With a ``grid``, ``kernel`` is a ``@triton.jit`` kernel (``@triton.autotune`` and
    ``@triton.heuristics`` wrappers are unwrapped: pass the config's values in ``kwargs``). It
    travels by reference or by source (see ``docs/triton.md``), is compiled in the worker (a
    cache hit if ``precompile``/``warm`` installed it, or an earlier task on that worker compiled
    it) and launched as ``kernel[grid](*args, **kwargs)``. Without a ``grid``, ``kernel`` is a
    picklable function called as ``kernel(*args, **kwargs)`` — e.g. one that launches several
    kernels. Either way the device is synchronised before and after, so a fault surfaces as this
    task's exception.

    Example::

        with PrecompileExecutor(16, devices=[0, 1], timeout=60) as pool, share_args(args) as shared:
            futures = [pool.submit(run_once(matmul, shared, grid=grid, **cfg)) for cfg in configs]
            reports = [f.result() for f in futures]

    Args:
        kernel: a Triton kernel (with ``grid``) or a function (without).
        args: the batch's :class:`SharedArgs` (loaded once per worker), or the arguments
            themselves, sent with this task and moved to the worker's device each time (tensors
            on a GPU are copied to the CPU here, since the worker's GPU numbering differs).
        grid: the launch grid: a tuple, or a callable of the bound arguments.
        check: ``check(args)`` runs in the worker after the launch; its (picklable) value comes
            back in :attr:`RunReport.checked` — e.g. the largest error against a reference.
        label: names the task in its report; default: the kernel's name and ``kwargs``.
        **kwargs: keyword arguments of the launch (constexprs, ``num_warps``, ``num_stages``).

    Returns:
        A :class:`RunOnce` task, whose result is a :class:`RunReport`.

    Raises:
        TypeError: no ``grid`` was given for a Triton kernel, a ``grid`` for a function, or
            ``kernel`` is neither a Triton kernel nor callable.
        precompile_executor.triton.KernelTransferError: the kernel cannot be sent to a worker.
    """
    name = getattr(kernel, "__name__", None) or type(kernel).__name__
    if _is_triton_kernel(kernel):
        from .triton import kernel_ref, unwrap_jit_function

        jit = unwrap_jit_function(kernel)
        if grid is None:
            raise TypeError(
                f"run_once({jit.__name__}, ...) needs grid=... to launch a Triton kernel"
            )
        name = jit.__name__
        payload: Any = kernel_ref(jit)
    elif callable(kernel):
        if grid is not None:
            raise TypeError(
                f"grid= launches a Triton kernel; {name} is a function: call "
                f"run_once({name}, args) without grid, and it is called as {name}(*args)"
            )
        payload = kernel
    else:
        raise TypeError(f"kernel must be a Triton kernel or a callable, got {kernel!r}")
    if not isinstance(args, SharedArgs):
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise TypeError(f"args must be SharedArgs or a sequence, got {type(args).__name__}")
        args = tuple(_to_cpu(a) for a in args)
    if label is None:
        label = name + (
            "[" + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + "]" if kwargs else ""
        )
    return RunOnce(payload, args, grid, dict(kwargs), check, label)


def _is_triton_kernel(obj: Any) -> bool:
    triton_jit = sys.modules.get("triton.runtime.jit")
    if triton_jit is None:  # triton was never imported, so obj cannot be one of its kernels
        return False
    return isinstance(obj, triton_jit.KernelInterface)


def _load_jit(ref: Any) -> Any:
    """Return the worker's ``JITFunction`` for ``ref``: the same object every time (``load_kernel``
    keeps it), so its in-memory compile cache serves later tasks."""
    from .triton import load_kernel

    return load_kernel(ref)[0]


def _to_cpu(value: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.device.type != "cpu":
        return value.cpu()
    return value


def _to_device(args: tuple[Any, ...], device: Any) -> tuple[Any, ...]:
    import torch

    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
