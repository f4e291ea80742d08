"""The warm templates' lifecycle, as decisions: which template serves a worker, when one starts,
what its messages mean, when a kind falls back to fresh interpreters. (The template process
itself, which runs the initializer and forks workers, is :mod:`._fork_server`.)

A :class:`TemplateLifecycle` holds no socket and starts no process: the hub calls it with the
hub's lock held, on whatever thread saw the event (a launch job, the monitor reading a
template's message, the reaper), and the launcher (:mod:`._launcher`) carries out the decisions
it returns (:data:`Decision`) after the lock is released — start a process, send
``ForkWorker`` requests, watch a pid, fail a start. So every rule here can be tested by feeding
it events (``tests/test_templates.py``).

Lifecycle of the template of one worker kind (the key is the kind's pickled initializer)::

    route(worker) ── none alive ──► new template, state starting: StartTemplate
        │                           the worker waits in template.pending
        ├── template starting ────► the worker waits in template.pending
        └── template idle ────────► AskFork(template, [worker])
    hello(template)          ──► AskFork(template, every worker pending)
    init_failed(template)    ──► FailStart for every worker pending (the initializer fails in
                                 every worker of the kind)
    Forked(token, pid)       ──► the worker leaves pending, gets its pid: Watch(pid)
    ForkRefused(token, why)  ──► the kind falls back for good: StartInterpreter for it and every
                                 worker pending (Refused(why) the first time, to be logged)
    Exited(pid, code)        ──► exit code kept for exit_code_of(); a worker still starting with
                                 that pid died before hello: DiedStarting
    gone(template)           ──► its pending workers are routed again (a new template); after
                                 TEMPLATE_FAILURES_BEFORE_FALLBACK deaths with work pending (or
                                 before its hello) the kind falls back to interpreters

Timer rule: a template never idles out while a worker it forked lives or one waits for a fork
(:meth:`TemplateLifecycle.holds`); otherwise it expires like any idle worker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from ._messages import Exited, Forked, ForkRefused
from ._state import WorkerHandle

TEMPLATE_FAILURES_BEFORE_FALLBACK = 2
"""A template that dies this many times without serving a fork is given up for its kind:
workers of that kind then start as fresh interpreters."""

EXIT_CODES_KEPT = 10_000
"""Exit codes of template-forked workers kept until asked for; nobody asks for those of workers
stopped on purpose, so the oldest are dropped beyond this many."""


class StartTemplate(NamedTuple):
    """Register ``template`` (state starting) and start its interpreter."""

    template: WorkerHandle


class AskFork(NamedTuple):
    """Send ``template`` one ``ForkWorker`` request per worker of ``workers``."""

    template: WorkerHandle
    workers: list[WorkerHandle]


class StartInterpreter(NamedTuple):
    """Start ``worker`` as a fresh interpreter: its kind has no template."""

    worker: WorkerHandle


class Watch(NamedTuple):
    """A template forked process ``pid``: the guardian must kill it if the parent dies."""

    pid: int


class FailStart(NamedTuple):
    """``worker`` cannot start: ``error`` says why."""

    worker: WorkerHandle
    error: BaseException


class DiedStarting(NamedTuple):
    """``worker`` exited with ``code`` before it said hello."""

    worker: WorkerHandle
    code: int


class Refused(NamedTuple):
    """A kind fell back to interpreters for the first time, for ``reason`` (to be logged)."""

    reason: str


Decision = StartTemplate | AskFork | StartInterpreter | Watch | FailStart | DiedStarting | Refused


class TemplateLifecycle:
    """The warm template of each worker kind and the rules of their lifecycle (hub lock held)."""

    def __init__(self, new_capture_path: Callable[[], str]) -> None:
        self._new_capture_path = new_capture_path
        self.by_key: dict[bytes, WorkerHandle] = {}  # the live template of each kind
        self._refusals: dict[bytes, str] = {}  # kinds that start as interpreters, and why
        self._deaths: dict[bytes, int] = {}  # template deaths in a row, by kind
        self._exit_codes: dict[int, int] = {}  # template-forked workers' exit codes, by pid

    def refusal(self, key: bytes) -> str | None:
        """Why workers of kind ``key`` start as interpreters, or ``None``."""
        return self._refusals.get(key)

    def route(self, worker: WorkerHandle) -> list[Decision]:
        """How to start ``worker`` (``start="template"``): from its kind's template, starting
        one if none is alive, or as an interpreter once the kind has fallen back."""
        if worker.is_dead():
            return []
        key = worker.template_key
        if key in self._refusals:
            return [StartInterpreter(worker)]
        template = self.by_key.get(key)
        if template is not None and not template.is_dead():
            template.pending.append(worker)
            return [AskFork(template, [worker])] if template.state == "idle" else []
        template = WorkerHandle(
            "template",
            key,
            self._new_capture_path(),
            idle_timeout_s=worker.idle_timeout_s,
            template_key=key,
        )
        self.by_key[key] = template
        template.pending.append(worker)
        return [StartTemplate(template)]

    def hello(self, template: WorkerHandle) -> list[Decision]:
        """``template`` is ready: ask it for every worker waiting on it."""
        return [AskFork(template, list(template.pending))] if template.pending else []

    def init_failed(self, template: WorkerHandle, error: BaseException) -> list[Decision]:
        """``template``'s initializer raised: it would in every worker of the kind."""
        waiting, template.pending = template.pending, []
        return [FailStart(worker, error) for worker in waiting]

    def message(
        self,
        template: WorkerHandle,
        message: Forked | ForkRefused | Exited,
        starting: Mapping[str, WorkerHandle],
    ) -> list[Decision]:
        """A message from ``template``; ``starting``: the hub's workers not yet ready, by
        token."""
        if isinstance(message, Exited):
            return self._exited(template, message, starting)
        worker = starting.get(message.token)
        if worker is not None and worker in template.pending:
            template.pending.remove(worker)
        if isinstance(message, Forked):
            template.children += 1
            self._deaths.pop(template.key, None)
            if worker is not None:
                worker.pid = message.pid
                worker.forked_by = template
            return [Watch(message.pid)]
        first = template.key not in self._refusals
        self._refusals[template.key] = message.reason
        pending, template.pending = template.pending, []
        decisions: list[Decision] = [Refused(message.reason)] if first else []
        others = [w for w in (worker, *pending) if w is not None]
        return decisions + [StartInterpreter(w) for w in others]

    def _exited(
        self, template: WorkerHandle, message: Exited, starting: Mapping[str, WorkerHandle]
    ) -> list[Decision]:
        self._exit_codes[message.pid] = message.code
        if len(self._exit_codes) > EXIT_CODES_KEPT:
            self._exit_codes.pop(next(iter(self._exit_codes)))
        template.children = max(0, template.children - 1)
        return [DiedStarting(w, message.code) for w in starting.values() if w.pid == message.pid]

    def take_exit_code(self, pid: int) -> int | None:
        """The exit code its template reported for worker ``pid`` (once), if it did yet."""
        return self._exit_codes.pop(pid, None)

    def gone(self, template: WorkerHandle, *, said_hello: bool, relaunch: bool) -> list[Decision]:
        """``template`` ended (a forked worker never depends on it). Its pending workers are
        routed again when ``relaunch``; repeated deaths make the kind fall back."""
        self.forget(template)
        pending, template.pending = template.pending, []
        if not said_hello or pending:
            deaths = self._deaths.get(template.key, 0) + 1
            self._deaths[template.key] = deaths
            if deaths >= TEMPLATE_FAILURES_BEFORE_FALLBACK:
                self._refusals.setdefault(template.key, f"its warm template died {deaths} times")
        if not relaunch:
            return []
        return [decision for worker in pending for decision in self.route(worker)]

    def forget(self, template: WorkerHandle) -> None:
        """``template`` is dead: the next worker of its kind needs a new one."""
        if self.by_key.get(template.key) is template:
            del self.by_key[template.key]

    def drop_pending(self, worker: WorkerHandle) -> None:
        """``worker`` is dead before its template forked it: it never will be."""
        template = self.by_key.get(worker.template_key)
        if template is not None and worker in template.pending:
            template.pending.remove(worker)

    @staticmethod
    def holds(worker: WorkerHandle) -> bool:
        """The timer rule: a template lives while a worker it forked does, or one waits."""
        return worker.kind == "template" and bool(worker.children or worker.pending)

    def unused(self, in_use: set[bytes]) -> list[WorkerHandle]:
        """Templates of kinds no live worker came from, with nothing pending: only memory."""
        return [t for k, t in self.by_key.items() if k not in in_use and not t.pending]
