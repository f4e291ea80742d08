"""Warm ``@triton.autotune`` kernels: compile every config in parallel before the first call.

For each kernel, launch and config, :func:`warm` calls the kernel's own
``warmup(*args, grid=(1,), **kwargs, **config.all_kwargs())`` — the call ``Autotuner`` makes for a
config, minus the launch — inside ``triton.AsyncCompileMode`` with a
:class:`~._async.TritonCompileExecutor`. So Triton itself binds the arguments, specialises them
(pointer and integer divisibility by 16, integers equal to 1, ``do_not_specialize``), applies
heuristics, parses the options and computes the cache key; the compiles run in the executor's
workers and land in this process's cache under exactly the keys the real launch will look up.

Arguments need not be real tensors: a :class:`TensorSpec` carries what specialisation reads
(dtype and whether the pointer is 16-byte aligned) plus shape and strides for convenience. Integers
must specialise like the real ones: pass the real value, or any value with the same
"equals 1 / multiple of 16 / other" class.

With an explicit ``target`` the warm-up uses a compile-only driver (see ``_driver.py``) and needs
no GPU; with ``target=None`` it compiles for the current GPU through the real driver, and also
fills the JIT's in-memory kernel cache.
"""

from __future__ import annotations

import copy
import dataclasses
import numbers
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, as_completed
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any, Literal

import triton.language as tl
from triton.runtime import _async_compile
from triton.runtime._async_compile import AsyncCompileMode
from triton.runtime.autotuner import Autotuner
from triton.runtime.driver import driver

from ._async import TritonCompileExecutor
from ._classify import Classification, classify
from ._driver import compile_only_driver, forget_device
from ._kernel_ref import unwrap_jit_function
from ._prewarm import caller_warming
from ._submit import CompileJob
from ._target import format_target, parse_target

WARMUP_GRID = (1,)
"""The grid passed to ``warmup``: ignored (nothing is launched) but required by Triton."""

Status = Literal["ok", "cached", "failed", "timed out"]


