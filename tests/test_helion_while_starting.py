"""Configs measured in the autotuning process while Helion's benchmark subprocess starts
(``precompile_executor.helion._while_starting``; docs/helion.md, "Measured here while the
benchmark subprocess starts").

Real processes: the benchmark worker is Helion's own, started by the provider (or the spare),
its warm-up held back until the test releases it (``HeldWarmUp``: the worker is up and serving,
its cold start not over). Real fork-mode precompiles (sm_90, compile-only driver). Each
measurement is Helion's own ``_benchmark_function`` — its choice of path, its accuracy check,
its classification — with only the kernel and its timing standing in (no GPU here:
``benchmarks/_helion_cpu.py``, ``measured_on_the_cpu``), so a config's time is the same
wherever it is measured.
"""

# Helion's decorators are untyped.
# mypy: disable-error-code="untyped-decorator,no-untyped-def,no-untyped-call"
from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

helion = pytest.importorskip("helion")
torch = pytest.importorskip("torch")

from test_helion import _GPU_PRELUDE, _configs, _fork_batch, _run_script, gpu  # noqa: E402

import precompile_executor.helion as peh  # noqa: E402
from benchmarks._helion_cpu import (  # noqa: E402
    HeldWarmUp,
    Measurement,
    measured_on_the_cpu,
    measuring_provider,
)
from precompile_executor import PrecompileExecutor  # noqa: E402
from precompile_executor.helion import _bench_worker, _while_starting  # noqa: E402
from precompile_executor.helion._state import HelionStatistics  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WAIT_S = 180.0


@pytest.fixture
def executor() -> Iterator[PrecompileExecutor]:
    with PrecompileExecutor(2, initializer=peh.import_helion) as ex:
        yield ex


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    peh.state.reset()  # counts from zero
    yield
    left = peh.state.spare
    peh.state.reset()
    assert left is None, "a test left a spare benchmark worker"


def _timing(config: Any) -> float:
    """Each config's time, the same in either process: distinct, so the ranking is known."""
    return float(config["block_sizes"][0]) + config["num_warps"] / 100


def _held(monkeypatch: pytest.MonkeyPatch, gate: Path) -> None:
    """Every benchmark worker started from now on holds its warm-up until ``gate`` exists."""
    monkeypatch.setattr(_bench_worker, "WarmUp", functools.partial(HeldWarmUp, gate=str(gate)))


def _provider(bound: Any, args: Any, measurements: list[Measurement]) -> Any:
    from precompile_executor.helion._provider import StreamingBenchmarkProvider

    s = helion.Settings(
        autotune_precompile="fork", autotune_progress_bar=False, autotune_precompile_jobs=2
    )
    return measuring_provider(StreamingBenchmarkProvider, bound, args, s, _timing, measurements)


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {WAIT_S} s"
        time.sleep(0.05)


def _outcome(results: list[Any]) -> list[tuple[str, float]]:
    return [(str(r.status), float(r.perf)) for r in results]


