"""What the per-task fast paths keep true (docs/design.md, "Per-task overhead").

A task's captured output is its own even though the capture file is emptied only when a task
wrote something; a module's function is pickled once per function object, but never a stale
one; a function pickled by value is loaded once per worker and reused, like the stdlib pool's
module functions; the worker's frame reader gets every message whole, small or large.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import sys
import types
from collections.abc import Iterator
from multiprocessing.connection import Connection

import cloudpickle
import crashers
import pytest

from precompile_executor import PrecompileExecutor, RemoteError
from precompile_executor._executor import pickle_arguments, pickle_function
from precompile_executor._worker import FrameReader

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
        import threading

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
