"""Screening ``@triton.autotune`` configs by successive halving: the decisions, as pure functions.

Under ``use()`` / ``install()`` (unless given ``screening=False``) a tune times its configs in
rungs of growing budget instead of giving every config Triton's full ``do_bench`` budget
(docs/triton.md, "Screening"); ``_autotune_tune.Tune`` runs the timings, this module decides
which configs go on::

    rung 0  every config, as its compile lands       do_bench(warmup=SCREEN_WARMUP_MS,
                                                              rep=SCREEN_REP_MS)
            every loud screen (taken while compiles    the same short budget, quiet
            still ran) screened again                  (:func:`rescreen`)
    rung 1  the finalists: within the noise band of    Triton's own do_bench, its full budget,
            the best screen, at most                   quiet (:func:`finalists`)
            :func:`most_finalists` of them
            challengers: any config whose screen is    the full budget too, until none is left
            at or below the best full timing           (:func:`challengers`)

The choice is Triton's own (``min`` of the recorded timings), and it can only fall on a config
timed in full: every other one was screened above the best full timing. Every full timing is
taken once every compile of the tune has landed.

Guarantees: nothing here measures, sleeps or reads a clock; every function is deterministic in
its arguments (ties broken by the order of the mapping given).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

K = TypeVar("K")

SCREEN_WARMUP_MS = 2.0
"""Warm-up of a screening timing (Triton's default: 25 ms). The GPU is already busy with the
tune's back-to-back timings, so its clocks are up; this covers the first launches' caches."""

SCREEN_REP_MS = 10.0
"""Repetitions of a screening timing, in ms of kernel time (Triton's default: 100 ms): for a
kernel of 0.1 ms per repetition (an L2 flush included), about 100 samples, whose median moves
far less than the band below; a tenth of the full budget's cost per config."""

MIN_BAND = 0.02
"""The narrowest noise band, whatever the screens' own spread says: Triton's timings of one
memory-bound config, taken twice, differ by up to 1.7 % on the H200 (docs/triton.md, "Timing
integrity"), so a screen closer than this to the best is not known to be slower."""

MAX_BAND = 0.10
"""The widest noise band: a band wider than this would keep nearly every config of a typical
grid and save nothing; a spread this large says the screens are not to be trusted, and the
challengers step (:func:`challengers`) still catches a config the band left out."""

FINALIST_SHARE = 8
"""At most one config in this many goes to the full budget (at least :data:`MIN_FINALISTS`):
the halving of successive halving, bounding the full timings when many configs lie within noise
of each other (any of those is within the band of the best)."""

MIN_FINALISTS = 3
"""However few the configs, this many of those within the band may go to the full budget: the
best and its two nearest rivals, which on a memory-bound grid (``num_warps`` 4 against 8) often
lie within a per cent of each other."""


@dataclasses.dataclass(frozen=True, slots=True)
class Screen:
    """One config's screening timing.

    Attributes:
        median: the median time (ms), Triton's ``quantiles[0]`` (0.5).
        low: the 20th percentile (``quantiles[1]``; ``median`` if not given).
        high: the 80th percentile (``quantiles[2]``; ``median`` if not given).
        quiet: taken with no compile of the tune still running.
    """

    median: float
    low: float
    high: float
    quiet: bool

    @classmethod
    def of(cls, timing: Any, *, quiet: bool) -> Screen | None:
        """Return the screen of a ``_bench`` result (``[p50, p20, p80]`` or a number), or
        ``None`` for one that is not a finite, positive time (``inf``, an exception)."""
        values = list(timing) if isinstance(timing, list | tuple) else [timing]
        if not values or not all(_is_number(v) for v in values):
            return None
        median = float(values[0])
        if not math.isfinite(median) or median <= 0:
            return None
        low = float(values[1]) if len(values) > 1 and math.isfinite(values[1]) else median
        high = float(values[2]) if len(values) > 2 and math.isfinite(values[2]) else median
        return cls(median, min(low, median), max(high, median), quiet)

    @property
    def spread(self) -> float:
        """The 20th-to-80th percentile spread, relative to the median."""
        return (self.high - self.low) / self.median


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def noise_band(screens: Iterable[Screen]) -> float:
    """The relative band within which two screens cannot be told apart.

    The median, over the quiet screens, of their 20th-to-80th percentile spread relative to
    their median, clamped to ``[MIN_BAND, MAX_BAND]``: a config whose own repetitions vary by
    that much cannot be ranked by a short timing to better than that.
    """
    spreads = [s.spread for s in screens if s.quiet]
    if not spreads:
        return MIN_BAND
    return min(MAX_BAND, max(MIN_BAND, statistics.median(spreads)))


def rescreen(screens: Mapping[K, Screen]) -> list[K]:
    """The configs to screen again, quietly, once the last compile has landed: every one screened
    while compiles still ran, best first. Load only adds time, but by no known bound on a short
    timing: a compile on a thread of this process holds the GIL for tens of ms at a time, and a
    stall within Triton's five-launch estimate leaves the screen a handful of repetitions
    (docs/triton.md, "Screening"). So a loud screen ranks nothing; its quiet one does."""
    return sorted((k for k, s in screens.items() if not s.quiet), key=lambda k: screens[k].median)


def pays(configs: int) -> bool:
    """Whether screening ``configs`` configs can cost less than timing each in full: not when
    all of them could be finalists anyway (each would then be screened *and* timed in full)."""
    return configs > MIN_FINALISTS


def most_finalists(configs: int) -> int:
    """How many of ``configs`` screened configs may go to the full budget at most."""
    return max(MIN_FINALISTS, math.ceil(configs / FINALIST_SHARE))


def finalists(screens: Mapping[K, Screen], band: float, most: int) -> list[K]:
    """The configs to time with the full budget: those screened within ``band`` of the best
    screen, best first, at most ``most`` of them (the best always)."""
    if not screens:
        return []
    ranked = sorted(screens, key=lambda k: screens[k].median)
    best = screens[ranked[0]].median
    within = [k for k in ranked if screens[k].median <= best * (1 + band)]
    return within[: max(1, most)]


def challengers(screens: Mapping[K, Screen], full: Mapping[K, float]) -> list[K]:
    """The configs not yet timed in full whose screen is at or below the best full timing so
    far: Triton's ``min`` would pick them on a short timing, so they are timed in full too, and
    the choice always falls on a config timed in full. Best first; none once ``full`` is empty.

    Only the raw screen counts. Scaling screens by the finalists' full timing / screen ratios
    (to correct a short budget's offset) adds no config: the finalists are the best screens, so
    a scaled screen beats the best full timing only where the raw one already does.
    """
    if not full:
        return []
    best = min(full.values())
    rest = [k for k, s in screens.items() if k not in full and s.median <= best]
    return sorted(rest, key=lambda k: screens[k].median)
