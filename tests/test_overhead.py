"""What the per-task fast paths keep true (docs/design.md, "Per-task overhead").

A task's captured output is its own even though the capture file is emptied only when a task
wrote something; a module's function is pickled once per function object, but never a stale
one; a function pickled by value is loaded once per worker and reused, like the stdlib pool's
module functions; the worker's frame reader gets every message whole, small or large, and the
frames written without ``Connection.send_bytes`` are its bytes; the monitor writes a worker's
next task before it settles the last one's future; a task keeps no instance dict, and a queued
task holds few objects the garbage collector traces; the cost history forgets its least
recently observed keys.
"""

from __future__ import annotations

import concurrent.futures
import gc
import os
import pickle
import socket
import struct
import sys
import threading
import types
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import crashers
import pytest

from precompile_executor import PrecompileExecutor, RemoteError
from precompile_executor._costs import MAX_KEYS, CostKey, CostModel
from precompile_executor._executor import pickle_arguments, pickle_function
from precompile_executor._processes import Task
from precompile_executor._wire import FrameReader, send_frames, write_frame, write_frames

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def executor() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(1) as ex:
        yield ex


def test_output_of_a_silent_or_failing_task_is_only_its_own(executor: PrecompileExecutor) -> None:
    shown = executor.options(with_output=True)
    assert shown.submit(crashers.square, 3).result(timeout=30).output == ""
    assert executor.submit(crashers.print_and_return, "earlier").result(timeout=30) == "EARLIER"
    with pytest.raises(RemoteError) as info:
        executor.submit(crashers.write_fd2_then_raise).result(timeout=30)
    assert "earlier" not in info.value.captured_output
    assert "ptxas fatal: written at fd level" in info.value.captured_output
    assert shown.submit(crashers.square, 4).result(timeout=30).output == ""
    done = shown.submit(crashers.print_and_return, "later").result(timeout=30)
    assert "later\n" in done.output and "earlier" not in done.output


def test_a_function_pickled_by_value_is_reused_on_its_worker(
    executor: PrecompileExecutor,
) -> None:
    seen: list[int] = []

    def count() -> int:
        seen.append(1)  # the worker's copy of the list, kept with the function
        return len(seen)

    assert [executor.submit(count).result(timeout=30) for _ in range(3)] == [1, 2, 3]
    seen.append(1)  # changed here: pickles to other bytes, so the worker loads it afresh
    assert executor.submit(count).result(timeout=30) == 2


def test_closures_over_different_values_stay_apart(executor: PrecompileExecutor) -> None:
    def make(k: int) -> types.FunctionType:
        return lambda: k  # type: ignore[return-value]

    assert [executor.submit(make(k)).result(timeout=30) for k in (1, 2, 1, 3)] == [1, 2, 1, 3]
    assert [executor.submit(f).result(timeout=30) for f in map(make, range(20))] == list(range(20))


def test_a_module_function_is_pickled_once_but_never_stale() -> None:
    module = types.ModuleType("overhead_probe")
    exec("def f():\n    return 1\n", module.__dict__)  # noqa: S102 - a module made for the test
    sys.modules[module.__name__] = module
    try:
        first = module.f
        blob = pickle_function(first)
        assert blob == cloudpickle.dumps(first)
        assert pickle_function(first) is blob  # kept
        exec("def f():\n    return 2\n", module.__dict__)  # noqa: S102 - the name now names another
        assert pickle_function(first) != blob  # no longer importable by name: pickled by value
        assert cloudpickle.loads(pickle_function(first))() == 1
        cloudpickle.register_pickle_by_value(module)
        try:
            assert cloudpickle.loads(pickle_function(module.f))() == 2
            assert pickle_function(module.f) == cloudpickle.dumps(module.f)
        finally:
            cloudpickle.unregister_pickle_by_value(module)
    finally:
        del sys.modules[module.__name__]


