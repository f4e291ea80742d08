"""The one scope rule every integration's ``use()``/``install()`` follows (``_scope.Scope``)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from precompile_executor._scope import OFF, Scope

pytestmark = pytest.mark.timeout(30)

WAIT_S = 10.0


def _on_thread(fn):
    """Run ``fn`` on a fresh thread (a fresh, empty context) and return what it returned."""
    box = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    return box[0]


def test_a_block_is_seen_by_every_thread_while_open():
    scope = Scope("t")
    started_before = threading.Event()
    go = threading.Event()
    seen = []

    def existing_thread():
        started_before.set()
        assert go.wait(WAIT_S)
        seen.append(scope.current())

    early = threading.Thread(target=existing_thread)
    early.start()
    assert started_before.wait(WAIT_S)
    assert scope.current() is OFF
    block = scope.enter("ex")
    try:
        assert scope.current() == "ex"
        assert _on_thread(scope.current) == "ex"
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(scope.current).result(WAIT_S) == "ex"
        go.set()
        early.join(WAIT_S)
        assert seen == ["ex"]
    finally:
        scope.exit(block)
    assert scope.current() is OFF
    assert _on_thread(scope.current) is OFF


def test_the_innermost_block_of_this_context_wins_and_others_follow_the_newest():
    scope = Scope("t")
    outer = scope.enter("outer")
    entered = threading.Event()
    leave = threading.Event()
    seen_inside = []

    def other_block():
        block = scope.enter("other")
        seen_inside.append(scope.current())
        entered.set()
        assert leave.wait(WAIT_S)
        seen_inside.append(scope.current())
        scope.exit(block)

    thread = threading.Thread(target=other_block)
    thread.start()
    try:
        assert entered.wait(WAIT_S)
        # This context's own block wins here; a thread with no block follows the newest.
        assert scope.current() == "outer"
        assert _on_thread(scope.current) == "other"
        inner = scope.enter("inner")
        assert scope.current() == "inner"
        assert _on_thread(scope.current) == "inner"
        scope.exit(inner)
        assert scope.current() == "outer"
        leave.set()
        thread.join(WAIT_S)
        assert seen_inside == ["other", "other"]
        assert _on_thread(scope.current) == "outer"
    finally:
        leave.set()
        scope.exit(outer)
    assert scope.current() is OFF


def test_blocks_may_close_out_of_order():
    scope = Scope("t")
    first = scope.enter("first")
    ctx = contextvars.copy_context()
    second = ctx.run(scope.enter, "second")
    scope.exit(first)
    assert scope.current() == "second"  # this context's block is closed: the newest open one
    assert ctx.run(scope.current) == "second"
    ctx.run(scope.exit, second)
    assert scope.current() is OFF


def test_install_is_the_fallback_and_blocks_take_precedence():
    scope = Scope("t")
    scope.install("installed")
    try:
        assert _on_thread(scope.current) == "installed"
        block = scope.enter("block")
        assert _on_thread(scope.current) == "block"
        scope.exit(block)
        assert scope.install("again").executor == "installed"
        assert scope.current() == "again"
    finally:
        scope.uninstall()
    assert scope.current() is OFF
    assert scope.uninstall() is None


def test_asyncio_tasks_keep_the_block_they_were_created_in():
    scope = Scope("t")

    async def main():
        block = scope.enter("ex")
        task = asyncio.create_task(asyncio.sleep(0, result=None))
        await task
        seen = await asyncio.create_task(_current_later())
        scope.exit(block)
        return seen

    async def _current_later():
        return scope.current()

    assert asyncio.run(main()) == "ex"


def test_activate_runs_for_the_first_holder_and_deactivate_for_the_last():
    calls = []
    scope = Scope("t", activate=lambda: calls.append("on"), deactivate=lambda: calls.append("off"))
    a = scope.enter(None)
    scope.install(None)
    b = scope.enter(None)
    assert calls == ["on"]
    scope.exit(a)
    scope.uninstall()
    assert calls == ["on"]
    scope.exit(b)
    assert calls == ["on", "off"]
    scope.exit(b)  # twice: nothing
    assert calls == ["on", "off"]


def test_a_refused_activation_opens_nothing():
    def refuse():
        raise RuntimeError("unsupported")

    scope = Scope("t", activate=refuse)
    with pytest.raises(RuntimeError, match="unsupported"):
        scope.enter("ex")
    with pytest.raises(RuntimeError, match="unsupported"):
        scope.install("ex")
    assert not scope.active()
    assert scope.current() is OFF


def test_a_scope_connected_by_a_seam_opens_nothing_before_the_seam_connects_it():
    calls = []
    scope = Scope("t", connected_by="some.seam")
    with pytest.raises(AssertionError, match="some.seam is not imported"):
        scope.enter("ex")
    assert not scope.active()
    scope.connect(lambda: calls.append("on"), lambda: calls.append("off"))
    block = scope.enter("ex")
    scope.exit(block)
    assert calls == ["on", "off"]


def test_reset_closes_everything_once():
    calls = []
    scope = Scope("t", deactivate=lambda: calls.append("off"))
    block = scope.enter("ex")
    scope.install("ex")
    scope.reset()
    assert calls == ["off"]
    assert scope.current() is OFF
    scope.exit(block)  # its owner exits later: nothing happens
    scope.reset()
    assert calls == ["off"]