def _ints(what: str, values: Any) -> tuple[int, ...]:
    """``values`` as a tuple of ints (a ``torch.Size`` is one); a string, a lone number or a
    float among them raises ``TypeError`` saying ``what``."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise TypeError(f"{what}, got {values!r}")
    found = tuple(values)
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in found):
        raise TypeError(f"{what}, got {values!r}")
    return tuple(int(v) for v in found)


class TensorSpec:
    """A stand-in for a tensor argument: dtype, shape, strides and pointer alignment.

    Triton specialises a pointer argument on its element type and on whether its address is a
    multiple of 16; that is all the JIT reads (``dtype`` and ``data_ptr()``). ``shape`` and
    ``stride()`` mirror ``torch.Tensor`` so argument lists can be written like real launches.

    Args:
        dtype: a ``triton.language`` dtype (``tl.float16``), its name (``"fp16"``, ``"float16"``,
            ``"bf16"``, ``"i32"``) or a ``torch.dtype``.
        shape: the sizes.
        strides: the strides in elements; row-major contiguous by default.
        aligned: whether the data pointer is 16-byte aligned (what ``torch`` allocations are).
    """

    def __init__(
        self,
        dtype: Any,
        shape: Sequence[int],
        strides: Sequence[int] | None = None,
        *,
        aligned: bool = True,
    ) -> None:
        self.dtype = _triton_dtype(dtype)
        self.shape = _ints("shape must be a sequence of sizes (ints >= 0)", shape)
        if any(size < 0 for size in self.shape):
            raise ValueError(f"shape must be a sequence of sizes (ints >= 0), got {shape!r}")
        if strides is None:
            contiguous = [1] * len(self.shape)
            for i in range(len(self.shape) - 2, -1, -1):
                contiguous[i] = contiguous[i + 1] * self.shape[i + 1]
            strides = contiguous
        if len(strides) != len(self.shape):
            raise ValueError(f"{len(strides)} strides given for a {len(self.shape)}-d shape")
        self.strides = _ints("strides must be a sequence of ints", strides)
        self.aligned = aligned

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    def stride(self, dim: int | None = None) -> Any:
        """Return all strides, or the stride of ``dim`` (as ``torch.Tensor.stride``)."""
        return self.strides if dim is None else self.strides[dim]

    def size(self, dim: int | None = None) -> Any:
        """Return the shape, or the size of ``dim`` (as ``torch.Tensor.size``)."""
        return self.shape if dim is None else self.shape[dim]

    def element_size(self) -> int:
        """Return the size of one element in bytes (at least 1)."""
        return max(1, int(self.dtype.primitive_bitwidth) // 8)

    def numel(self) -> int:
        """Return the number of elements."""
        count = 1
        for size in self.shape:
            count *= size
        return count

    def data_ptr(self) -> int:
        """Return a fake address: 0 when aligned, else one element past it (never 16-aligned)."""
        return 0 if self.aligned else self.element_size()

    def descriptor(self, block_shape: Sequence[int] | None = None) -> Any:
        """Return a host ``TensorDescriptor`` over this spec, as
        ``TensorDescriptor.from_tensor(tensor, block_shape)`` makes one over a tensor.

        A kernel that takes TMA descriptors is warmed with these where its launch passes
        ``triton.tools.tensor_descriptor.TensorDescriptor`` objects. Specialisation reads the
        element type and the block shape: give the launch's, or — for configs whose ``pre_hook``
        sets the block shape, as in Triton's persistent-matmul tutorial — leave it out (a
        dummy ``[1, …]``, as those libraries write it); each config's hook then sets it on a
        copy (docs/triton.md, "TMA descriptors and pre_hook").

        Raises:
            UnsupportedTritonError: this Triton has no host ``TensorDescriptor``
                (``triton.tools.tensor_descriptor``, Triton 3.4 and later).
        """
        descriptor_type = host_descriptor_type()
        if descriptor_type is None:
            from ._errors import UnsupportedTritonError

            raise UnsupportedTritonError(
                "this Triton has no host TensorDescriptor (triton.tools.tensor_descriptor, "
                "Triton 3.4 and later): warm TMA kernels with a Triton that has one"
            )
        shape = list(block_shape) if block_shape is not None else [1] * self.ndim
        return descriptor_type.from_tensor(self, shape)

    def __repr__(self) -> str:
        extra = "" if self.aligned else ", aligned=False"
        return f"TensorSpec({str(self.dtype)!r}, {self.shape}, {self.strides}{extra})"


@dataclasses.dataclass(frozen=True)
class Launch:
    """The arguments of one launch to warm a kernel for (no grid)."""

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def launch(*args: Any, **kwargs: Any) -> Launch:
    """Return a :class:`Launch` of these arguments, written as the kernel call would be."""
    return Launch(args, kwargs)


@dataclasses.dataclass(frozen=True)
class ConfigResult:
    """The outcome of warming one config of one kernel for one launch.

    Attributes:
        kernel: the kernel's name.
        config: the config's meta-parameters and options, e.g. ``"BLOCK=64, num_warps=4"``.
        status: ``"ok"`` (compiled now), ``"cached"`` (nothing to do), ``"failed"`` or
            ``"timed out"``.
        compile_time_s: seconds the worker spent compiling (0 unless ``"ok"``).
        error: the exception, for ``"failed"`` and ``"timed out"``.
        classification: :func:`classify`'s verdict on ``error``.
        worker_pid: the process that compiled, for ``"ok"``.
        job: the compile job, where one was created.
    """

    kernel: str
    config: str
    status: Status
    compile_time_s: float = 0.0
    error: BaseException | None = None
    classification: Classification | None = None
    worker_pid: int | None = None
    job: CompileJob | None = None


@dataclasses.dataclass(frozen=True)
class WarmReport:
    """What :func:`warm` did.

    Attributes:
        target: the target compiled for, ``"cuda:90:32"``.
        results: one entry per kernel, launch and config, in submission order.
        wall_time_s: seconds from the first submission to the last result.
    """

    target: str
    results: tuple[ConfigResult, ...]
    wall_time_s: float

    def count(self, status: Status) -> int:
        """Return how many configs ended with ``status``."""
        return sum(1 for r in self.results if r.status == status)

    @property
    def compile_time_s(self) -> float:
        """The sum of the workers' compile times: what compiling one after another would cost."""
        return sum(r.compile_time_s for r in self.results)

    @property
    def speedup(self) -> float:
        """Sum of compile times over wall time (0 when nothing was compiled)."""
        return self.compile_time_s / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def unexpected_failures(self) -> tuple[ConfigResult, ...]:
        """Failures classified ``"raise"``: not a known resource or ``ptxas`` limit."""
        return tuple(r for r in self.results if r.error is not None and r.classification == "raise")


