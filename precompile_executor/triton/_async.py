"""Run Triton's ``AsyncCompileMode`` compiles in worker processes.

Inside ``with AsyncCompileMode(executor):`` a ``JITFunction`` launch or ``warmup`` that needs a
compile calls ``executor.submit(async_compile)``, where ``async_compile`` is a closure (in
``JITFunction._do_compile``, Triton 3.6 to 3.9) over::

    self      the JITFunction            (holds an RLock: does not pickle)
    src       ASTSource(fn, signature, constants, attrs)
    target    GPUTarget
    options   the backend's options dataclass
    env_vars  the cache-invalidating environment variables

and it expects the future to resolve to a ``CompiledKernel`` (which does not pickle either).
:class:`TritonCompileExecutor` takes the closure apart, sends a picklable
:class:`~._messages.CompileRequest` to the wrapped executor, installs the returned files in this
process's cache, and resolves the future with a ``CompiledKernel`` loaded from there — the same
object a cache hit gives. Anything but such a closure is refused with a ``TypeError``; a closure of
another shape (a future Triton) with :class:`~._errors.UnsupportedTritonError`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_futures
from typing import Any

from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from .._scope import check_executor
from ._errors import UnsupportedTritonError
from ._submit import CompileJob, default_executor, submit_compile

_CLOSURE_NAME = "async_compile"
_CLOSURE_MODULE = "triton.runtime.jit"


class TritonCompileExecutor(Executor):
    """An ``Executor`` for ``triton.AsyncCompileMode`` that compiles in another executor's workers.

    Use it as ``AsyncCompileMode(TritonCompileExecutor(pool))``; the futures that Triton gets back
    resolve to real ``CompiledKernel`` objects loaded from this process's cache. Shutting it down
    waits for (or cancels) its own compiles and leaves the wrapped executor running.

    Attributes:
        executor: the executor the compiles run in.
    """

    def __init__(self, executor: Executor | None = None, *, force: bool = False) -> None:
        """Wrap ``executor`` (a shared ``PrecompileExecutor`` by default).

        Args:
            executor: any ``concurrent.futures.Executor``; processes give isolation, threads work
                too (they compile straight into this process's cache).
            force: compile even when this process's cache already has the result.

        Raises:
            TypeError: ``executor`` is neither ``None`` nor a ``concurrent.futures.Executor``.
        """
        self.executor = default_executor() if executor is None else check_executor(executor)
        self._force = force
        self._jobs: list[CompileJob] = []
        self._lock = threading.Lock()
        self._shutdown = False

    @property
    def jobs(self) -> tuple[CompileJob, ...]:
        """Every compile submitted so far, in submission order."""
        with self._lock:
            return tuple(self._jobs)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Take one of Triton's compile closures and compile it in the wrapped executor.

        Raises:
            TypeError: ``fn`` is not Triton's ``async_compile`` closure, or arguments were given.
            UnsupportedTritonError: the closure does not capture what Triton 3.6–3.9 capture.
            RuntimeError: this executor was shut down.
        """
        if args or kwargs or not _is_triton_compile_closure(fn):
            raise TypeError(
                f"TritonCompileExecutor only runs the compile closures that Triton's "
                f"AsyncCompileMode submits, not {fn!r}; submit other work to the wrapped "
                "executor directly."
            )
        src, target, options, env_vars = _unpack_closure(fn)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit a compile after shutdown()")
        job = submit_compile(self.executor, src, target, options, env_vars, force=self._force)
        with self._lock:
            self._jobs.append(job)
        return job.future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new compiles; cancel pending ones if asked; wait for the rest if asked.

        The wrapped executor is not shut down.
        """
        with self._lock:
            self._shutdown = True
            futures = [job.future for job in self._jobs]
        if cancel_futures:
            for future in futures:
                future.cancel()
        if wait:
            wait_futures(futures)


def async_compile_executor(
    executor: Executor | None = None, *, force: bool = False
) -> TritonCompileExecutor:
    """Return an executor for ``triton.AsyncCompileMode`` that compiles in ``executor``'s workers.

    Example::

        from triton.runtime._async_compile import AsyncCompileMode
        with PrecompileExecutor() as pool, AsyncCompileMode(async_compile_executor(pool)):
            for config in configs:
                kernel.warmup(*args, grid=(1,), **config)

    Args:
        executor: where to compile; a shared ``PrecompileExecutor`` by default.
        force: compile even when this process's cache already has the result.
    """
    return TritonCompileExecutor(executor, force=force)


def _is_triton_compile_closure(fn: Any) -> bool:
    return (
        getattr(fn, "__name__", None) == _CLOSURE_NAME
        and getattr(fn, "__module__", None) == _CLOSURE_MODULE
    )


def _unpack_closure(fn: Any) -> tuple[Any, Any, dict[str, Any], dict[str, str]]:
    """Return ``(src, target, options, env_vars)`` from Triton's ``async_compile`` closure."""
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    captured: dict[str, Any] = {}
    if code is not None:
        for name, cell in zip(code.co_freevars, cells, strict=False):
            with contextlib.suppress(ValueError):  # an empty cell has no contents
                captured[name] = cell.cell_contents
    src = captured.get("src")
    target = captured.get("target")
    options = captured.get("options")
    env_vars = captured.get("env_vars", {})
    if (
        not isinstance(src, ASTSource)
        or not isinstance(getattr(src, "fn", None), JITFunction)
        or not isinstance(target, GPUTarget)
        or not hasattr(options, "__dict__")
        or not isinstance(env_vars, dict)
    ):
        shapes = ", ".join(f"{k}: {type(v).__name__}" for k, v in sorted(captured.items()))
        raise UnsupportedTritonError(
            "Triton's async_compile closure captures {" + shapes + "}, not the ASTSource of a "
            "JITFunction, GPUTarget, options and env_vars that Triton 3.6 to 3.9 capture. Please "
            "report this with your Triton version; meanwhile use AsyncCompileMode with a "
            "ThreadPoolExecutor."
        )
    if type(src) is not ASTSource or src.fn.is_gluon():
        raise UnsupportedTritonError(
            f"{src.fn!r} is a Gluon kernel ({type(src).__name__}); only @triton.jit kernels can "
            "be compiled in workers. Compile Gluon kernels in threads."
        )
    return src, target, dict(vars(options)), dict(env_vars)
