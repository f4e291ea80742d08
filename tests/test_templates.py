"""The warm templates' lifecycle rules (:mod:`precompile_executor._processes`), fed events
directly: no socket, no process. The same rules with real templates: tests/test_contract.py and
the fault table in tests/test_faults.py."""

from __future__ import annotations

import itertools

import pytest

from precompile_executor._processes import (
    EXIT_CODES_KEPT,
    TEMPLATE_FAILURES_BEFORE_FALLBACK,
    AskFork,
    DiedStarting,
    FailStart,
    Refused,
    StartInterpreter,
    StartTemplate,
    TemplateLifecycle,
    Watch,
    WorkerHandle,
)
from precompile_executor._wire import Exited, Forked, ForkRefused

pytestmark = pytest.mark.timeout(10)

KIND = b"pickled initializer"


def _templates() -> TemplateLifecycle:
    paths = (f"/nonexistent/out-{i}.txt" for i in itertools.count())
    return TemplateLifecycle(lambda: next(paths))


def _worker(key: bytes = KIND) -> WorkerHandle:
    return WorkerHandle("spawn", key, "/nonexistent/w.txt", start="template", template_key=key)


def _started(templates: TemplateLifecycle, worker: WorkerHandle) -> WorkerHandle:
    """Route ``worker`` to a new template and return that template, now ready."""
    [decision] = templates.route(worker)
    assert isinstance(decision, StartTemplate)
    template = decision.template
    template.ready(0.0)
    return template


def test_the_first_worker_of_a_kind_starts_its_template_and_waits_for_it() -> None:
    templates = _templates()
    first, second = _worker(), _worker()
    [decision] = templates.route(first)
    assert isinstance(decision, StartTemplate)
    template = decision.template
    assert template.kind == "template"
    assert template.key == template.template_key == KIND
    assert templates.by_key[KIND] is template
    assert templates.route(second) == []  # the template is still starting: wait
    assert template.pending == [first, second]
    assert templates.hello(template) == [AskFork(template, [first, second])]


def test_a_ready_template_is_asked_at_once() -> None:
    templates = _templates()
    template = _started(templates, _worker())
    later = _worker()
    assert templates.route(later) == [AskFork(template, [later])]


def test_each_kind_has_its_own_template() -> None:
    templates = _templates()
    a = _started(templates, _worker(b"a"))
    [decision] = templates.route(_worker(b"b"))
    assert isinstance(decision, StartTemplate)
    assert decision.template is not a
    assert set(templates.by_key) == {b"a", b"b"}


def test_a_dead_worker_is_not_routed() -> None:
    templates = _templates()
    worker = _worker()
    worker.die(0.0)
    assert templates.route(worker) == []
    assert templates.by_key == {}


def test_forked_gives_the_worker_its_pid_and_watches_it() -> None:
    templates = _templates()
    worker = _worker()
    template = _started(templates, worker)
    decisions = templates.message(template, Forked(worker.token, 4242), {worker.token: worker})
    assert decisions == [Watch(4242)]
    assert worker.pid == 4242
    assert worker.forked_by is template
    assert template.pending == []
    assert template.children == 1
    assert templates.holds(template)  # the timer rule: lives while its child does


def test_a_worker_stopped_while_its_fork_was_asked_for_is_not_given_a_pid() -> None:
    templates = _templates()
    worker = _worker()
    template = _started(templates, worker)
    decisions = templates.message(template, Forked(worker.token, 4242), {})  # no longer starting
    assert decisions == [Watch(4242)]  # the process exists all the same
    assert worker.pid == 0
    assert template.children == 1


def test_exited_keeps_the_code_once_and_frees_the_template() -> None:
    templates = _templates()
    worker = _worker()
    template = _started(templates, worker)
    templates.message(template, Forked(worker.token, 77), {worker.token: worker})
    worker.ready(0.0)
    assert templates.message(template, Exited(77, -9), {}) == []
    assert template.children == 0
    assert not templates.holds(template)
    assert templates.take_exit_code(77) == -9
    assert templates.take_exit_code(77) is None  # asked once


def test_a_child_that_exits_before_its_hello_fails_its_start() -> None:
    templates = _templates()
    worker = _worker()
    template = _started(templates, worker)
    templates.message(template, Forked(worker.token, 78), {worker.token: worker})
    decisions = templates.message(template, Exited(78, 1), {worker.token: worker})
    assert decisions == [DiedStarting(worker, 1)]