KernelSpecs = Mapping[Any, Iterable[Launch | Sequence[Any]]]
"""Kernel (autotuned, heuristics-wrapped or plain ``@triton.jit``) to the launches to warm."""


def configs_of(kernel: Any) -> list[Any]:
    """Return the autotune configs of ``kernel``, or ``[None]`` for a kernel without them."""
    return list(kernel.configs) if isinstance(kernel, Autotuner) else [None]


def count_configs(specs: KernelSpecs) -> int:
    """Return how many compiles :func:`warm` will consider for ``specs``."""
    return sum(len(configs_of(k)) * len(list(launches)) for k, launches in specs.items())


def warm(
    specs: KernelSpecs,
    *,
    target: Any = None,
    executor: Executor | None = None,
    force: bool = False,
    on_result: Callable[[ConfigResult], None] | None = None,
) -> WarmReport:
    """Compile every config of every kernel in ``specs`` in parallel, into this process's cache.

    Args:
        specs: kernel to launches; a launch is a :class:`Launch` or a tuple of positional
            arguments, with :class:`TensorSpec` for tensors.
        target: ``"cuda:90"``-style string or ``GPUTarget``; ``None`` means the current GPU.
        executor: where to compile; a shared ``PrecompileExecutor`` by default. Per-config
            timeouts are the executor's (``PrecompileExecutor(timeout=...)``).
        force: compile even the configs this process's cache already has.
        on_result: called in this thread with each :class:`ConfigResult` as it is known.

    Returns:
        A :class:`WarmReport`; failures are reported there, not raised.

    Raises:
        TypeError: ``specs`` is not a mapping, or ``executor`` not an executor.
    """
    if not isinstance(specs, Mapping):
        raise TypeError(
            "specs must be a mapping of kernel to launches, {kernel: [launch(...), ...]}; got "
            f"{type(specs).__name__}"
        )
    adapter = TritonCompileExecutor(executor, force=force)
    explicit = parse_target(target) if target is not None else None
    emit = on_result or (lambda result: None)
    done: list[tuple[int, ConfigResult]] = []
    waiting: list[tuple[int, str, str, CompileJob]] = []
    start = time.perf_counter()
    mode = AsyncCompileMode(adapter, ignore_errors=True)
    try:
        with mode:
            try:
                with ExitStack() as swap:
                    if explicit is not None:
                        stand_in = swap.enter_context(compile_only_driver(explicit))
                        swap.callback(_forget, specs, stand_in.device)
                        target_name = format_target(explicit)
                    else:
                        target_name = format_target(_current_target())
                    # Queue every config before any starts, so the executor starts the longest
                    # predicted first (PrecompileExecutor.batch(); other executors: as submitted).
                    with holding_batch(adapter.executor):
                        _submit_all(specs, adapter, done, waiting, emit)
                _wait_all(waiting, done, emit)
            finally:
                # After an error or Ctrl-C, let nothing queued start; the mode's exit then
                # finds every future settled instead of waiting for the whole batch.
                adapter.shutdown(wait=False, cancel_futures=True)
    finally:
        _deactivate(mode)
    wall_time_s = time.perf_counter() - start
    results = tuple(result for _, result in sorted(done, key=lambda pair: pair[0]))
    return WarmReport(target=target_name, results=results, wall_time_s=wall_time_s)