def test_a_function_pickled_by_value_is_pickled_once_while_what_it_uses_is_unchanged() -> None:
    """A function of a module no worker can import (``__main__``'s, here one made by exec) is
    pickled by value; its bytes are kept while its code, globals and cells are the same
    immutable objects, and made again when one is rebound or could change inside."""
    namespace: dict[str, Any] = {"__name__": "no_such_module"}
    source = "K = 1\nSEEN = []\ndef f(x=2):\n    return K + x\ndef g():\n    SEEN.append(1)\n    return len(SEEN)\n"
    exec(source, namespace)  # noqa: S102 - functions made for the test
    f, g = namespace["f"], namespace["g"]
    blob = pickle_function(f)
    assert blob == cloudpickle.dumps(f) and pickle_function(f) is blob  # kept
    namespace["K"] = 10  # a global it uses, rebound: pickled again, the new value in it
    assert pickle_function(f) is not blob and cloudpickle.loads(pickle_function(f))() == 12
    f.__defaults__ = (5,)
    assert cloudpickle.loads(pickle_function(f))() == 15
    assert pickle_function(g) is not pickle_function(g)  # it uses a list: never kept
    namespace["SEEN"].append(1)
    assert cloudpickle.loads(pickle_function(g))() == 2  # the list as it is now


def test_plain_arguments_pickle_to_cloudpickle_s_bytes() -> None:
    calls = [(crashers.square, (1, 2.5, "s", b"b", None, True), {})]
    assert pickle_arguments(calls) == cloudpickle.dumps([(a, k) for _, a, k in calls], 5)
    local = [(crashers.square, (lambda: 1,), {}), (crashers.square, (1,), {"k": 2})]
    loaded = pickle.loads(pickle_arguments(local))
    assert loaded[0][0][0]() == 1 and loaded[1] == ((1,), {"k": 2})


def test_the_frame_reader_gets_every_message_whole() -> None:
    a, b = socket.socketpair()
    with a, b:
        writer = Connection(a.detach())
        reader = FrameReader(b.fileno())
        big = os.urandom(3 << 20)
        writer.send_bytes(b"one")
        writer.send_bytes(b"")
        writer.send_bytes(b"two")
        assert [reader.next(), reader.next(), reader.next()] == [b"one", b"", b"two"]
        # a large frame arrives in many reads, while the writer is still writing it
        sender = threading.Thread(target=lambda: (writer.send_bytes(big), writer.send_bytes(b"x")))
        sender.start()
        assert reader.next() == big
        assert reader.next() == b"x"
        sender.join(timeout=30)
        # a frame cut by the end of the stream is an EOFError, as recv_bytes raises
        os.write(writer.fileno(), struct.pack("!i", 10) + b"abc")
        writer.close()
        with pytest.raises(EOFError):
            reader.next()


def test_the_frame_reader_says_whether_a_whole_frame_waits() -> None:
    """``has_frame()``: the worker writes a Done with the next task's Started only when
    ``next()`` will not block."""
    a, b = socket.socketpair()
    with a, b:
        reader = FrameReader(b.fileno())
        assert not reader.has_frame()
        write_frames(a.fileno(), [b"one", b"two"])
        assert reader.next() == b"one"  # both read in one read
        assert reader.has_frame()
        assert reader.next() == b"two"
        assert not reader.has_frame()
        os.write(a.fileno(), struct.pack("!i", 5) + b"abc")
        reader.data, reader.pos = reader.data + os.read(b.fileno(), 100), reader.pos
        assert not reader.has_frame()  # a frame cut short
        os.write(a.fileno(), b"de")
        assert reader.next() == b"abcde"


@pytest.mark.parametrize("size", [0, 3, 16384, 16385, 1 << 20])
@pytest.mark.parametrize("write", [write_frame, lambda fd, data: send_frames(fd, [b"a", data])])
def test_a_written_frame_is_send_bytes_bytes(size: int, write: Any) -> None:
    """write_frame() writes what Connection.send_bytes writes: recv_bytes reads it back."""
    payload = os.urandom(size)
    a, b = socket.socketpair()
    with a, b:
        reader = Connection(b.detach())
        sender = threading.Thread(target=write, args=(a.fileno(), payload))
        sender.start()  # a large frame fills the socket buffer before the reader drains it
        if write is not write_frame:
            assert reader.recv_bytes() == b"a"
        assert reader.recv_bytes() == payload
        sender.join(timeout=30)
        reader.close()


