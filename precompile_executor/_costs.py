"""Predicted task cost: a prior from features, an online estimate from observed durations.

The executor starts the longest queued task first (its sort key is ``(-priority, -predicted
cost, submission id)``), so a long compile does not start last and hold up the batch. This
module says how long a task will take. It is pure bookkeeping — no processes, no executor
state, no clocks — and is unit-tested on its own (tests/test_costs.py).

Every task carries a :class:`CostKey`:

* ``function``: who runs (``module:qualname`` of a plain callable; ``triton:<kernel>`` for a
  Triton compile);
* ``features``: what it runs, as a canonical string — a Triton compile's config (block sizes,
  warps, stages, dtypes), or a plain call's plain-data arguments (numbers, short strings that
  are not paths); ``""`` when nothing describes the call;
* ``prior_s``: an estimate before any history: ``executor.options(cost=seconds)``, a
  callable's own estimator (:func:`estimated_cost`), or :func:`triton_prior_s`.

:meth:`CostModel.estimate` answers, first match wins:

1. the exponentially weighted mean of this (function, features)'s observed durations;
2. the prior, times how far this function's observed durations ran from their priors
   (``calibration``: the weighted mean ratio, so a prior fitted on one machine orders tasks
   correctly on another and compares with history of other keys);
3. the weighted mean duration of the function (every call of it looks alike);
4. ``0.0``: nothing known. The executor places such a task as the longest it has predicted (a
   task of unknown cost may be long, and a long task started late holds the whole batch);
   among themselves such tasks keep submission order.

Observations are the in-worker durations (the worker's ``Started`` to its ``Done``), divided
by the calls in a chunk. The model keeps at most :data:`MAX_KEYS` (function, features) entries,
dropping the least recently observed. :class:`CostModel` is thread-safe (its own lock, taken
last: it never calls out).

History file: a small JSON document (``{"version": 1, "functions": {...}}``), written
atomically (a temporary file in the same directory, then ``os.replace``). A missing file is an
empty history; an unreadable or corrupt one is ignored with a warning and overwritten on the
next save.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import tempfile
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

log = logging.getLogger("precompile_executor")

EWMA_ALPHA = 0.3
"""Weight of the newest observation in a running mean: a few runs settle an estimate, one slow
outlier (a loaded machine) moves it by less than a third."""

MAX_KEYS = 4096
"""Most (function, features) entries kept, in memory and on disk (~100 bytes each)."""

MAX_FEATURES_CHARS = 200
"""A plain call whose plain-data arguments print longer than this gets no features key (only
its function's mean): a long repr costs time at every submit and rarely repeats."""

HISTORY_VERSION = 1
"""Format of the history file; a file of another version is ignored (and rewritten)."""

_TRITON_BASE_S = 0.1
_TRITON_PER_ELEMENT_S = 0.005
"""The Triton prior: seconds = base + per-element × tile elements per thread. Fitted on 64 sm_90
matmul configs (Triton 3.9, 2-core CPU machine, rank correlation 0.86 with measured times);
only the order matters until history calibrates it."""

Features = Mapping[str, Any]
F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class CostKey:
    """What a task's cost is predicted and recorded under.

    Attributes:
        function: ``module:qualname`` of a plain callable, ``triton:<kernel>`` for a compile.
        features: canonical string of what the call runs (see :func:`features_key`).
        prior_s: an estimate in seconds before any history, or ``None``.
    """

    function: str
    features: str = ""
    prior_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What a callable says about one call of itself (see :func:`estimated_cost`).

    Attributes:
        seconds: a prior estimate of the call's duration (any consistent scale), or ``None``.
        features: what describes the call (its history key); ``None``: its plain-data arguments.
        function: the name its history is kept under; ``None``: the callable's
            ``module:qualname``.
        history: the history file to predict from and record in; ``None``: the executor's.
    """

    seconds: float | None = None
    features: Features | None = None
    function: str | None = None
    history: str | None = None


COST_ATTRIBUTE = "__precompile_cost__"
"""The attribute :func:`estimated_cost` sets on a callable: ``f(*args, **kwargs) -> Estimate``."""


def estimated_cost(estimator: Callable[..., Estimate | float | None]) -> Callable[[F], F]:
    """Decorate a task function with an estimator of its cost, called with each call's arguments.

    The estimator runs in the caller's process at submit time and must be cheap; it returns an
    :class:`Estimate`, a number of seconds, or ``None``. An explicit
    ``executor.options(cost=...)`` wins over it; history wins over both once it exists.

    Example::

        @estimated_cost(lambda n: n * 1e-3)
        def work(n): ...
    """

    def mark(fn: F) -> F:
        setattr(fn, COST_ATTRIBUTE, estimator)
        return fn

    return mark


def function_key(fn: Any) -> str:
    """``module:qualname`` of ``fn`` (a ``functools.partial`` counts as its function)."""
    inner = getattr(fn, "func", fn) if type(fn).__name__ == "partial" else fn
    module = getattr(inner, "__module__", None) or type(inner).__module__
    name = getattr(inner, "__qualname__", None) or type(inner).__qualname__
    return f"{module}:{name}"


def features_key(features: Features) -> str:
    """A canonical string for ``features``: sorted ``name=value`` pairs."""
    return ",".join(f"{k}={_plain(v)}" for k, v in sorted(features.items(), key=lambda kv: kv[0]))


def call_features(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The features key of a plain call: its plain-data arguments, in order.

    Numbers, booleans, ``None`` and short strings that are not paths (no ``/``) are kept, also
    inside tuples, lists and dicts; anything else (and any path) is left out, so a call that
    differs only in a temporary directory or an object keeps its key. Too long (more than
    :data:`MAX_FEATURES_CHARS`, or a container of more than 32 items): ``""``.
    """
    try:
        parts = [_plain(a) for a in args]
        parts += [f"{k}={_plain(v)}" for k, v in sorted(kwargs.items())]
    except _TooLong:
        return ""
    text = ",".join(p for p in parts if p)
    return text if len(text) <= MAX_FEATURES_CHARS else ""


class _TooLong(Exception):
    pass


_MAX_ITEMS = 32


def _plain(value: Any) -> str:
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    if isinstance(value, str):
        return repr(value) if len(value) <= 32 and "/" not in value and os.sep not in value else ""
    if isinstance(value, (tuple, list)):
        if len(value) > _MAX_ITEMS:
            raise _TooLong
        return "(" + ",".join(_plain(v) for v in value) + ")"
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        if len(value) > _MAX_ITEMS:
            raise _TooLong
        return "{" + ",".join(f"{k}:{_plain(v)}" for k, v in sorted(value.items())) + "}"
    return ""


def triton_prior_s(
    blocks: Mapping[str, int], num_warps: int = 4, num_stages: int = 3, dtype_bits: int = 16
) -> float:
    """A prior for a Triton compile's duration from its config, in seconds.

    Compile time follows the code each thread gets: the tile elements a thread handles. With the
    block sizes ``b1, b2, ...`` (``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``) that is the sum of their
    pairwise products (for a matmul: the accumulator ``M·N`` plus the two input tiles ``M·K`` and
    ``K·N``) over ``32 × num_warps`` threads. ``num_stages`` and ``dtype_bits`` are part of the
    history key but barely moved the measured times, so the prior ignores them.

    Args:
        blocks: the integer block-size constexprs (names starting with ``BLOCK``).
        num_warps: warps per program.
        num_stages: software-pipelining stages.
        dtype_bits: the widest pointer element type, in bits.
    """
    del num_stages, dtype_bits
    sizes = [max(1, int(v)) for v in blocks.values()]
    if not sizes:
        elements = 0.0
    elif len(sizes) == 1:
        elements = float(sizes[0])
    else:
        elements = float(
            sum(sizes[i] * sizes[j] for i in range(len(sizes)) for j in range(i + 1, len(sizes)))
        )
    per_thread = elements / (32 * max(1, num_warps))
    return _TRITON_BASE_S + _TRITON_PER_ELEMENT_S * per_thread


@dataclasses.dataclass
class _Mean:
    """An exponentially weighted mean and how many observations made it."""

    value: float
    n: int = 1

    def add(self, x: float) -> None:
        self.n += 1
        # The first few observations weigh as a plain mean, later ones as the EWMA.
        self.value += (x - self.value) * max(EWMA_ALPHA, 1.0 / self.n)


class CostModel:
    """Predicted durations learned from observed ones; optionally kept in a JSON file.

    Args:
        path: the history file to load now and write by :meth:`save`; ``None``: memory only.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = None if path is None else os.fspath(path)
        self._lock = threading.Lock()
        # Least recently observed first. An OrderedDict: a plain dict's first key, after many
        # deletions at the front, is found by skipping every deleted slot before it (a scan per
        # observation once MAX_KEYS is reached; tests/test_overhead.py).
        self._keys: OrderedDict[tuple[str, str], _Mean] = OrderedDict()
        self._functions: dict[str, _Mean] = {}
        self._ratio: dict[str, _Mean] = {}  # observed / prior, per function
        self.dirty = False
        if self.path is not None:
            self._load(self.path)

    def estimate(self, key: CostKey) -> float:
        """Predicted seconds for a task under ``key`` (``0.0``: nothing known)."""
        with self._lock:
            exact = self._keys.get((key.function, key.features)) if key.features else None
            if exact is not None:
                return exact.value
            if key.prior_s is not None:
                ratio = self._ratio.get(key.function)
                return key.prior_s * (ratio.value if ratio is not None else 1.0)
            mean = self._functions.get(key.function)
            if mean is not None:
                return mean.value
            return 0.0

    def observe(self, key: CostKey, seconds: float) -> None:
        """Record that a task under ``key`` ran ``seconds`` on its worker."""
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        with self._lock:
            self.dirty = True
            _add(self._functions, key.function, seconds)
            if key.prior_s is not None and key.prior_s > 0:
                _add(self._ratio, key.function, seconds / key.prior_s)
            if key.features:
                name = (key.function, key.features)
                entry = self._keys.get(name)
                if entry is None:
                    self._keys[name] = _Mean(seconds)
                else:
                    entry.add(seconds)
                    self._keys.move_to_end(name)  # most recent last
                while len(self._keys) > MAX_KEYS:
                    self._keys.popitem(last=False)

    def to_json(self) -> dict[str, Any]:
        """The model as the history file's JSON document."""
        with self._lock:
            functions: dict[str, dict[str, Any]] = {}
            for name, mean in self._functions.items():
                entry: dict[str, Any] = {"mean": [mean.value, mean.n], "keys": {}}
                if name in self._ratio:
                    ratio = self._ratio[name]
                    entry["ratio"] = [ratio.value, ratio.n]
                functions[name] = entry
            for (name, features), mean in self._keys.items():
                functions.setdefault(name, {"mean": [mean.value, mean.n], "keys": {}})
                functions[name]["keys"][features] = [mean.value, mean.n]
            return {"version": HISTORY_VERSION, "functions": functions}

    def save(self) -> None:
        """Write the history file atomically (no-op without a path or new observations).

        Never raises: a history that cannot be written is logged and the run goes on.
        """
        if self.path is None:
            return
        with self._lock:
            if not self.dirty:
                return
            self.dirty = False
        document = self.to_json()
        directory = os.path.dirname(self.path) or "."
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".costs-", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(document, f, separators=(",", ":"))
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            log.warning("could not write the cost history %s: %s", self.path, exc)

    def _load(self, path: str) -> None:
        try:
            with open(path) as f:
                document = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            warnings.warn(
                f"ignoring the unreadable cost history {path} ({exc}); it is rewritten after "
                "the next batch",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        try:
            self._read(document)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            self._keys.clear()
            self._functions.clear()
            self._ratio.clear()
            warnings.warn(
                f"ignoring the corrupt cost history {path} ({type(exc).__name__}: {exc}); it is "
                "rewritten after the next batch",
                RuntimeWarning,
                stacklevel=3,
            )

    def _read(self, document: Any) -> None:
        if not isinstance(document, dict) or document.get("version") != HISTORY_VERSION:
            raise ValueError(f"not a version-{HISTORY_VERSION} history")
        for name, entry in dict(document["functions"]).items():
            self._functions[str(name)] = _mean(entry["mean"])
            if "ratio" in entry:
                self._ratio[str(name)] = _mean(entry["ratio"])
            for features, pair in dict(entry.get("keys", {})).items():
                self._keys[(str(name), str(features))] = _mean(pair)
        while len(self._keys) > MAX_KEYS:
            self._keys.popitem(last=False)


def _mean(pair: Any) -> _Mean:
    value, n = float(pair[0]), int(pair[1])
    if not (math.isfinite(value) and value >= 0 and n >= 1):
        raise ValueError(f"bad entry {pair!r}")
    return _Mean(value, n)


def _add(table: dict[str, _Mean], name: str, x: float) -> None:
    mean = table.get(name)
    if mean is None:
        table[name] = _Mean(x)
    else:
        mean.add(x)


_models: dict[str | None, CostModel] = {}
_models_lock = threading.Lock()


def shared_model(path: str | os.PathLike[str] | None) -> CostModel:
    """The process-wide :class:`CostModel` of a history file (``None``: the in-memory one).

    Every executor in the process that records into the same file shares one model, so a second
    executor (or a second batch) starts from what the first one learned.
    """
    key = None if path is None else os.path.abspath(os.fspath(path))
    with _models_lock:
        model = _models.get(key)
        if model is None:
            model = _models[key] = CostModel(key)
        return model
