"""The one renderer: rows become tables, goals become targets; printed, written as Markdown,
plotted. Every scenario (and ``dask_bench``, ``ray_bench``) feeds it rows."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from ._common import stamp_line


def cell(value: Any) -> str:
    """A table cell: floats with two decimals, NaN and ``None`` as a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def fmt_us(seconds: float) -> str:
    """Seconds as whole microseconds with thousands separators (NaN: a dash)."""
    return "—" if math.isnan(seconds) else f"{seconds * 1e6:,.0f}"


@dataclasses.dataclass
class Table:
    """A title, column names and rows of formatted cells."""

    title: str
    columns: list[str]
    rows: list[list[str]] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, title: str, rows: list[dict[str, Any]]) -> Table:
        """The first row's keys are the columns; values go through :func:`cell`."""
        return cls(
            title, list(rows[0]) if rows else [], [[cell(v) for v in r.values()] for r in rows]
        )

    def markdown(self, heading: str = "**{}**\n\n") -> str:
        """The table in Markdown under ``heading`` (formatted with the title; "" for none)."""
        head = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        body = ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.rows]
        return heading.format(self.title) + "\n".join([*head, *body])

    def text(self) -> str:
        widths = [max(map(len, col)) for col in zip(self.columns, *self.rows, strict=True)]
        lines = [self.columns, ["-" * w for w in widths], *self.rows]
        return "\n".join([self.title] + ["  ".join(map(str.ljust, ln, widths)) for ln in lines])


@dataclasses.dataclass
class Target:
    """A goal stated as a ratio (or seconds) and how the run did against it: ``op`` is ``"<="``
    or ``">="``; ``must`` the hard limit where the goal is softer; ``why`` explains a miss."""

    name: str
    value: float
    op: str
    goal: float
    must: float | None = None
    unit: str = "×"
    why: str = ""

    def _ok(self, limit: float) -> bool:
        return self.value <= limit if self.op == "<=" else self.value >= limit

    @property
    def verdict(self) -> str:
        if math.isnan(self.value):
            return "not measured"
        if self._ok(self.goal):
            return "met"
        gap = abs(self.value / self.goal - 1) * 100 if self.goal else float("inf")
        if self.must is not None and self._ok(self.must):
            return f"goal missed by {gap:.0f}%, within the hard limit"
        return f"MISSED by {gap:.0f}%"

    def cells(self) -> tuple[str, str]:
        """(measured, goal) as text."""
        limit = f"{self.op} {self.goal:g}{self.unit}"
        if self.must is not None:
            limit += f" (must {self.op} {self.must:g}{self.unit})"
        return "n/a" if math.isnan(self.value) else f"{self.value:.2f}{self.unit}", limit

    def describe(self) -> str:
        value, limit = self.cells()
        return f"{self.name}: {value}, target {limit}: {self.verdict}"


@dataclasses.dataclass
class Section:
    """One scenario's results; ``plot`` is a panel from :func:`bars` (or empty)."""

    key: str
    title: str
    intro: str
    tables: list[Table] = dataclasses.field(default_factory=list)
    targets: list[Target] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    plot: dict[str, Any] = dataclasses.field(default_factory=dict)


def intro(doc: str | None) -> str:
    """A scenario module's docstring without its first line, as one paragraph."""
    return " ".join((doc or "").split("\n\n", 1)[-1].split())


def bars(
    title: str,
    labels: list[str],
    series: dict[str, tuple[list[float], str]],
    xlabel: str = "wall seconds",
    **options: Any,
) -> dict[str, Any]:
    """A plot panel: one bar group per label, one bar per series ``name: (values, color)``; a
    single unnamed series with no color gets orange bars for this library, blue for the others.
    ``options``: ``log``, ``fmt``, ``colors``, ``lines`` (``[{"x", "label", "color"}]``)."""
    return {
        "title": title,
        "labels": labels,
        "xlabel": xlabel,
        "series": list(series.items()),
        **options,
    }


def colors(labels: list[str]) -> list[str]:
    """Orange for this library's bars, blue for the others'."""
    return ["tab:orange" if n.startswith(("Precompile", "ours")) else "tab:blue" for n in labels]


