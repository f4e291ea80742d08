"""The executor starts the longest predicted task first; the timeline says when each step ran."""

from __future__ import annotations

import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from cost_helpers import broken_estimate, hinted, hinted_features, sleep_for

from precompile_executor import PrecompileExecutor, TaskTimeline

pytestmark = pytest.mark.timeout(60)

WAIT_S = 30.0


def _start_order(records: tuple[TaskTimeline, ...]) -> list[int]:
    started = [r for r in records if r.started is not None]
    return [r.task_id for r in sorted(started, key=lambda r: r.started or 0.0)]


def _inputs_in_start_order(records: tuple[TaskTimeline, ...], inputs: list[Any]) -> list[Any]:
    """The map inputs in the order their tasks started (task ids follow submission order; the
    timeline holds futures weakly, and map() drops each as it yields it)."""
    first = min(r.task_id for r in records)
    return [inputs[i - first] for i in _start_order(records)]


def _labels_in_start_order(executor: PrecompileExecutor, futures: list[Future[Any]]) -> list[Any]:
    for f in futures:
        f.result(timeout=WAIT_S)
    by_future = {r.future: r for r in executor.timeline()}
    records = sorted((by_future[f] for f in futures), key=lambda r: r.started or 0.0)
    return [r.future.result(timeout=WAIT_S) for r in records]


def test_map_starts_the_longest_predicted_first_and_yields_in_input_order() -> None:
    with PrecompileExecutor(1) as executor:
        executor.warm_up(timeout=WAIT_S)
        labels = ["short", "long", "middle", "tiny"]
        hints = [0.1, 3.0, 1.0, 0.01]
        assert list(executor.map(hinted, labels, hints, timeout=WAIT_S)) == labels
        records = executor.timeline()
    assert _inputs_in_start_order(records, labels) == ["long", "middle", "short", "tiny"]


def test_an_options_cost_hint_orders_a_batch() -> None:
    with PrecompileExecutor(1) as executor:
        executor.warm_up(timeout=WAIT_S)
        with executor.batch():
            futures = [executor.options(cost=c).submit(str, c) for c in (0.5, 2.0, 1.0)]
        for f in futures:
            f.result(timeout=WAIT_S)
        assert _labels_in_start_order(executor, futures) == ["2.0", "1.0", "0.5"]


def test_an_options_cost_hint_wins_over_the_callables_estimator() -> None:
    with PrecompileExecutor(1) as executor:
        executor.warm_up(timeout=WAIT_S)
        with executor.batch():
            a = executor.submit(hinted, "a", 5.0)
            b = executor.options(cost=9.0).submit(hinted, "b", 1.0)
        assert _labels_in_start_order(executor, [a, b]) == ["b", "a"]


def test_priority_overrides_the_predicted_cost() -> None:
    with PrecompileExecutor(1) as executor:
        executor.warm_up(timeout=WAIT_S)
        with executor.batch():
            long = executor.submit(hinted, "long", 100.0)
            urgent = executor.options(priority=1).submit(hinted, "urgent", 0.001)
        assert _labels_in_start_order(executor, [long, urgent]) == ["urgent", "long"]


def test_a_broken_estimator_does_not_fail_the_task() -> None:
    with PrecompileExecutor(1) as executor:
        assert executor.submit(broken_estimate, 3).result(timeout=WAIT_S) == 3


def test_history_orders_a_second_map_without_hints() -> None:
    delays = [0.0, 0.4, 0.0, 0.2]
    with PrecompileExecutor(1) as executor:
        executor.warm_up(timeout=WAIT_S)
        list(executor.map(sleep_for, delays, timeout=WAIT_S))
        first = _start_order(executor.timeline())
        list(executor.map(sleep_for, delays, timeout=WAIT_S))
        records = executor.timeline()[len(delays) :]
    assert first == sorted(first)  # nothing known yet: input order
    assert _inputs_in_start_order(records, delays) == [0.4, 0.2, 0.0, 0.0]


def test_history_is_written_and_read_back_by_a_new_executor(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    delays = [0.0, 0.3, 0.1]
    with PrecompileExecutor(1, cost_history=path) as executor:
        list(executor.map(sleep_for, delays, timeout=WAIT_S))
    assert path.exists()  # written once the executor had nothing left to do
    copy = tmp_path / "copy.json"  # a file no model of this process has loaded yet
    shutil.copy(path, copy)
    with PrecompileExecutor(1, cost_history=copy) as executor:
        executor.warm_up(timeout=WAIT_S)
        list(executor.map(sleep_for, delays, timeout=WAIT_S))
        records = executor.timeline()
    assert _inputs_in_start_order(records, delays) == [0.3, 0.1, 0.0]


def test_a_corrupt_history_file_is_ignored_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{")
    with pytest.warns(RuntimeWarning, match="cost history"):
        executor = PrecompileExecutor(1, cost_history=path)
    with executor:
        assert list(executor.map(sleep_for, [0.0], timeout=WAIT_S)) == [0.0]
    assert path.read_text().startswith('{"version"')


def test_features_from_an_estimator_key_the_history() -> None:
    with PrecompileExecutor(1) as executor:
        executor.submit(hinted_features, "x", 1.0).result(timeout=WAIT_S)
        (record,) = executor.timeline()
    assert record.function == "cost_helpers:hinted_features"
    assert record.features == "label='x'"
    assert record.predicted_s == 1.0


def test_timeline_has_one_record_per_task_with_monotone_steps() -> None:
    with PrecompileExecutor(2) as executor:
        results = list(executor.map(sleep_for, [0.05] * 6, timeout=WAIT_S))
        fork = executor.options(path="fork").submit(sleep_for, 0.0)
        fork.result(timeout=WAIT_S)
        records = executor.timeline()
    assert results == [0.05] * 6
    assert len(records) == 7 and len({r.task_id for r in records}) == 7
    for r in records:
        steps = [r.queued, r.sent, r.started, r.done, r.decoded, r.settled]
        assert all(t is not None for t in steps), r
        assert steps == sorted(steps), r  # type: ignore[type-var]
        assert r.ok and r.worker_pid > 0 and r.run_s is not None and r.run_s >= 0
    assert {r.path for r in records} == {"spawn", "fork"}


def test_a_task_of_unknown_cost_starts_with_the_longest_known() -> None:
    """No hint, no estimator, no history: it could be long (a first call, a hang), and a long task
    started late holds the batch for its whole duration, so it is placed as the longest known
    task, not as an average one (ties keep submission order)."""
    with PrecompileExecutor(1) as executor:
        executor.warm_up(timeout=WAIT_S)
        with executor.batch():
            futures = [executor.options(cost=c).submit(str, c) for c in (0.5, 2.0, 1.0, 0.2)]
            futures.append(executor.submit(str, "unknown"))
        for f in futures:
            f.result(timeout=WAIT_S)
        assert _labels_in_start_order(executor, futures) == ["2.0", "unknown", "1.0", "0.5", "0.2"]