def test_the_next_task_is_on_its_worker_before_the_last_result_is_settled() -> None:
    """One worker, a queue behind it: each Done's next Run is written before that Done's
    future is set (Hub.run: settles last; on the monitor, at the end of its round)."""
    with PrecompileExecutor(1) as ex:
        ex.warm_up(timeout=60)
        scheduler = ex._backend
        hub = scheduler.hub
        events: list[tuple[str, int]] = []
        write, settle_now = hub._write_runs, scheduler.settler.settle_now

        def noted_write(worker: Any, tasks: list[Task]) -> None:
            events.extend(("send", task.id) for task in tasks)
            write(worker, tasks)

        def noted_settle(task: Task, outcome: Any) -> bool:
            events.append(("settle", task.id))
            return settle_now(task, outcome)

        hub._write_runs = noted_write  # type: ignore[method-assign]
        scheduler.settler.settle_now = noted_settle  # type: ignore[method-assign]
        try:
            assert list(ex.map(crashers.square, range(4), timeout=60)) == [0, 1, 4, 9]
        finally:
            del hub._write_runs, scheduler.settler.settle_now
    ids = [i for kind, i in events if kind == "send"]
    assert len(ids) == 4
    order = [(kind, ids.index(i)) for kind, i in events]
    # Task k+1 is written before task k is settled: right after k's Done, or earlier when it
    # was sent ahead of k (docs/design.md, "Sending ahead"); settles keep the tasks' order.
    for k in range(3):
        assert order.index(("send", k + 1)) < order.index(("settle", k)), order
    assert [i for kind, i in order if kind == "settle"] == [0, 1, 2, 3], order


def test_a_task_keeps_no_instance_dict() -> None:
    """One Task per task: slotted, so no 35-key dict is built and traced for each."""
    task = Task(None, None, "spawn", None, b"", 1, False, None, 0.0, False)  # type: ignore[arg-type]
    assert not hasattr(task, "__dict__")
    with pytest.raises(AttributeError):
        task.unknown_field = 1  # type: ignore[attr-defined]


def _traced_objects() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_a_queued_task_holds_at_most_two_traced_objects_beside_its_future(
    tmp_path: Any,
) -> None:
    """Every object a queued task holds is traced by each full collection while the queue is
    long (a 20,000-task map with torch loaded: 3–4 collections of ~0.1 s each, the map's largest
    cost: docs/design.md, "Per-task overhead"). Beside its standard ``Future`` (and that future's
    ``Condition``, lock and lists) a task holds its ``Task`` and its cost key: the cancel watch
    is one callback per executor, and a heap entry holds only numbers."""
    release = tmp_path / "release"
    n = 2000
    with PrecompileExecutor(1) as ex:
        ex.warm_up(timeout=30)
        blocker = ex.submit(crashers.wait_for_file, str(release), 30.0)
        futures_before = _traced_objects()
        bare = [concurrent.futures.Future() for _ in range(n)]
        per_future = (_traced_objects() - futures_before) / n
        del bare
        before = _traced_objects()
        queued = [ex.submit(crashers.square, i) for i in range(n)]
        per_task = (_traced_objects() - before) / n
        release.write_text("go")
        assert blocker.result(timeout=30) is True
        assert [f.result(timeout=30) for f in queued] == [i * i for i in range(n)]
    assert round(per_task - per_future) <= 2, (per_task, per_future)


def test_the_cost_history_forgets_its_least_recently_observed_keys() -> None:
    model = CostModel()
    keys = [CostKey("f", f"({i},)", None) for i in range(MAX_KEYS + 10)]
    for key in keys[:MAX_KEYS]:
        model.observe(key, 1.0)
    model.observe(keys[0], 3.0)  # observed again: now the most recent
    for key in keys[MAX_KEYS:]:
        model.observe(key, 2.0)
    assert model.estimate(keys[0]) == 2.0  # the mean of 1.0 and 3.0, kept
    assert model.estimate(keys[-1]) == 2.0
    function_mean = model.estimate(CostKey("f", "", None))  # what a key not kept gets
    assert function_mean not in (1.0, 2.0)
    forgotten = keys[1:11]  # the ten oldest once keys[0] was observed again
    assert all(model.estimate(k) == function_mean for k in forgotten)
    assert model.estimate(keys[11]) == 1.0
