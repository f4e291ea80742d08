"""Where a batch's time goes: a Gantt chart of ``PrecompileExecutor.timeline()`` records.

One lane per worker process; per task: waiting in the queue (light grey), the parent sending it
until the worker's ``Started`` arrives (orange), running in the worker (blue), the parent
decoding the result and setting the future (red), and for Triton compiles installing the
artifacts (purple, from ``CompileJob.installed_at``). :func:`summarize` gives the figures the
chart is about: the parent's share and the parallel slowdown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from precompile_executor import TaskTimeline
from precompile_executor.triton import CompileJob

SPANS = {
    "queued": ("#dddddd", "queued"),
    "dispatch": ("tab:orange", "sent → Started (parent + socket)"),
    "run": ("tab:blue", "in worker (Started → Done)"),
    "result": ("tab:red", "Done → future set (parent)"),
    "install": ("tab:purple", "installing artifacts (parent)"),
}
"""Each span of a task: its color and legend."""


@dataclasses.dataclass(frozen=True)
class Summary:
    """One batch's timeline: ``wall_s`` first queued to last settled (or installed); Σ
    ``run_s`` in-worker (Started → Done), ``dispatch_s`` sent → Started, ``result_s`` Done →
    settled (+ installed); ``parent_share`` (dispatch + result) / (dispatch + run + result);
    ``idle_share`` 1 − run / (workers × wall); ``slowdown`` Σ in-worker / Σ sequential time
    (``None`` without it); ``tail_s`` last settled − last started."""

    wall_s: float
    run_s: float
    dispatch_s: float
    result_s: float
    parent_share: float
    idle_share: float
    slowdown: float | None
    tail_s: float


def _done(records: Sequence[TaskTimeline]) -> list[TaskTimeline]:
    return [r for r in records if r.started is not None and r.done is not None]


def _end(r: TaskTimeline, installed: Mapping[int, float]) -> float:
    return max(r.settled or 0.0, installed.get(r.task_id, 0.0))


def summarize(
    records: Sequence[TaskTimeline],
    workers: int,
    sequential_s: float | None = None,
    installed: Mapping[int, float] | None = None,
) -> Summary:
    """Summarize one batch's settled, started records."""
    installed = installed or {}
    done = _done(records)
    t0 = min(r.queued or 0.0 for r in done)
    t1 = max(_end(r, installed) for r in done)
    run = sum((r.done or 0.0) - (r.started or 0.0) for r in done)
    dispatch = sum((r.started or 0.0) - (r.sent or 0.0) for r in done)
    result = sum(_end(r, installed) - (r.done or 0.0) for r in done)
    return Summary(
        wall_s=t1 - t0,
        run_s=run,
        dispatch_s=dispatch,
        result_s=result,
        parent_share=(dispatch + result) / max(1e-9, dispatch + run + result),
        idle_share=1.0 - run / max(1e-9, workers * (t1 - t0)),
        slowdown=run / sequential_s if sequential_s else None,
        tail_s=t1 - max(r.started or 0.0 for r in done),
    )


def draw(
    path: Path,
    batches: Sequence[tuple[str, Sequence[TaskTimeline], Mapping[int, float]]],
    workers: int,
    stamp: str = "",
) -> bool:
    """One Gantt panel per ``(title, records, installed)`` batch into ``path`` (PNG);
    ``False`` without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = 1.2 + 0.28 * workers * len(batches) + 0.6
    fig, axes = plt.subplots(len(batches), 1, figsize=(14, height), squeeze=False)
    for ax, (title, records, installed) in zip(axes[:, 0], batches, strict=True):
        if done := _done(records):
            _lanes(ax, done, installed)
            s = summarize(done, workers, installed=installed)
            ax.set_title(
                f"{title}: wall {s.wall_s:.2f}s, parent share {s.parent_share:.1%}, "
                f"idle capacity {s.idle_share:.1%}, tail {s.tail_s:.2f}s",
                fontsize=9,
            )
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c, _ in SPANS.values()]
    fig.legend(
        handles, [label for _, label in SPANS.values()], loc="lower center", ncol=5, fontsize=8
    )
    if stamp:
        fig.text(0.5, 0.995, stamp, ha="center", va="top", fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 0.98))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _lanes(ax: Any, done: list[TaskTimeline], installed: Mapping[int, float]) -> None:
    t0 = min(r.queued or 0.0 for r in done)
    pids = sorted({r.worker_pid for r in done})
    for r in done:
        y = pids.index(r.worker_pid)
        spans = [
            ("queued", r.queued, r.sent),
            ("dispatch", r.sent, r.started),
            ("run", r.started, r.done),
            ("result", r.done, r.settled),
            ("install", r.settled, installed.get(r.task_id)),
        ]
        for kind, a, b in spans:
            if a is not None and b is not None and b > a:
                # Waiting is drawn thin and below, so it never hides running.
                h, z = (0.25, 1) if kind == "queued" else (0.7, 2)
                ax.barh(
                    y, b - a, left=a - t0, height=h, color=SPANS[kind][0], linewidth=0, zorder=z
                )
        ax.text(
            (r.started or 0.0) - t0 + 0.01,
            y,
            f"{r.task_id}",
            va="center",
            fontsize=5,
            color="white",
        )
    ax.set_yticks(range(len(pids)), [f"pid {p}" for p in pids], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the batch was queued", fontsize=8)


def installed_by_task(
    jobs: Sequence[CompileJob], records: Sequence[TaskTimeline]
) -> dict[int, float]:
    """Task id → ``CompileJob.installed_at`` for the jobs of a Triton batch."""
    by_future = {r.future: r.task_id for r in records}
    return {
        by_future[job.task_future]: job.installed_at
        for job in jobs
        if job.task_future in by_future and job.installed_at is not None
    }
