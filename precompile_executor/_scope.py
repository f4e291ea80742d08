"""Which executor an integration's autotunes use: one rule for every thread.

Every integration (``precompile_executor.triton.autotune``, ``precompile_executor.helion``,
``precompile_executor.inductor``) offers the same two forms, with the same meaning:

* ``with use(executor):`` — a **block**. It is open from its entry until its exit, for the whole
  process: while it is open, an autotune started on *any* thread goes through it — the thread
  that entered it, autograd's backward threads, a ``threading.Thread``, a pool thread, a thread
  that existed before the block.
* ``install(executor)`` / ``uninstall()`` — the process-wide form: open until ``uninstall()``.

Which executor, when several are open (:meth:`Scope.current`):

1. the innermost block entered in the *current context* that is still open (the thread that
   entered it, and contexts copied from it: ``asyncio`` tasks, ``contextvars.copy_context()``):
   an inner ``use(ex)`` wins for what runs inside it;
2. else the most recently entered block still open anywhere in the process (a thread with no
   block of its own follows the newest block);
3. else ``install()``'s executor;
4. else :data:`OFF`: the library is not involved and the autotuner runs stock.

Blocks may exit in any order (overlapping blocks on different threads): an exit closes that
block alone. ``None`` as an executor means "the integration's shared default"; this module never
interprets it.

Each integration keeps one :class:`Scope`; the scope also counts its holders (open blocks plus an
installation) and calls the integration's ``activate`` when the first arrives (check versions,
patch) and ``deactivate`` when the last leaves (put the originals back). A failing ``activate``
leaves nothing open. :meth:`Scope.reset` is the documented way for tests to close everything.

Guarantees: every method is thread-safe (one lock per scope); ``activate``/``deactivate`` run
under that lock, so a patch and its undo never interleave; :meth:`Scope.current` takes the lock
only for reading a short list.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from types import MappingProxyType
from typing import Any, Final

OFF: Final[Any] = object()
"""No executor: the integration's autotuner runs stock."""

_ids = itertools.count()

ANY_EXECUTOR = "a concurrent.futures.Executor (a PrecompileExecutor)"


def check_executor(
    executor: Any, kinds: type | tuple[type, ...] = Executor, what: str = ANY_EXECUTOR
) -> Any:
    """``executor`` as an integration's ``use()``/``install()`` takes it: ``None`` (its shared
    default) or an instance of ``kinds``. Anything else raises ``TypeError`` naming ``what`` is
    taken, before a block opens or anything is patched. A shut-down executor passes: whether it
    takes tasks is each compile's to find out (an integration reports the refusal)."""
    if executor is not None and not isinstance(executor, kinds):
        raise TypeError(
            f"executor must be {what}, or None for the shared default; got "
            f"{type(executor).__name__} {executor!r:.80}"
        )
    return executor


class Block:
    """One open ``use()`` block (or an installation): which executor, its options (what else
    the integration's ``use()`` was given, e.g. ``{"screening": True}``), whether still open."""

    __slots__ = ("executor", "number", "open", "options")

    def __init__(self, executor: Any, options: Mapping[str, Any] | None = None) -> None:
        self.executor = executor
        self.options: Mapping[str, Any] = MappingProxyType(dict(options or {}))
        self.number = next(_ids)  # entry order, for "the most recently entered"
        self.open = True

    def __repr__(self) -> str:
        state = "open" if self.open else "closed"
        return f"<Block {self.number} {state} executor={self.executor!r}>"