@pytest.mark.timeout(400)
def test_while_the_subprocess_starts_configs_are_measured_here_then_in_the_subprocess(
    tmp_path: Path,
    executor: PrecompileExecutor,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The provider's worker is up but its warm-up has not answered: the first batch's configs
    are measured in the autotuning process (counted), without waiting for it. Once the warm-up
    answered, every later config goes to the worker process. The results equal those of the
    same configs measured all in the subprocess (``measure_while_worker_starts=False``, in an
    inner block: the scope rule carries the option), where every measurement waited for the
    warm-up."""
    caplog.set_level(logging.INFO, logger="precompile_executor.helion")
    gate = tmp_path / "released"
    _held(monkeypatch, gate)
    with _fork_batch(tmp_path) as (bound, args, _ctx), peh.use(executor):
        configs = _configs(bound, 4)
        with measured_on_the_cpu(bound, _timing) as measured:
            provider = _provider(bound, args, measured)
            try:
                early = provider.__dict__["_early_benchmark_worker"]
                provider.setup()
                first = provider.benchmark(configs[:2])
                assert early.starting()  # never waited for
                assert [(m.where, m.pid) for m in measured] == [("here", os.getpid())] * 2
                assert provider.while_starting.measured == 2
                assert peh.state.statistics() == HelionStatistics(2, 1)
                gate.touch()
                _until(lambda: not early.starting(), "warm")
                assert early.error is None
                second = provider.benchmark(configs[2:])
                assert [(m.where, m.pid) for m in measured[2:]] == [
                    ("subprocess", early.process.pid)
                ] * 2
                assert peh.state.statistics() == HelionStatistics(2, 1)  # nothing more here
            finally:
                provider.cleanup()
        mixed = first + second
        said = [m for m in caplog.messages if "measured in the autotuning" in m]
        assert len(said) == 1 and said[0].startswith("2 config(s)") and "after" in said[0]

        # The same configs, every measurement in the subprocess.
        gate.unlink()
        _configs(bound, 4)  # compiled again, in fresh children
        with (
            peh.use(executor, measure_while_worker_starts=False),
            measured_on_the_cpu(bound, _timing) as measured,
        ):
            provider = _provider(bound, args, measured)
            early = provider.__dict__["_early_benchmark_worker"]
            released = threading.Timer(1.0, gate.touch)
            released.start()
            try:
                provider.setup()
                alone = provider.benchmark(configs[:2]) + provider.benchmark(configs[2:])
            finally:
                released.join(WAIT_S)
                provider.cleanup()
    assert [(m.where, m.pid) for m in measured] == [("subprocess", early.process.pid)] * 4
    assert early.ended is not None and measured[0].at >= early.ended  # each one waited
    assert provider.while_starting.measured == 0
    assert peh.state.statistics() == HelionStatistics(2, 1)
    assert _outcome(mixed) == _outcome(alone)
    assert all(status == "ok" for status, _ in _outcome(mixed))


@pytest.mark.timeout(300)
def test_a_warm_spare_leaves_nothing_to_measure_here(
    tmp_path: Path, executor: PrecompileExecutor
) -> None:
    """``install()``'s spare, warm when the autotune starts: every config goes to it."""
    with _fork_batch(tmp_path) as (bound, args, _ctx), peh.use(executor):
        spare = _bench_worker.prestart("cpu", 30)  # what install() starts on a GPU machine
        assert spare is not None
        _until(lambda: not spare.starting(), "warm")
        assert spare.error is None
        with measured_on_the_cpu(bound, _timing) as measured:
            provider = _provider(bound, args, measured)
            try:
                assert provider.__dict__["_early_benchmark_worker"] is spare
                provider.setup()
                results = provider.benchmark(_configs(bound, 2))
            finally:
                provider.cleanup()
    assert [(m.where, m.pid) for m in measured] == [("subprocess", spare.process.pid)] * 2
    assert [r.status for r in results] == ["ok", "ok"]
    assert peh.state.statistics() == HelionStatistics(0, 0)


@pytest.mark.timeout(120)
def test_with_the_subprocess_off_nothing_changes(
    tmp_path: Path, executor: PrecompileExecutor
) -> None:
    """``autotune_benchmark_subprocess`` off: no worker starts, Helion measures here as it
    always does, and none of it counts as measured while a subprocess started."""
    with _fork_batch(tmp_path) as (bound, args, _ctx), peh.use(executor):
        with measured_on_the_cpu(bound, _timing) as measured:
            provider = _provider(bound, args, measured)
            provider.settings.autotune_benchmark_subprocess = False
            try:
                provider.setup()
                results = provider.benchmark(_configs(bound, 2))
            finally:
                provider.cleanup()
    assert [m.where for m in measured] == ["here", "here"]
    assert [r.status for r in results] == ["ok", "ok"]
    assert peh.state.statistics() == HelionStatistics(0, 0)


def test_the_option_follows_the_scope_rule(executor: PrecompileExecutor) -> None:
    """``measure_while_worker_starts`` travels with its block or installation: the innermost
    block of this context wins, then the installation; a bad value opens nothing."""
    assert _while_starting.allowed_now()
    peh.install(executor, measure_while_worker_starts=False)
    try:
        assert not _while_starting.allowed_now()
        with peh.use(executor):
            assert _while_starting.allowed_now()
            with peh.use(executor, measure_while_worker_starts=False):
                assert not _while_starting.allowed_now()
            assert _while_starting.allowed_now()
        assert not _while_starting.allowed_now()
    finally:
        peh.uninstall()
    with pytest.raises(TypeError, match="measure_while_worker_starts must be True or False"):
        with peh.use(executor, measure_while_worker_starts=1):  # type: ignore[arg-type]
            pass
    assert not peh.installed()


_GPU_SCRIPT = """
    if __name__ == "__main__":
        import functools, pathlib, tempfile
        from benchmarks._helion_cpu import HeldWarmUp
        from precompile_executor.helion import _bench_worker, _while_starting
        logging.basicConfig(level=logging.INFO)
        # The provider's worker holds its warm-up until 3 configs were measured here, and the
        # third waits for it to answer: the handover happens inside the autotune, after exactly
        # 3, whatever this machine's cold start takes.
        gate = pathlib.Path(tempfile.mkdtemp()) / "released"
        _bench_worker.WarmUp = functools.partial(HeldWarmUp, gate=str(gate))
        real_count = _while_starting.WhileStarting.count
        def count(self):
            real_count(self)
            if self.measured == 3:
                gate.touch()
                deadline = time.monotonic() + 300
                while self.early.starting() and time.monotonic() < deadline:
                    time.sleep(0.05)
        _while_starting.WhileStarting.count = count
        random.seed(0)
        x = torch.randn(2048, 2048, device="cuda", dtype=torch.float16); y = torch.randn_like(x)
        add.settings.autotune_precompile = "fork"
        add.settings.autotuner_fn = lambda k, a, **kw: RandomSearch(k, a, count=8)
        with peh.use(measure_while_worker_starts=os.environ["PE_MEASURE"] == "1"):
            if os.environ["PE_MEASURE"] == "0":
                gate.touch()  # every measurement waits for the warm-up, released at once
            best = add.autotune((x, y), force=True)
        torch.testing.assert_close(add(x, y), x + y)
        print("HERE", peh.state.statistics().measured_while_starting)
        print("BEST", best)
"""


@gpu
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("measure", ["1", "0"], ids=["measured-here", "opt-out"])
def test_gpu_configs_are_measured_here_until_the_subprocess_is_warm(measure: str) -> None:
    """A real fork-mode autotune under ``use()``: its first configs are measured on the GPU by
    Helion's in-process path, the rest in the subprocess once it is warm, and the kernel it
    picks is correct; with the opt-out none is measured here."""
    proc = _run_script(_GPU_PRELUDE + _GPU_SCRIPT, env={"PE_MEASURE": measure})
    said = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, said
    here = int(proc.stdout.split("HERE", 1)[1].split()[0])
    if measure == "1":
        assert here == 3, said
        assert "config(s) measured in the autotuning process" in proc.stderr, said
        assert "later configs are measured in the subprocess" in proc.stderr, said
    else:
        assert here == 0, said