def test_old_exit_codes_nobody_asked_for_are_dropped() -> None:
    templates = _templates()
    template = _started(templates, _worker())
    for pid in range(1, EXIT_CODES_KEPT + 2):
        templates.message(template, Exited(pid, 0), {})
    assert templates.take_exit_code(1) is None  # the oldest went
    assert templates.take_exit_code(EXIT_CODES_KEPT + 1) == 0


def test_a_refusal_falls_back_to_interpreters_for_good_and_is_logged_once() -> None:
    templates = _templates()
    first, second = _worker(), _worker()
    template = _started(templates, first)
    templates.route(second)
    starting = {first.token: first, second.token: second}
    decisions = templates.message(template, ForkRefused(first.token, "3 threads"), starting)
    assert decisions == [Refused("3 threads"), StartInterpreter(first), StartInterpreter(second)]
    assert template.pending == []
    assert templates.refusal(KIND) == "3 threads"
    third = _worker()
    assert templates.route(third) == [StartInterpreter(third)]
    # A refusal still in flight from the same template: not logged again.
    again = templates.message(template, ForkRefused(third.token, "3 threads"), {})
    assert again == []


def test_a_failed_initializer_fails_every_worker_waiting() -> None:
    templates = _templates()
    first, second = _worker(), _worker()
    [decision] = templates.route(first)
    assert isinstance(decision, StartTemplate)
    templates.route(second)
    error = RuntimeError("the initializer raised")
    decisions = templates.init_failed(decision.template, error)
    assert decisions == [FailStart(first, error), FailStart(second, error)]
    assert decision.template.pending == []


def test_a_dead_template_s_waiting_workers_go_to_a_new_template() -> None:
    templates = _templates()
    worker = _worker()
    template = _started(templates, worker)
    template.die(0.0)
    [decision] = templates.gone(template, said_hello=True, relaunch=True)
    assert isinstance(decision, StartTemplate)
    assert decision.template is not template
    assert decision.template.pending == [worker]
    assert templates.by_key[KIND] is decision.template
    assert templates.refusal(KIND) is None  # one death is not enough to give up


def test_a_template_that_dies_repeatedly_is_given_up_for_its_kind() -> None:
    templates = _templates()
    worker = _worker()
    decisions = templates.route(worker)
    for _ in range(TEMPLATE_FAILURES_BEFORE_FALLBACK):
        [start] = decisions
        assert isinstance(start, StartTemplate)
        start.template.die(0.0)
        decisions = templates.gone(start.template, said_hello=False, relaunch=True)
    assert decisions == [StartInterpreter(worker)]
    deaths = TEMPLATE_FAILURES_BEFORE_FALLBACK
    assert templates.refusal(KIND) == f"its warm template died {deaths} times"


def test_a_fork_resets_the_death_count() -> None:
    templates = _templates()
    worker = _worker()
    template = _started(templates, worker)
    template.die(0.0)
    [start] = templates.gone(template, said_hello=True, relaunch=True)
    assert isinstance(start, StartTemplate)
    start.template.ready(0.0)
    templates.message(start.template, Forked(worker.token, 5), {worker.token: worker})
    start.template.die(0.0)
    assert templates.gone(start.template, said_hello=False, relaunch=True) == []
    assert templates.refusal(KIND) is None  # one death since the fork


def test_an_idle_template_that_ends_is_not_a_death() -> None:
    templates = _templates()
    worker = _worker()
    template = _started(templates, worker)
    templates.message(template, Forked(worker.token, 5), {worker.token: worker})
    for _ in range(TEMPLATE_FAILURES_BEFORE_FALLBACK):
        template.die(0.0)
        assert templates.gone(template, said_hello=True, relaunch=True) == []
        template = _started(templates, _worker())
        template.pending.clear()
    assert templates.refusal(KIND) is None


def test_no_relaunch_when_the_hub_is_closing() -> None:
    templates = _templates()
    worker = _worker()
    template = _started(templates, worker)
    template.die(0.0)
    assert templates.gone(template, said_hello=True, relaunch=False) == []
    assert templates.by_key == {}


def test_unused_templates_are_those_no_live_worker_came_from() -> None:
    templates = _templates()
    a = _started(templates, _worker(b"a"))
    b = _started(templates, _worker(b"b"))
    a.pending.clear()
    b.pending.clear()
    assert templates.unused(in_use={b"a"}) == [b]
    b.pending.append(_worker(b"b"))
    assert templates.unused(in_use={b"a"}) == []  # a worker waits for it
    templates.forget(a)
    assert set(templates.by_key) == {b"b"}
