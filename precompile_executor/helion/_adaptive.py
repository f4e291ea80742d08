"""Helion's adaptive compile timeout, applied while a batch runs (docs/helion.md, "A hung
compile: Helion's adaptive timeout from the first batch").

Helion 1.5.1 (``BaseSearch.set_adaptive_compile_timeout``) lowers ``autotune_compile_timeout``
to ``min(max(q, lower bound), compile timeout)``, ``q`` the effort profile's quantile (0.9) of the
compile times seen, the lower bound the profile's (30 s) — but only after a search's initial
population, so the first batch of every search (and every batch of ``RandomSearch``) waits the
full timeout for a compile that never lands. The executor sees compile times as they land: once
enough of a batch has finished (:func:`min_finished`), a config still compiling past
:func:`threshold` is cut as a timeout is.

Everything here is pure (no process, no clock): ``_future.Stream`` feeds it the batch's compile
times and acts on its answer; ``tests/test_helion_adaptive.py`` tests the rule alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

MIN_FINISHED = 8
"""Fewest finished compiles a quantile is taken from: fewer say too little about the batch (a
batch of fewer than this many configs is never cut; its timeout is Helion's)."""

DEFAULT_QUANTILE = 0.9
DEFAULT_LOWER_BOUND_S = 30.0
"""Helion 1.5.1's ``PatternSearchConfig`` defaults, used where neither the search nor the
effort profile names a value (effort ``"none"``)."""

_PROFILE_ENTRIES = ("pattern_search", "lfbo_pattern_search", "differential_evolution")
"""The effort profile's searches that carry ``compile_timeout_lower_bound`` and
``compile_timeout_quantile``, in the order they are read (1.5.1 gives all three the same)."""


@dataclasses.dataclass(frozen=True)
class AdaptiveRule:
    """Where a batch's cut comes from: Helion's quantile and lower bound, and whence they came.

    Attributes:
        quantile: the quantile of finished compile times (Helion's ``compile_timeout_quantile``).
        lower_bound_s: no config is cut before it has compiled this long
            (Helion's ``compile_timeout_lower_bound``).
        source: where the two were read, for the log (``"LFBOTreeSearch"``, ``"effort profile
            'full'"``).
    """

    quantile: float
    lower_bound_s: float
    source: str


@dataclasses.dataclass(frozen=True)
class Threshold:
    """A batch's cut, and how it was derived (for the log line).

    Attributes:
        seconds: a config compiling longer than this is cut.
        quantile_s: the quantile of the finished compile times.
        finished: how many compile times it was taken from.
        rule: the quantile and lower bound used.
        compile_timeout_s: the batch's ``autotune_compile_timeout``.
    """

    seconds: float
    quantile_s: float
    finished: int
    rule: AdaptiveRule
    compile_timeout_s: float

    def describe(self) -> str:
        """``"31.0s = min(max(p90 of 12 compile times 2.3s, lower bound 30s), timeout 60s)
        (effort profile 'full')"``."""
        return (
            f"{self.seconds:.1f}s = min(max(p{self.rule.quantile * 100:g} of {self.finished} "
            f"compile times {self.quantile_s:.1f}s, lower bound {self.rule.lower_bound_s:g}s), "
            f"compile timeout {self.compile_timeout_s:g}s) ({self.rule.source})"
        )


def min_finished(batch_size: int) -> int:
    """Fewest finished compiles before a batch of ``batch_size`` may be cut: half the batch, at
    least :data:`MIN_FINISHED`."""
    return max(MIN_FINISHED, math.ceil(batch_size / 2))


def threshold(
    compile_times_s: Iterable[float],
    batch_size: int,
    rule: AdaptiveRule,
    compile_timeout_s: float,
) -> Threshold | None:
    """The batch's cut, or ``None`` while fewer than :func:`min_finished` compiles have finished.

    Helion's rule (``set_adaptive_compile_timeout``): the compile times sorted, the one at index
    ``min(int(n * quantile), n - 1)``, then ``min(max(that, lower bound), compile timeout)`` — not
    truncated to whole seconds as Helion does for its integer setting, so a fractional lower bound
    is never undercut. Non-positive times (nothing ran) are not counted.
    """
    times = sorted(t for t in compile_times_s if t > 0)
    if not times or len(times) < min_finished(batch_size):
        return None
    value = times[min(int(len(times) * rule.quantile), len(times) - 1)]
    seconds = min(max(value, rule.lower_bound_s), compile_timeout_s)
    return Threshold(seconds, value, len(times), rule, compile_timeout_s)


def overdue(elapsed_s: dict[int, float], cut: Threshold) -> list[int]:
    """The keys of ``elapsed_s`` (config → seconds compiling so far) past ``cut``."""
    return [key for key, seconds in elapsed_s.items() if seconds > cut.seconds]


def rule_for(settings: Any, search: Any = None) -> AdaptiveRule | None:
    """The rule for a batch under Helion ``settings``, or ``None`` when
    ``autotune_adaptive_timeout`` is off (``HELION_AUTOTUNE_ADAPTIVE_TIMEOUT=0``).

    The quantile and lower bound are the ``search``'s own (``compile_timeout_quantile``,
    ``compile_timeout_lower_bound``: ``PatternSearch``, LFBO and differential evolution take them
    as constructor arguments), else the effort profile's (``autotune_effort``; read at each call,
    so ``helion.autotuner.effort_profile._PROFILES`` changed in a test is seen), else Helion's
    defaults.
    """
    if not getattr(settings, "autotune_adaptive_timeout", True):
        return None
    quantile = getattr(search, "compile_timeout_quantile", None)
    lower = getattr(search, "compile_timeout_lower_bound", None)
    if isinstance(quantile, (int, float)) and isinstance(lower, (int, float)):
        return AdaptiveRule(float(quantile), float(lower), type(search).__name__)
    from helion.autotuner.effort_profile import get_effort_profile

    effort = getattr(settings, "autotune_effort", "full")
    profile = get_effort_profile(effort)
    for name in _PROFILE_ENTRIES:
        entry = getattr(profile, name, None)
        if entry is not None:
            return AdaptiveRule(
                float(entry.compile_timeout_quantile),
                float(entry.compile_timeout_lower_bound),
                f"effort profile {effort!r}",
            )
    return AdaptiveRule(DEFAULT_QUANTILE, DEFAULT_LOWER_BOUND_S, "Helion's defaults")
