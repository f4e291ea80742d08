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


@dataclasses.dataclass(frozen=True)
class Summary:
    """What one batch's timeline says.

    Attributes:
        wall_s: first queued to last settled (or installed).
        run_s: Σ in-worker time (``Started`` → ``Done``).
        dispatch_s: Σ parent → worker latency (``sent`` → ``Started``).
        result_s: Σ result latency in the parent (``Done`` → settled, plus installing).
        parent_share: (dispatch + result) / (dispatch + run + result): the part of each task's
            time on a worker slot that the parent, not the compile, took.
        idle_share: 1 − run / (workers × wall): worker capacity left unused (queue tail, gaps).
        slowdown: Σ in-worker time / Σ sequential time of the same tasks (``None`` without
            sequential times): how much slower tasks run side by side than alone.
        tail_s: last settled − last started: how long the batch waited on its final task.
    """

    wall_s: float
    run_s: float
    dispatch_s: float
    result_s: float
    parent_share: float
    idle_share: float
    slowdown: float | None
    tail_s: float


def _end(r: TaskTimeline, installed: Mapping[int, float]) -> float:
    return max(r.settled or 0.0, installed.get(r.task_id, 0.0))


def summarize(
    records: Sequence[TaskTimeline],
    workers: int,
    sequential_s: float | None = None,
    installed: Mapping[int, float] | None = None,
) -> Summary:
    """Summarize one batch's records (all settled, all started)."""
    installed = installed or {}
    done = [r for r in records if r.started is not None and r.done is not None]
    t0 = min(r.queued or 0.0 for r in done)
    t1 = max(_end(r, installed) for r in done)
    run = sum((r.done or 0.0) - (r.started or 0.0) for r in done)
    dispatch = sum((r.started or 0.0) - (r.sent or 0.0) for r in done)
    result = sum(_end(r, installed) - (r.done or 0.0) for r in done)
    wall = t1 - t0
    return Summary(
        wall_s=wall,
        run_s=run,
        dispatch_s=dispatch,
        result_s=result,
        parent_share=(dispatch + result) / max(1e-9, dispatch + run + result),
        idle_share=1.0 - run / max(1e-9, workers * wall),
        slowdown=run / sequential_s if sequential_s else None,
        tail_s=t1 - max(r.started or 0.0 for r in done),
    )


def draw(
    path: Path,
    batches: Sequence[tuple[str, Sequence[TaskTimeline], Mapping[int, float]]],
    workers: int,
    stamp: str = "",
) -> bool:
    """Draw one Gantt panel per ``(title, records, installed)`` batch into ``path`` (PNG).

    Returns ``False`` when matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(batches), 1, figsize=(14, 1.2 + 0.28 * workers * len(batches) + 0.6), squeeze=False
    )
    colors = {
        "queued": "#dddddd",
        "dispatch": "tab:orange",
        "run": "tab:blue",
        "result": "tab:red",
        "install": "tab:purple",
    }
    for ax, (title, records, installed) in zip(axes[:, 0], batches, strict=True):
        done = [r for r in records if r.started is not None and r.done is not None]
        if not done:
            continue
        t0 = min(r.queued or 0.0 for r in done)
        pids = sorted({r.worker_pid for r in done})
        lane = {pid: i for i, pid in enumerate(pids)}
        for r in done:
            y = lane[r.worker_pid]
            spans = [
                ("queued", r.queued, r.sent, 0.25),
                ("dispatch", r.sent, r.started, 0.7),
                ("run", r.started, r.done, 0.7),
                ("result", r.done, r.settled, 0.7),
            ]
            if r.task_id in installed:
                spans.append(("install", r.settled, installed[r.task_id], 0.7))
            for kind, a, b, h in spans:
                if a is None or b is None or b <= a:
                    continue
                ax.barh(
                    y,
                    b - a,
                    left=a - t0,
                    height=h,
                    color=colors[kind],
                    linewidth=0,
                    zorder=1 if kind == "queued" else 2,  # waiting never hides running
                )
            ax.text(
                (r.started or 0.0) - t0 + 0.01,
                y,
                f"{r.task_id}",
                va="center",
                fontsize=5,
                color="white",
            )
        s = summarize(done, workers, installed=installed)
        ax.set_title(
            f"{title}: wall {s.wall_s:.2f}s, parent share {s.parent_share:.1%}, "
            f"idle capacity {s.idle_share:.1%}, tail {s.tail_s:.2f}s",
            fontsize=9,
        )
        ax.set_yticks(range(len(pids)), [f"pid {p}" for p in pids], fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the batch was queued", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    labels = [
        "queued",
        "sent → Started (parent + socket)",
        "in worker (Started → Done)",
        "Done → future set (parent)",
        "installing artifacts (parent)",
    ]
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8)
    if stamp:
        fig.text(0.5, 0.995, stamp, ha="center", va="top", fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 0.98))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def installed_by_task(jobs: Sequence[Any], records: Sequence[TaskTimeline]) -> dict[int, float]:
    """Task id → ``CompileJob.installed_at`` for the jobs of a Triton batch."""
    by_future = {r.future: r.task_id for r in records}
    out: dict[int, float] = {}
    for job in jobs:
        future = getattr(job, "task_future", None)
        at = getattr(job, "installed_at", None)
        if future in by_future and at is not None:
            out[by_future[future]] = at
    return out