def print_section(section: Section) -> None:
    """Print a scenario's tables, targets and notes to stdout."""
    print(f"\n=== {section.title} ===", flush=True)
    for table in section.tables:
        print(table.text() + "\n")
    for target in section.targets:
        print(f"TARGET {target.describe()}")
        if target.verdict != "met" and target.why:
            print(f"       why: {target.why}")
    for note in section.notes:
        print(f"note: {note}")
    print(flush=True)


def markdown(
    sections: list[Section], info: dict[str, str], plot_name: str | None, quick: bool
) -> str:
    """The whole ``benchmarks.md``."""
    out = [
        "# Benchmarks",
        "",
        "Generated by `python -m benchmarks.run` (see `benchmarks/run.py`); do not edit by hand: "
        "re-run it. Every figure below was measured in the run stamped here.",
        "",
        f"- **Machine**: {info['machine']}",
        f"- **Versions**: Python {info['python']}, torch {info['torch']}, Triton {info['triton']}, "
        f"loky {info['loky']}, pebble {info['pebble']}, cloudpickle {info['cloudpickle']}, "
        f"psutil {info['psutil']}, precompile_executor {info['precompile_executor']}",
        f"- **Date**: {info['date']}",
        f"- **Command**: `{info['command']}`"
        + (" (quick mode: tiny sizes, not for reading)" if quick else ""),
        "",
        "## Targets",
        "",
        "| scenario | target | measured | goal | verdict |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| {s.key} | {t.name} | {' | '.join(t.cells())} | {t.verdict} |"
        for s in sections
        for t in s.targets
    ]
    misses = [
        f"- **{s.key}, {t.name}**: {t.why}"
        for s in sections
        for t in s.targets
        if t.verdict != "met" and t.why
    ]
    if misses:
        out += ["", "Why the missed targets were missed:", "", *misses]
    out += [
        "",
        f"![benchmark plots]({plot_name})"
        if plot_name
        else "(No plot: matplotlib is not installed.)",
        "",
    ]
    for section in sections:
        out += [f"## {section.title}", "", section.intro, ""]
        out += [part for table in section.tables for part in (table.markdown(), "")]
        out += [f"- {note}" for note in section.notes] + ([""] if section.notes else [])
    return "\n".join(out)


def plot(sections: list[Section], info: dict[str, str], path: Path) -> bool:
    """One PNG with a panel per section that has one, stamped with machine, versions and date;
    ``False`` (nothing written) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [s.plot for s in sections if s.plot]
    rows = max(1, math.ceil(len(panels) / 2))
    fig, axes = plt.subplots(rows, 2, figsize=(15, 4.6 * rows + 0.8), squeeze=False)
    for ax, spec in zip(axes.flat, panels, strict=False):
        _panel(ax, spec)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle("precompile_executor benchmarks", fontsize=12)
    fig.text(0.5, 0.005, stamp_line(info), ha="center", va="bottom", fontsize=8, wrap=True)
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _panel(ax: Any, spec: dict[str, Any]) -> None:
    labels, series = spec["labels"], spec["series"]
    if len(series) == 1 and not series[0][1][1]:  # one series, no color of its own
        series = [("", (series[0][1][0], spec.get("colors") or colors(labels)))]
    height, fmt = 0.8 / len(series), spec.get("fmt", "{:.2f}")
    for k, (name, (values, color)) in enumerate(series):
        ys = [i - 0.4 + height * (k + 0.5) for i in range(len(labels))]
        ax.barh(
            ys,
            [0.0 if math.isnan(v) else v for v in values],
            height=height,
            color=color,
            label=name or None,
        )
        for y, v in zip(ys, values, strict=True):
            if not math.isnan(v):
                ax.text(v, y, " " + fmt.format(v), va="center", fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(spec["xlabel"])
    if spec.get("log"):
        ax.set_xscale("log")
    for line in spec.get("lines", []):
        ax.axvline(line["x"], color=line.get("color", "k"), linestyle="--", linewidth=1)
        ax.text(line["x"], -0.6, " " + line["label"], fontsize=7, va="bottom")
    if len(series) > 1:
        ax.legend(fontsize=7, loc="best", framealpha=0.9)
    ax.set_title(spec["title"], fontsize=10)