@dataclasses.dataclass(frozen=True)
class ConfigCompile:
    """What :func:`compile_configs` did for one config.

    Attributes:
        config: the ``triton.Config`` (``None`` for a kernel without configs).
        label: its meta-parameters and options, e.g. ``"BLOCK=64, num_warps=4"``.
        job: the compile submitted for it, or ``None``: already in the JIT's memory or the
            caller's cache as an earlier config's compile, or the JIT refused the arguments.
        kernel: what the JIT returned: a ``FutureKernel`` (compiling), a ``CompiledKernel``
            (already in memory) or ``None``.
        error: what the JIT raised for these arguments (a bad argument, an unsendable kernel),
            or a :class:`PreHookError`.
        args: the positional arguments the config was compiled for: the launch's, or, where
            the config's ``pre_hook`` ran, its copies after the hook.
        kwargs: the keyword arguments likewise.
    """

    config: Any
    label: str
    job: CompileJob | None = None
    kernel: Any = None
    error: Exception | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class PreHookError(RuntimeError):
    """A config's ``pre_hook`` raised when run on copies of the launch's arguments; the error
    it raised is the ``__cause__``. The config is not sent to a worker."""


def host_descriptor_type() -> Any:
    """Return Triton's host ``TensorDescriptor`` class (``triton.tools.tensor_descriptor``, the
    same in Triton 3.6 and 3.9), or ``None`` where this Triton has none."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def _is_descriptor(value: Any) -> bool:
    descriptor_type = host_descriptor_type()
    return descriptor_type is not None and isinstance(value, descriptor_type)


def _holds_descriptor(value: Any) -> bool:
    if isinstance(value, tuple):
        return any(_holds_descriptor(v) for v in value)
    return _is_descriptor(value)


def _copy_descriptors(value: Any) -> Any:
    """``value`` with every host ``TensorDescriptor`` in it (at any depth of tuples, which Triton
    specialises element by element) replaced by a copy whose list fields (``shape``,
    ``strides``, ``block_shape``) are lists of their own, so a hook that sets or edits them
    leaves the caller's descriptor as it was; the tensor under it is shared, never copied."""
    if isinstance(value, tuple):
        items = [_copy_descriptors(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if not _is_descriptor(value):
        return value
    clone = copy.copy(value)
    for name, field in list(vars(clone).items()):
        if isinstance(field, list):
            setattr(clone, name, list(field))
    return clone


def hooked_arguments(
    kernel: Any, config: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return the arguments a launch of ``config`` specialises on: after its ``pre_hook``.

    ``Autotuner._bench`` (Triton 3.6, 3.9) calls ``config.pre_hook(full_nargs)`` right before
    each launch, with ``full_nargs`` the arguments by name, the call's keyword arguments and
    the config's. TMA kernels (Triton's persistent-matmul tutorial, Liger's fused MLPs) set
    their host descriptors' ``block_shape`` there, from the config's block sizes: the launch's
    signature (``tensordesc<bf16[64, 64]>``) is the hook's, not the dummy the caller built the
    descriptor with. So where an argument holds a host ``TensorDescriptor``, the hook runs here,
    on copies of the descriptors (the caller's objects are left as they are), and the config is
    compiled for the copies. Elsewhere the arguments are returned as given, and the hook is left
    to Triton: a hook that writes into tensors (zeroing an accumulator) then runs on them only
    when Triton runs it. docs/triton.md, "TMA descriptors and pre_hook".

    Raises:
        PreHookError: the hook raised.
    """
    if not any(_holds_descriptor(v) for v in (*args, *kwargs.values())):
        return tuple(args), dict(kwargs)
    # Copies even without a hook: the compile's arguments stay as they were when it was sent
    # (the guard compares them with the launch's: _autotune_guard.differing_arguments).
    copied = [_copy_descriptors(a) for a in args]
    copied_kwargs = {k: _copy_descriptors(v) for k, v in kwargs.items()}
    hook = getattr(config, "pre_hook", None) if config is not None else None
    if hook is None:
        return tuple(copied), copied_kwargs
    names = unwrap_jit_function(kernel).arg_names
    nargs = {**dict(zip(names, copied, strict=False)), **copied_kwargs, **config.all_kwargs()}
    try:
        hook(nargs)
    except Exception as exc:
        raise PreHookError(
            f"the pre_hook of config {config} raised {type(exc).__name__}: {exc} (run on copies "
            "of the launch's descriptor arguments, to compile the config for the block shapes it "
            "sets)"
        ) from exc
    hooked = tuple(nargs[name] for name in names[: len(copied)]) + tuple(copied[len(names) :])
    return hooked, {k: nargs[k] for k in copied_kwargs}


def compile_configs(
    kernel: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    configs: Iterable[Any],
    adapter: TritonCompileExecutor,
) -> list[ConfigCompile]:
    """Submit one compile per config of ``kernel`` for exactly these launch arguments.

    This is the one path from "these configs of this kernel, for these arguments" to compiles
    in workers, shared by :func:`warm` (and ``precompile-executor warm``) and by
    ``precompile_executor.triton.autotune``. Each config goes through the JIT's own launch path
    in warm-up mode — binding, specialisation, options, cache key — so the compile is the one a
    launch with these arguments looks up. Call it with an ``AsyncCompileMode(adapter)`` active.

    Args:
        kernel: an ``Autotuner`` (its ``fn`` is launched, so a ``Heuristics`` wrapper under it
            adds its values), a ``Heuristics`` wrapper or a ``JITFunction``.
        args: the launch's positional arguments (tensors or :class:`TensorSpec`).
        kwargs: its keyword arguments, without ``grid`` and ``warmup``.
        configs: ``triton.Config`` objects, or ``[None]`` for a kernel without configs.
        adapter: the executor the mode submits to.
    """
    # Autotuner launches ``self.fn.run(*args, **kwargs, **config.all_kwargs())``; its ``fn``
    # may be a Heuristics wrapper, which then adds its own keyword arguments.
    entry = kernel.fn if isinstance(kernel, Autotuner) else kernel
    # Triton 3.9's JIT computes the compile's cache key — for a process's first, a hash of
    # Triton's whole installation (``triton_key``, 0.4-1.2 s) — before it hands the compile to
    # the mode: while the executor's background ``warm_caller`` is hashing, wait for it rather
    # than hash a second time beside it (docs/design.md, "The caller's half of an initializer").
    with caller_warming:
        pass
    results = []
    for config in configs:
        meta = dict(config.all_kwargs()) if config is not None else {}
        label = _describe(meta)
        before = len(adapter.jobs)
        try:
            call_args, call_kwargs = hooked_arguments(kernel, config, args, kwargs)
        except PreHookError as exc:
            results.append(ConfigCompile(config, label, error=exc, args=tuple(args)))
            continue
        try:
            compiled = entry.warmup(*call_args, grid=WARMUP_GRID, **call_kwargs, **meta)
        except Exception as exc:  # a bad argument, an unsendable kernel, …
            results.append(ConfigCompile(config, label, error=exc, args=call_args))
            continue
        jobs = adapter.jobs[before:]
        job = jobs[0] if jobs else None
        results.append(
            ConfigCompile(config, label, job, compiled, args=call_args, kwargs=call_kwargs)
        )
    return results


def _submit_all(
    specs: KernelSpecs,
    adapter: TritonCompileExecutor,
    done: list[tuple[int, ConfigResult]],
    waiting: list[tuple[int, str, str, CompileJob]],
    emit: Callable[[ConfigResult], None],
) -> None:
    index = 0
    for kernel, launches in specs.items():
        name = unwrap_jit_function(kernel).__name__
        for one in launches:
            args, kwargs = (
                (one.args, dict(one.kwargs)) if isinstance(one, Launch) else (tuple(one), {})
            )
            for compiled in compile_configs(kernel, args, kwargs, configs_of(kernel), adapter):
                index += 1
                if compiled.error is not None:
                    result = ConfigResult(
                        name,
                        compiled.label,
                        "failed",
                        error=compiled.error,
                        classification=classify(compiled.error),
                    )
                elif compiled.job is not None:
                    waiting.append((index, name, compiled.label, compiled.job))
                    continue
                else:  # already in the JIT's memory, or the same compile as an earlier config
                    result = ConfigResult(name, compiled.label, "cached")
                done.append((index, result))
                emit(result)


def _wait_all(
    waiting: list[tuple[int, str, str, CompileJob]],
    done: list[tuple[int, ConfigResult]],
    emit: Callable[[ConfigResult], None],
) -> None:
    by_future = {entry[3].future: entry for entry in waiting}
    for future in as_completed(by_future):
        index, name, config, job = by_future[future]
        result = _result_of(name, config, job)
        done.append((index, result))
        emit(result)


def _result_of(name: str, config: str, job: CompileJob) -> ConfigResult:
    if job.future.cancelled():
        return ConfigResult(
            name, config, "failed", job=job, error=RuntimeError("cancelled"), classification="raise"
        )
    exc = job.future.exception()
    if exc is not None:
        verdict = getattr(exc, "classification", None)
        if verdict not in ("raise", "warn", "debug"):
            verdict = classify(exc)
        status: Status = "timed out" if isinstance(exc, TimeoutError) else "failed"
        return ConfigResult(name, config, status, error=exc, classification=verdict, job=job)
    if job.cached or job.artifacts is None:
        return ConfigResult(name, config, "cached", job=job)
    return ConfigResult(
        name,
        config,
        "ok",
        compile_time_s=job.artifacts.compile_time_s,
        worker_pid=job.artifacts.worker_pid,
        job=job,
    )


def holding_batch(executor: Executor) -> AbstractContextManager[Any]:
    batch = getattr(executor, "batch", None)
    return batch() if callable(batch) else nullcontext()


def _current_target() -> Any:
    try:
        return driver.active.get_current_target()
    except RuntimeError as exc:
        raise RuntimeError(
            f"no GPU to warm kernels for ({exc}); pass an explicit target such as "
            "target='cuda:90' to compile without one"
        ) from exc


def _deactivate(mode: AsyncCompileMode) -> None:
    """Leave ``mode`` even where Triton did not: 3.6 stays active if its ``__exit__`` raised."""
    if _async_compile.active_mode.get() is mode:
        _async_compile.active_mode.set(None)


def _describe(meta: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in meta.items())


def _forget(specs: KernelSpecs, device: str) -> None:
    for kernel in specs:
        forget_device(unwrap_jit_function(kernel), device)


_INT_ALIAS = re.compile(r"([iu])(\d+)")


def _triton_dtype(dtype: Any) -> Any:
    if isinstance(dtype, tl.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name == "bool":
        return tl.int1
    if match := _INT_ALIAS.fullmatch(name):
        name = ("int" if match.group(1) == "i" else "uint") + match.group(2)
    found = getattr(tl, name, None)
    if isinstance(found, tl.dtype):
        return found
    try:
        return tl.dtype(name)
    except Exception:
        raise ValueError(
            f"unknown dtype {dtype!r}: use a triton.language dtype (tl.float16), a name such as "
            "'fp16', 'bf16', 'float32', 'i32', or a torch dtype"
        ) from None