class Scope:
    """The open blocks and the installation of one integration (see the module docstring).

    Args:
        name: the integration's name, for the context variable and messages.
        activate: called (under the scope's lock) when the first holder arrives; it may raise to
            refuse, and then nothing is opened.
        deactivate: called (under the lock) when the last holder leaves.
        connected_by: the module that gives ``activate``/``deactivate`` later, through
            :meth:`connect`, when it is imported (an integration's seam); a holder arriving
            before that is a bug (the seam was not imported) and raises ``AssertionError``.
    """

    def __init__(
        self,
        name: str,
        *,
        activate: Callable[[], None] | None = None,
        deactivate: Callable[[], None] | None = None,
        connected_by: str | None = None,
    ) -> None:
        self.name = name
        self._activate = activate
        self._deactivate = deactivate
        self._connected_by = connected_by
        self._lock = threading.RLock()
        self._open: list[Block] = []  # entry order; the newest last
        self._installed: Block | None = None
        self._own: contextvars.ContextVar[tuple[Block, ...]] = contextvars.ContextVar(
            f"precompile_executor_{name}_blocks", default=()
        )

    def connect(self, activate: Callable[[], None], deactivate: Callable[[], None]) -> None:
        """Give the callbacks a seam defines (``connected_by``): called once, at its import."""
        with self._lock:
            self._activate, self._deactivate = activate, deactivate

    # -- holders -----------------------------------------------------------------------------

    def enter(self, executor: Any, options: Mapping[str, Any] | None = None) -> Block:
        """Open a block for ``executor`` (with ``options``) in the current context; pair with
        :meth:`exit`."""
        with self._lock:
            self._hold()
            block = Block(executor, options)
            self._open.append(block)
        self._own.set((*self._own.get(), block))
        return block

    def exit(self, block: Block) -> None:
        """Close ``block`` (a no-op if it is closed already, e.g. by :meth:`reset`)."""
        own = self._own.get()
        if block in own:
            self._own.set(tuple(b for b in own if b is not block))
        with self._lock:
            if not block.open:
                return
            block.open = False
            self._open.remove(block)
            self._release()

    def install(self, executor: Any, options: Mapping[str, Any] | None = None) -> Block | None:
        """Make ``executor`` (with ``options``) the process-wide fallback; return the
        installation it replaced."""
        with self._lock:
            previous = self._installed
            if previous is None:
                self._hold()
            else:
                previous.open = False
            self._installed = Block(executor, options)
            return previous

    def uninstall(self) -> Block | None:
        """Undo :meth:`install`; return the installation removed (``None``: none was there)."""
        with self._lock:
            previous = self._installed
            if previous is None:
                return None
            previous.open = False
            self._installed = None
            self._release()
            return previous

    def reset(self) -> None:
        """Close every block and the installation, then deactivate (for tests and at exit)."""
        with self._lock:
            held = bool(self._open) or self._installed is not None
            for block in self._open:
                block.open = False
            self._open.clear()
            if self._installed is not None:
                self._installed.open = False
                self._installed = None
            if held and self._deactivate is not None:
                self._deactivate()

    # -- queries -----------------------------------------------------------------------------

    def current(self) -> Any:
        """The executor an autotune starting now, in this context, uses: see the module rule."""
        block = self.current_block()
        return OFF if block is None else block.executor

    def current_block(self) -> Block | None:
        """The block (or installation) whose executor and options an autotune starting now, in
        this context, uses; ``None``: none (:data:`OFF`)."""
        for block in reversed(self._own.get()):
            if block.open:
                return block
        with self._lock:
            if self._open:
                return self._open[-1]
            return self._installed

    def active(self) -> bool:
        """Whether any block or an installation is open (the integration is patched)."""
        with self._lock:
            return bool(self._open) or self._installed is not None

    def installation(self) -> Block | None:
        """The installation, if any."""
        with self._lock:
            return self._installed

    def open_blocks(self) -> tuple[Block, ...]:
        """The open blocks, oldest first (the installation not included)."""
        with self._lock:
            return tuple(self._open)

    # -- the holder count --------------------------------------------------------------------

    def _holders(self) -> int:
        return len(self._open) + (self._installed is not None)

    def _hold(self) -> None:
        if self._holders() == 0:
            assert self._activate is not None or self._connected_by is None, (
                f"{self._connected_by} is not imported"
            )
            if self._activate is not None:
                self._activate()  # may raise: nothing has been opened yet

    def _release(self) -> None:
        if self._holders() == 0 and self._deactivate is not None:
            self._deactivate()
