"""First training step of real Triton libraries' layers: stock ``@triton.autotune`` vs ours.

    python -m benchmarks.triton_library_bench [--libraries fla,liger-dyt]
        [--modes stock,use,install] [--rounds 3] [--alternations 10] [--out FILE.md]
        [--results RUNS.jsonl] [--timeout S] [--deadline S] [--plan] [--dry-run]

Needs a CUDA GPU (``--plan``, ``--help`` and ``--dry-run`` do not). Each run is a fresh
interpreter with a cold Triton cache (its own ``TRITON_CACHE_DIR``) that imports the library,
builds the layer's inputs and runs its first training step — forward, then backward
(autograd's own threads run the backward's kernels) — in one of four modes:

* ``stock`` — Triton's autotuner as it is;
* ``use`` — ``with precompile_executor.triton.autotune.use():`` around the step (the default
  executor starts, warm, as the block opens; screening, the default: every config timed with a
  short ``do_bench`` budget, the leaders with Triton's full one, docs/triton.md, "Screening");
* ``install`` — ``autotune.install()`` as the process's first statement, before ``import torch``
  and the library (the default executor warms while the program imports; screening too);
* ``unscreened`` — ``use(screening=False)``: every config timed with Triton's full budget, as
  stock does; only when asked (``--modes stock,use,unscreened``).

The rounds interleave the modes (round 1: every library × mode, then round 2, …); medians are
reported. For each run: the whole process's wall time (from the parent), the first forward, the
step (forward + backward), and per autotuned kernel the time of its tune — from the autotuner's
``prune_configs`` (called once per new tuning key) to Triton's ``self.cache[key] = best`` — with
its *benchmarking floor*: the time spent inside ``do_bench`` during that tune (measured in the
same run, every mode), which no compile strategy removes. A tune also ends no sooner than its
longest compile: stock's, timed as each config's ``Autotuner._bench`` call less its ``do_bench``;
the report's "against the floor" table takes per tune the larger of the two and shows each
mode's tunes against it, per kernel and in total (a kernel whose compiles are long is bounded
by them, not by benchmarking). Then the **chosen-kernel check**: one
more process per library runs the step with stock Triton and, for each tuning key where the
modes chose different configs, times each chosen config with stock's own ``do_bench`` (through
``Autotuner._bench``), alternating, back to back, ``--alternations`` times; the medians show
whether ours chose as fast a kernel as stock.

Why these libraries (pure Triton, on the package index, ``pip download --no-deps``; their
wheels need no compiler):

* ``fla`` — ``fla-core`` (flash-linear-attention's ops, 0.6.0; needs ``einops``): its chunked
  simple-GLA layer with a per-head decay, ``fla.ops.simple_gla.chunk_simple_gla``, whose forward
  and backward run
  about ten ``@triton.autotune`` kernels from ``fla.ops.common`` and ``fla.ops.utils`` (4 to 36
  configs each, several with ``num_stages``/``num_warps`` grids): the shape of a model library
  where many small, differently shaped kernels each tune on first use, half of them in backward.
* ``liger-dyt`` — ``liger-kernel`` (0.8.5), a training-kernel library (16 autotuned kernels):
  its DyT layer (``liger_kernel.ops.dyt.LigerDyTFunction``), one forward and one backward
  kernel of 18 configs each over small elementwise tiles — the case bounded by benchmarking,
  where compiles are short and every config's ``do_bench`` (~0.13 s) dominates.
* ``tma-gemm`` (not run by default) — the TMA-descriptor GEMM-with-epilogue layer of
  ``precompile_executor.examples.tma_kernels``, ``silu(x @ w.T + b)`` at 4096³ in bf16: three
  autotuned kernels (forward, ``dx``, ``dw``) of 16 configs each, whose host
  ``TensorDescriptor`` arguments are built with a dummy block shape that each config's
  ``pre_hook`` sets (the pattern of Triton's persistent-matmul tutorial and Liger's fused MLPs).
  ``bash benchmarks/gpu_session.sh tma`` runs it; its runs also record, per kernel, where each
  config compiled (``autotune.statistics()``: workers, caller lanes, the tune's thread,
  failed) and the layer's error against torch.
* ``liger-moe`` (not run by default) — its fused mixture-of-experts layer
  (``liger_kernel.ops.fused_moe.LigerFusedMoEFunction``): seven grouped-GEMM kernels, forward
  and backward, 16 to 40 configs each (about 200): a few big autotuned GEMMs; estimated at well
  over a minute of stock time.

``--libraries small`` — the six ops of ``precompile_executor.examples.library_kernels``
(``rmsnorm,layernorm,softmax,scan,swiglu,dyt``; 36 configs each, forward and backward), each a
library of its own: the case bounded by benchmarking, where screening is meant to pay
(``bash benchmarks/gpu_session.sh halving``). ``--deadline S`` starts no run past S seconds (the
check still runs), so one call of a known length leaves a report.

``--dry-run`` runs the whole benchmark on a CPU, compile-only: Triton's driver is a dry-run
sm_90 whose launches do nothing, ``do_bench`` launches once and returns 1 ms, the layers are
built at a small size on the CPU, and each autotuned kernel keeps its first two configs — every
compile is real (workers and caller), nothing is timed that means anything. It exists so that a
GPU session does not fail on a typo (only ``tma-gemm`` and the small ops support it: the other
layers need CUDA at import or in torch ops).

``flag-gems`` was considered and left out: its kernels tune through ``LibTuner``, a subclass of
``Autotuner`` that replaces ``run`` (and keeps its own on-disk timing cache), so neither stock
``@triton.autotune`` nor this integration's seam is what runs there; it also refuses to import
without a GPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SMALL = ("rmsnorm", "layernorm", "softmax", "scan", "swiglu", "dyt")
"""The small ops of ``precompile_executor.examples.library_kernels`` (its ``OPS``), each run as
a library of its own; ``small`` on the command line means all of them."""
LIBRARIES = ("fla", "liger-dyt", "liger-moe", "tma-gemm", *SMALL)
DEFAULT_LIBRARIES = ("fla", "liger-dyt")
"""``liger-moe`` tunes about 200 GEMM configs (est. 1.5 min of stock time on an H200): run it
when the device time is there (``--libraries liger-moe``)."""
MODES = ("stock", "use", "install", "unscreened")
DEFAULT_MODES = ("stock", "use", "install")
"""``unscreened`` (the opt-out, ``use(screening=False)``) runs only when asked:
``--modes stock,use,unscreened``."""
ROUNDS = 3
ALTERNATIONS = 10
RUN_TIMEOUT_S = 300.0
"""A run that takes longer is killed (its process group) and reported as timed out."""


# -- the layers (child side) --------------------------------------------------------------------


def _fla_step() -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """fla-core's chunked simple GLA with a per-head decay: B=4, T=2048, H=8, K=V=128, bf16.

    The decay is ``g_gamma`` (one log-decay per head, as RetNet's retention), not a gate per
    token (``g``): fla 0.6.0 refuses its gated ``chunk_bwd_dqkwg`` on Hopper with Triton
    3.4–3.7.0 (``fla/ops/common/chunk_o.py``;
    https://github.com/fla-org/flash-linear-attention/issues/640), and the device runs Triton 3.6.
    """
    import torch
    from fla.ops.simple_gla import chunk_simple_gla

    torch.manual_seed(0)
    b, t, h, d = 4, 2048, 8, 128
    dev, dt = "cuda", torch.bfloat16
    q, k, v = (torch.randn(b, t, h, d, device=dev, dtype=dt, requires_grad=True) for _ in "qkv")
    # Head i keeps 1 - 2**-(5 + i) of its state per step: decays from 0.97 to 0.9998.
    heads = torch.arange(h, device=dev, dtype=torch.float32)
    g_gamma = torch.log1p(-torch.exp2(-5.0 - heads))
    do = torch.randn(b, t, h, d, device=dev, dtype=dt)

    def forward() -> Any:
        return chunk_simple_gla(q, k, v, g_gamma=g_gamma)[0]

    def backward(out: Any) -> None:
        out.backward(do)

    return forward, backward


def _liger_dyt_step() -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """liger-kernel's DyT (dynamic tanh, a normalisation replacement): 16384 rows × 4096, bf16."""
    import torch
    from liger_kernel.ops.dyt import LigerDyTFunction

    torch.manual_seed(0)
    rows, n = 16384, 4096
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(rows, n, device=dev, dtype=dt, requires_grad=True)
    alpha = torch.full((1,), 0.5, device=dev, dtype=dt, requires_grad=True)
    gamma = torch.ones(n, device=dev, dtype=dt, requires_grad=True)
    beta = torch.zeros(n, device=dev, dtype=dt, requires_grad=True)
    grad = torch.randn(rows, n, device=dev, dtype=dt)

    def forward() -> Any:
        return LigerDyTFunction.apply(x, alpha, gamma, beta)

    def backward(out: Any) -> None:
        out.backward(grad)

    return forward, backward


def _liger_moe_step() -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """liger-kernel's fused MoE: 4096 tokens, hidden 1024, intermediate 1024, 8 experts, top-2."""
    import torch
    from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

    torch.manual_seed(0)
    tokens, hidden, inter, experts, top = 4096, 1024, 1024, 8, 2
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(tokens, hidden, device=dev, dtype=dt, requires_grad=True)
    gate_up = (
        torch.randn(experts, 2 * inter, hidden, device=dev, dtype=dt) * 0.02
    ).requires_grad_()
    down = (torch.randn(experts, hidden, inter, device=dev, dtype=dt) * 0.02).requires_grad_()
    logits = torch.randn(tokens, experts, device=dev)
    weights, index = torch.topk(logits.softmax(-1), top, dim=-1)
    index = index.to(torch.int32)
    grad = torch.randn(tokens, hidden, device=dev, dtype=dt)

    def forward() -> Any:
        return LigerFusedMoEFunction.apply(x, gate_up, down, index, weights)

    def backward(out: Any) -> None:
        out.backward(grad)

    return forward, backward


DRY_RUN = {"on": False}
"""Whether this process runs ``--dry-run`` (see the module docstring)."""
DRY_RUN_CONFIGS = 2
"""Configs each autotuned kernel keeps in a ``--dry-run`` (compiles on a CPU are slow)."""
CHECKS: dict[str, Callable[[], dict[str, float]]] = {}
"""Per library, what the child computes after the timed step: the step's error against torch."""


def _tma_gemm_step() -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """``precompile_executor.examples.tma_kernels.linear_silu``: 4096 × 4096 × 4096, bf16 (256³
    on the CPU of a ``--dry-run``)."""
    import torch

    from precompile_executor.examples import tma_kernels

    torch.manual_seed(0)
    dev = "cpu" if DRY_RUN["on"] else "cuda"
    m = n = k = 256 if DRY_RUN["on"] else 4096
    dt = torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=dt, requires_grad=True)
    w = (torch.randn(n, k, device=dev, dtype=dt) * k**-0.5).requires_grad_()
    b = torch.randn(n, device=dev, dtype=dt, requires_grad=True)
    grad = torch.randn(m, n, device=dev, dtype=dt)
    outputs: dict[str, Any] = {}

    def forward() -> Any:
        outputs["y"] = tma_kernels.linear_silu(x, w, b)
        return outputs["y"]

    def backward(out: Any) -> None:
        out.backward(grad)

    def check() -> dict[str, float]:
        if DRY_RUN["on"]:
            return {}
        xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, b))
        yr = torch.nn.functional.silu(xr @ wr.T + br)
        yr.backward(grad.float())
        return {
            name: float((ours.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
            for name, ours, ref in (
                ("y", outputs["y"], yr),
                ("dx", x.grad, xr.grad),
                ("dw", w.grad, wr.grad),
                ("db", b.grad, br.grad),
            )
        }

    CHECKS["tma-gemm"] = check
    return forward, backward


SMALL_ROWS, SMALL_COLS = 8192, 4096
"""The small ops' inputs: 8192 rows × 4096 bf16 (64 MiB a tensor), a transformer layer's
activations for a batch of 8192 tokens of width 4096 (256 × 512 on the CPU of a
``--dry-run``)."""


def _small_step(op: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """One op of ``library_kernels``: its forward, then its backward."""
    import torch

    from precompile_executor.examples import library_kernels as lk

    torch.manual_seed(0)
    dev = "cpu" if DRY_RUN["on"] else "cuda"
    rows, cols = (256, 512) if DRY_RUN["on"] else (SMALL_ROWS, SMALL_COLS)

    def tensor(shape: tuple[int, ...], scale: float = 1.0) -> Any:
        return torch.randn(shape, device=dev, dtype=torch.bfloat16) * scale

    def empty(shape: tuple[int, ...], like: Any, dtype: str | None = None) -> Any:
        kind = like.dtype if dtype is None else getattr(torch, dtype)
        return torch.empty(shape, device=like.device, dtype=kind)

    x, dy = tensor((rows, cols)), tensor((rows, cols))
    w, b = tensor((cols,)), tensor((cols,))
    calls: dict[str, Callable[[], tuple[Any, Callable[[Any], Any]]]] = {
        "rmsnorm": lambda: lk.rmsnorm(x, w, empty),
        "layernorm": lambda: lk.layernorm(x, w, b, empty),
        "softmax": lambda: lk.softmax(x, empty),
        "scan": lambda: lk.scan(x, empty),
        "swiglu": lambda: lk.swiglu(x, dy, empty),
        "dyt": lambda: lk.dyt(x, tensor((1,), 0.5), w, b, empty),
    }

    def forward() -> Any:
        return calls[op]()

    def backward(out: Any) -> None:
        out[1](dy)

    return forward, backward


STEPS: dict[str, Callable[[], tuple[Callable[[], Any], Callable[[Any], None]]]] = {
    "fla": _fla_step,
    "liger-dyt": _liger_dyt_step,
    "liger-moe": _liger_moe_step,
    "tma-gemm": _tma_gemm_step,
    **{op: functools.partial(_small_step, op) for op in SMALL},
}


def install_dry_run() -> None:
    """``--dry-run``: Triton's active driver becomes a dry-run sm_90 (compiles real, launches
    recorded nowhere), ``triton.testing.do_bench`` launches once and returns 1 ms, and every
    ``@triton.autotune`` made from now on keeps its first :data:`DRY_RUN_CONFIGS` configs."""
    import triton
    import triton.testing
    from triton.runtime import autotuner
    from triton.runtime.driver import driver

    from precompile_executor.triton import CompileOnlyDriver, parse_target

    class _Utils:
        def get_device_properties(self, device: Any) -> dict[str, int]:
            return {"max_shared_mem": 232448, "multiprocessor_count": 132}

        def load_binary(self, *args: Any) -> tuple[Any, ...]:
            return None, None, 32, 0, 1024  # module, function, registers, spills, threads

    class DryRunGPU(CompileOnlyDriver):
        def __init__(self) -> None:
            super().__init__(parse_target("cuda:90"))
            self.utils = _Utils()
            self.launcher_cls = lambda src, metadata: lambda *args: None

        def get_benchmarker(self) -> Any:
            return triton.testing.do_bench

    def do_bench(fn: Any, *args: Any, quantiles: Any = None, **kwargs: Any) -> Any:
        fn()
        return [1.0] * len(quantiles) if quantiles else 1.0

    original_init = autotuner.Autotuner.__init__

    def init(self: Any, fn: Any, arg_names: Any, configs: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, fn, arg_names, list(configs)[:DRY_RUN_CONFIGS], *args, **kwargs)

    DRY_RUN["on"] = True
    triton.testing.do_bench = do_bench
    autotuner.Autotuner.__init__ = init
    driver.set_active(DryRunGPU())


def _synchronize() -> None:
    if not DRY_RUN["on"]:
        import torch

        torch.cuda.synchronize()


# -- what a run observes (child side) -----------------------------------------------------------


class Observer:
    """Records every tune (start at ``prune_configs``, end at ``self.cache[key] = ...``), every
    ``do_bench`` call and every ``Autotuner._bench`` call, by thread, without touching what runs
    in between. In stock Triton a config's ``_bench`` call compiles it (its first launch) and
    then runs ``do_bench``: the call less its ``do_bench`` is that config's compile.

    Installed before ``precompile_executor.triton.autotune`` patches anything, so its patch
    keeps calling these (it stores what it finds as Triton's originals).
    """

    def __init__(self) -> None:
        self.tunes: list[dict[str, Any]] = []
        self.benches: list[tuple[int, float, float]] = []  # thread, start, seconds
        self.bench_calls: list[tuple[int, float, float]] = []  # Autotuner._bench: the same
        self.lock = threading.Lock()
        self._undo: list[Callable[[], None]] = []

    def uninstall(self) -> None:
        """Put back what :meth:`install` replaced."""
        while self._undo:
            self._undo.pop()()

    def install(self) -> None:
        import triton.testing
        from triton.runtime.autotuner import Autotuner

        observer = self
        original_prune = Autotuner.prune_configs
        original_do_bench = triton.testing.do_bench

        class TimedCache(dict):  # type: ignore[type-arg]
            tune: dict[str, Any] | None = None

            def __setitem__(self, key: Any, value: Any) -> None:
                tune = self.tune
                if tune is not None and "end" not in tune:
                    tune["end"] = time.perf_counter()
                    tune["key"] = str(key)
                    tune["chosen"] = str(value)
                super().__setitem__(key, value)

        def prune_configs(self: Any, kwargs: dict[str, Any]) -> Any:  # Triton's parameter names
            tune = {
                "kernel": f"{self.base_fn.__module__}.{self.base_fn.__name__}",
                "configs": len(self.configs),
                "thread": threading.get_ident(),
                "start": time.perf_counter(),
            }
            if not isinstance(self.cache, TimedCache):
                self.cache = TimedCache(self.cache)
            self.cache.tune = tune
            with observer.lock:
                observer.tunes.append(tune)
            return original_prune(self, kwargs)

        def do_bench(fn: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original_do_bench(fn, *args, **kwargs)
            finally:
                with observer.lock:
                    observer.benches.append(
                        (threading.get_ident(), start, time.perf_counter() - start)
                    )

        original_bench = Autotuner._bench

        # Triton's parameter names: precompile_executor's check_triton() reads them
        def _bench(self: Any, *args: Any, config: Any, **meta: Any) -> Any:
            start = time.perf_counter()
            try:
                return original_bench(self, *args, config=config, **meta)
            finally:
                with observer.lock:
                    observer.bench_calls.append(
                        (threading.get_ident(), start, time.perf_counter() - start)
                    )

        Autotuner.prune_configs = prune_configs
        Autotuner._bench = _bench
        triton.testing.do_bench = do_bench
        self._undo.append(lambda: setattr(Autotuner, "prune_configs", original_prune))
        self._undo.append(lambda: setattr(Autotuner, "_bench", original_bench))
        self._undo.append(lambda: setattr(triton.testing, "do_bench", original_do_bench))

    def summary(self, origin: float) -> list[dict[str, Any]]:
        """Each tune, in start order: kernel, configs, seconds, floor (``do_bench`` seconds
        within it, on its thread), its longest ``_bench`` call less the ``do_bench`` in it
        (stock: the longest config's compile; ours: the longest wait for a config to land and
        load), choice."""
        rows = []
        for tune in sorted(self.tunes, key=lambda t: t["start"]):
            end = tune.get("end")
            benches = _spans_in(self.benches, tune["thread"], tune["start"], end)
            beside = [
                took - sum(s for _, _, s in _spans_in(self.benches, thread, start, start + took))
                for thread, start, took in _spans_in(
                    self.bench_calls, tune["thread"], tune["start"], end
                )
            ]
            rows.append(
                {
                    "kernel": tune["kernel"],
                    "configs": tune["configs"],
                    "at_s": round(tune["start"] - origin, 3),
                    "tune_s": None if end is None else end - tune["start"],
                    "floor_s": sum(s for _, _, s in benches),
                    "longest_compile_s": max(beside, default=0.0),
                    "benches": len(benches),
                    "key": tune.get("key"),
                    "chosen": tune.get("chosen"),
                }
            )
        return rows


def _spans_in(
    spans: list[tuple[int, float, float]], thread: int, start: float, end: float | None
) -> list[tuple[int, float, float]]:
    """The spans (thread, start, seconds) on ``thread`` that start within ``[start, end)``
    (``end`` ``None``: from ``start`` on)."""
    return [x for x in spans if x[0] == thread and start <= x[1] and (end is None or x[1] < end)]


def child(library: str, mode: str, out: Path) -> None:
    """One run: import, build the layer, time its first step, write a JSON result."""
    origin = time.perf_counter()
    if DRY_RUN["on"]:
        install_dry_run()
    observer = Observer()
    observer.install()  # imports triton, in every mode
    if mode == "install":
        from precompile_executor.triton import autotune as pe_autotune

        pe_autotune.install()
    import contextlib

    import torch  # noqa: F401 - imported before the layer, as a training script does

    forward, backward = STEPS[library]()
    _synchronize()
    ready_s = time.perf_counter() - origin
    block: Any = contextlib.nullcontext()
    if mode in ("use", "unscreened"):
        from precompile_executor.triton import autotune as pe_autotune

        block = pe_autotune.use() if mode == "use" else pe_autotune.use(screening=False)
    start = time.perf_counter()
    with block:
        output = forward()
        _synchronize()
        forward_s = time.perf_counter() - start
        backward(output)
        _synchronize()
    step_s = time.perf_counter() - start
    tunes = observer.summary(origin)
    executor: dict[str, Any] = {}
    compiles: dict[str, Any] = {}
    if mode != "stock":
        import dataclasses

        from precompile_executor.triton import autotune as pe_autotune
        from precompile_executor.triton import state

        assert state.default is not None, "the block ran without building the default executor"
        stats = state.default.statistics()  # type: ignore[attr-defined]
        # completed: compiles and module imports in workers; cancelled: configs taken back
        # from the queue and compiled by the tune's own thread.
        executor = {"completed": stats.completed, "cancelled": stats.cancelled}
        # Per kernel: configs compiled in workers, here, failed (and why it went to stock).
        compiles = {k: dataclasses.asdict(v) for k, v in pe_autotune.statistics().items()}
    check = CHECKS[library]() if library in CHECKS else {}
    result = {
        "library": library,
        "mode": mode,
        "ready_s": ready_s,
        "forward_s": forward_s,
        "step_s": step_s,
        "tunes": tunes,
        "tune_s": sum(t["tune_s"] or 0.0 for t in tunes),
        "floor_s": sum(t["floor_s"] for t in tunes),
        "executor": executor,
        "compiles": compiles,
        "error_vs_torch": check,
        "package": _package_digest(),
    }
    out.write_text(json.dumps(result))


def check_child(library: str, choices_path: Path, alternations: int, out: Path) -> None:
    """The chosen-kernel check: stock Triton runs the step; at each tune whose key the modes
    chose differently, time each mode's choice with stock's ``_bench``, alternating."""
    if DRY_RUN["on"]:
        install_dry_run()
    from triton.runtime.autotuner import Autotuner

    saved = json.loads(choices_path.read_text())
    choices: dict[str, dict[str, dict[str, str]]] = saved.get("median", saved)
    rounds: dict[str, dict[str, dict[str, list[str]]]] = saved.get("rounds", {})
    original_prune = Autotuner.prune_configs
    original_bench = Autotuner._bench
    rows: list[dict[str, Any]] = []
    seen = {"keys": 0, "matched": 0}

    def prune_configs(self: Any, kwargs: dict[str, Any]) -> Any:
        kernel = f"{self.base_fn.__module__}.{self.base_fn.__name__}"
        pruned = original_prune(self, kwargs)
        key = str(_tuning_key(self, kwargs))
        by_mode = {mode: c.get(kernel, {}).get(key) for mode, c in choices.items()}
        by_run = {mode: c.get(kernel, {}).get(key, []) for mode, c in rounds.items()}
        named = {str(c): c for c in self.configs}
        seen["keys"] += 1
        seen["matched"] += all(s in named for s in by_mode.values())
        every = [*by_mode.values(), *(s for ss in by_run.values() for s in ss)]
        distinct = sorted({s for s in every if s in named})
        if len(distinct) < 2:
            return pruned
        args = tuple(self.nargs.values())
        times: dict[str, list[float]] = {s: [] for s in distinct}
        for s in distinct:  # compile and warm each first, untimed
            original_bench(self, *args, config=named[s], **kwargs)
        for _ in range(alternations):
            for s in distinct:
                times[s].append(float(original_bench(self, *args, config=named[s], **kwargs)[0]))
        medians = {s: statistics.median(v) for s, v in times.items()}
        rows.append(
            {
                "kernel": kernel,
                "key": key,
                "ms": {mode: medians.get(s) if s else None for mode, s in by_mode.items()},
                "choices": by_mode,
                "rounds_ms": {mode: [medians.get(s) for s in ss] for mode, ss in by_run.items()},
            }
        )
        stock = by_mode.get("stock")
        return [named[stock]] if stock in named else pruned

    Autotuner.prune_configs = prune_configs
    import torch  # noqa: F401 - imported before the layer, as a training script does

    forward, backward = STEPS[library]()
    backward(forward())
    _synchronize()
    out.write_text(json.dumps({"library": library, "checks": rows, **seen}))


def _tuning_key(autotuner: Any, kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """``Autotuner.run``'s tuning key (Triton 3.6 to 3.9): the key arguments, then the dtypes."""
    all_args = {**autotuner.nargs, **kwargs}
    named = {k: v for k, v in all_args.items() if k in autotuner.arg_names}
    key = [named[k] for k in autotuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuple(key)


# -- the parent ---------------------------------------------------------------------------------


def run(argv: list[str], timeout_s: float) -> tuple[dict[str, Any], float]:
    """Run this module with ``argv`` in a fresh interpreter with a cold Triton cache; return its
    JSON result (or ``{"error": ...}``) and the process's wall time."""
    scratch = Path(tempfile.mkdtemp(prefix="pe-library-bench-"))
    out = scratch / "result.json"
    env = dict(os.environ, TRITON_CACHE_DIR=str(scratch / "triton-cache"))
    cmd = [sys.executable, "-m", "benchmarks.triton_library_bench", *argv, "--json", str(out)]
    if DRY_RUN["on"]:
        cmd.append("--dry-run")
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        timed_out = True
    wall_s = time.perf_counter() - start
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # workers it left behind
    except ProcessLookupError:
        pass
    if out.exists():
        result: dict[str, Any] = json.loads(out.read_text())
    else:
        tail = output.decode(errors="replace").strip().splitlines()[-15:]
        result = {"error": "timed out" if timed_out else "\n".join(tail) or f"rc {proc.returncode}"}
    shutil.rmtree(scratch, ignore_errors=True)
    return result, wall_s


def _package_digest() -> str:
    from benchmarks._common import package_digest

    return package_digest()


def load_results(
    path: Path | None, libraries: list[str], modes: list[str]
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The runs an earlier call saved in ``path`` (JSON lines), for these libraries and modes."""
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    if path is None or not path.exists():
        return results
    for line in path.read_text().splitlines():
        if line.strip():
            saved = json.loads(line)
            if saved.get("library") in libraries and saved.get("mode") in modes:
                results.setdefault((saved["library"], saved["mode"]), []).append(saved)
    return results


def plan(libraries: list[str], modes: list[str], rounds: int) -> list[tuple[int, str, str]]:
    """The runs, in order: every round runs every library in every mode (interleaved)."""
    return [(r, lib, mode) for r in range(1, rounds + 1) for lib in libraries for mode in modes]


def choices_of(runs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Kernel → tuning key → the config chosen, from the median-step run of one mode."""
    good = sorted((r for r in runs if "step_s" in r), key=lambda r: r["step_s"])
    if not good:
        return {}
    chosen: dict[str, dict[str, str]] = {}
    for tune in good[len(good) // 2]["tunes"]:
        if tune.get("key") is not None:
            chosen.setdefault(tune["kernel"], {})[tune["key"]] = tune["chosen"]
    return chosen


def all_choices(runs: list[dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Kernel → tuning key → the config chosen by each run of one mode, in run order."""
    chosen: dict[str, dict[str, list[str]]] = {}
    for r in runs:
        for tune in r.get("tunes", ()):
            if tune.get("key") is not None and tune.get("chosen") is not None:
                chosen.setdefault(tune["kernel"], {}).setdefault(tune["key"], []).append(
                    tune["chosen"]
                )
    return chosen


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ratio(ours: float | None, stock: float | None) -> str:
    return "–" if ours is None or not stock else f"{ours / stock:.2f}×"


def _here(runs: list[dict[str, Any]]) -> str:
    """The configs the tune's own thread compiled (median over runs), or "all" for stock."""
    counts = [r["executor"]["cancelled"] for r in runs if r.get("executor")]
    if not counts:
        return "all" if runs and all("executor" in r for r in runs) else "–"
    return f"{statistics.median(counts):.0f}"


def per_kernel(
    runs: list[dict[str, Any]], floor_of: Callable[[dict[str, Any]], float] | None = None
) -> dict[str, dict[str, list[float]]]:
    """Kernel (with the order of its first tune) → field → one value per run: its tunes' total
    seconds and floor (a tune's floor: ``floor_of(tune)``, by default its ``do_bench``
    seconds)."""
    table: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        if "tunes" not in r:
            continue
        totals: dict[str, list[float]] = {}
        for tune in r["tunes"]:
            one = totals.setdefault(tune["kernel"], [0.0, 0.0, 0.0])
            one[0] += tune["tune_s"] or 0.0
            one[1] += tune["floor_s"] if floor_of is None else floor_of(tune)
            one[2] += tune["configs"]
        for kernel, (tune_s, floor_s, configs) in totals.items():
            row = table.setdefault(kernel, {"tune_s": [], "floor_s": [], "configs": []})
            row["tune_s"].append(tune_s)
            row["floor_s"].append(floor_s)
            row["configs"].append(configs)
    return table


def compile_floors(stock_runs: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """(kernel, tuning key) → the median over stock's runs of its tune's longest compile."""
    seen: dict[tuple[str, str], list[float]] = {}
    for r in stock_runs:
        for tune in r.get("tunes", ()):
            if "longest_compile_s" in tune:
                seen.setdefault((tune["kernel"], str(tune.get("key"))), []).append(
                    tune["longest_compile_s"]
                )
    return {k: statistics.median(v) for k, v in seen.items()}


def against_floor(
    results: dict[tuple[str, str], list[dict[str, Any]]],
    lib: str,
    modes: list[str],
    kernels: list[str],
) -> list[str]:
    """The table of each mode's tunes against their floor: per tune the larger of its
    ``do_bench`` seconds (its own run) and stock's longest compile for that key (none known:
    ``do_bench`` alone); per kernel the medians over runs of the sums; a last row of totals."""
    if not modes:
        return []
    longest = compile_floors(results.get((lib, "stock"), []))

    def floor_of(tune: dict[str, Any]) -> float:
        return max(tune["floor_s"], longest.get((tune["kernel"], str(tune.get("key"))), 0.0))

    table = {mode: per_kernel(results[(lib, mode)], floor_of) for mode in modes}
    lines = [
        "",
        "Against the floor: a tune ends no sooner than its `do_bench` calls (its own run's) and "
        "no sooner than its longest compile (stock's, the config's `_bench` call less its "
        "`do_bench`, median over stock's runs); per tune the larger of the two. Per kernel: "
        "median seconds of its tunes [floor] and their ratio; the last row sums the kernels.",
        "",
        "| kernel | stock's longest compile s | "
        + " | ".join(f"{m} s [floor] | {m} ÷ floor" for m in modes)
        + " |",
        "| --- | --- | " + " | ".join("--- | ---" for _ in modes) + " |",
    ]
    totals = {m: [0.0, 0.0] for m in modes}
    for kernel in kernels:
        compiles = [v for (k, _), v in longest.items() if k == kernel]
        cells = [_fmt(max(compiles)) if compiles else "–"]
        for mode in modes:
            row = table[mode].get(kernel)
            if row is None:
                cells += ["–", "–"]
                continue
            tune_s, floor_s = _median(row["tune_s"]), _median(row["floor_s"])
            totals[mode][0] += tune_s or 0.0
            totals[mode][1] += floor_s or 0.0
            cells += [f"{_fmt(tune_s)} [{_fmt(floor_s)}]", _ratio(tune_s, floor_s)]
        lines.append(f"| `{kernel.rsplit('.', 1)[-1]}` | " + " | ".join(cells) + " |")
    total_cells = [f"{_fmt(t)} [{_fmt(f)}] | {_ratio(t, f)}" for t, f in (totals[m] for m in modes)]
    lines.append("| all kernels | | " + " | ".join(total_cells) + " |")
    return lines


def where_compiled(
    results: dict[tuple[str, str], list[dict[str, Any]]], lib: str, modes: list[str]
) -> list[str]:
    """Per kernel and mode, where its configs compiled (``autotune.statistics()``, median over
    runs): in workers, in caller lanes, on the tune's thread, failed; and whether the guard
    handed it to stock Triton."""
    rows: list[str] = []
    for mode in modes:
        per_kernel_counts: dict[str, list[dict[str, Any]]] = {}
        for r in results[(lib, mode)]:
            for kernel, counts in (r.get("compiles") or {}).items():
                per_kernel_counts.setdefault(kernel, []).append(counts)
        for kernel, runs in per_kernel_counts.items():
            cells = [
                _fmt(_median([float(c.get(field, 0)) for c in runs]), 0)
                for field in (
                    "tunes",
                    "workers",
                    "lanes",
                    "caller",
                    "failed",
                    "identical",
                    "screened",
                    "rescreened",
                    "timed_in_full",
                    "stock_tunes",
                )
            ]
            stock = sum(1 for c in runs if c.get("stock_reason"))
            lines = f"| `{kernel.rsplit('.', 1)[-1]}` | {mode} | " + " | ".join(cells)
            rows.append(lines + f" | {stock} of {len(runs)} |")
    if not rows:
        return []
    return [
        "",
        "Where each config compiled (`autotune.statistics()`, median over runs): in workers, in "
        "this process's caller lanes, on the tune's own thread, failed; configs that took an "
        "identical kernel's timing; with screening, distinct kernels screened, screened again "
        "quietly, timed in full; tunes handed to stock Triton; runs whose kernel the guard sent "
        "to stock (one WARNING each).",
        "",
        "| kernel | mode | tunes | workers | lanes | tune's thread | failed | identical "
        "| screened | again | in full | stock tunes | sent to stock |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
    ]


def chosen_configs(
    results: dict[tuple[str, str], list[dict[str, Any]]], lib: str, modes: list[str]
) -> list[str]:
    """Per tune, the config each mode chose in its median run, and whether it is stock's."""
    choices = {mode: choices_of(results[(lib, mode)]) for mode in modes}
    stock = choices.get("stock", {})
    rows = []
    for kernel, keys in stock.items():
        for key, chosen in keys.items():
            same = [
                m
                for m in modes
                if m != "stock" and choices.get(m, {}).get(kernel, {}).get(key) == chosen
            ]
            other = [m for m in modes if m != "stock" and m not in same]
            rows.append(
                f"| `{kernel.rsplit('.', 1)[-1]}` | {key[:30]} | {chosen[:60]} | "
                f"{', '.join(same) or '–'} | {', '.join(other) or '–'} |"
            )
    if not rows:
        return []
    return [
        "",
        "Chosen configs (median run of each mode) against stock's:",
        "",
        "| kernel | key | stock's choice | same in | other in |",
        "| --- | --- | --- | --- | --- |",
        *rows,
    ]


def report(
    results: dict[tuple[str, str], list[dict[str, Any]]],
    checks: dict[str, dict[str, Any]],
    info: str,
) -> str:
    """The Markdown report: per library a run table, a per-kernel table and the check."""
    lines = ["# First training step of Triton libraries: stock vs ours", "", info, ""]
    digests = sorted({r.get("package", "?") for runs in results.values() for r in runs})
    if len(digests) > 1:
        lines += [
            f"**The runs come from {len(digests)} versions of the package** "
            f'({", ".join(digests)}; "?": a row without its digest).',
            "",
        ]
    libraries = sorted({lib for lib, _ in results})
    for lib in libraries:
        modes = [m for m in MODES if (lib, m) in results]
        stock_runs = results.get((lib, "stock"), [])
        lines += [f"## {lib}", ""]
        lines += [
            "| mode | process s | forward s | step s | tunes s | floor s | step vs stock "
            "| process vs stock | configs compiled here | rounds (step s) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        stock_step = _median([r["step_s"] for r in stock_runs if "step_s" in r])
        stock_process = _median([r["process_s"] for r in stock_runs if "process_s" in r])
        for mode in modes:
            runs = results[(lib, mode)]
            good = [r for r in runs if "step_s" in r]
            errors = [r["error"] for r in runs if "error" in r]
            step = _median([r["step_s"] for r in good])
            process = _median([r["process_s"] for r in runs if "process_s" in r])
            lines.append(
                f"| {mode} | {_fmt(process)} "
                f"| {_fmt(_median([r['forward_s'] for r in good]))} | {_fmt(step)} "
                f"| {_fmt(_median([r['tune_s'] for r in good]))} "
                f"| {_fmt(_median([r['floor_s'] for r in good]))} | {_ratio(step, stock_step)} "
                f"| {_ratio(process, stock_process)} | {_here(good)} "
                f"| {', '.join(_fmt(r['step_s']) for r in good)}"
                + (f" ({len(errors)} failed: {errors[0].splitlines()[-1][:80]})" if errors else "")
                + " |"
            )
        tables = {mode: per_kernel(results[(lib, mode)]) for mode in modes}
        kernels = list(tables.get("stock") or next(iter(tables.values()), {}))
        for mode_table in tables.values():
            kernels += [k for k in mode_table if k not in kernels]
        lines += [
            "",
            "Per kernel, in order of first tune: median seconds of its tunes (prune to choice) "
            "and, in brackets, the benchmarking floor (`do_bench` time) within them.",
            "",
            "| kernel | configs | "
            + " | ".join(modes)
            + " | "
            + " | ".join(f"{m} vs stock" for m in modes if m != "stock")
            + " |",
            "| --- | --- | "
            + " | ".join("---" for _ in modes)
            + " | "
            + " | ".join("---" for m in modes if m != "stock")
            + " |",
        ]
        for kernel in kernels:
            cells, medians = [], {}
            configs = None
            for mode in modes:
                row = tables[mode].get(kernel)
                if row is None:
                    cells.append("–")
                    continue
                medians[mode] = _median(row["tune_s"])
                configs = configs or int(_median(row["configs"]) or 0)
                cells.append(f"{_fmt(medians[mode])} [{_fmt(_median(row['floor_s']))}]")
            ratios = [_ratio(medians.get(m), medians.get("stock")) for m in modes if m != "stock"]
            lines.append(
                f"| `{kernel.rsplit('.', 1)[-1]}` | {configs or '–'} | "
                + " | ".join(cells)
                + " | "
                + " | ".join(ratios)
                + " |"
            )
        lines += against_floor(results, lib, [m for m in modes if m != "stock"], kernels)
        lines += where_compiled(results, lib, modes)
        lines += chosen_configs(results, lib, modes)
        errors = [
            f"{mode}: " + ", ".join(f"{k} {v:.1e}" for k, v in r["error_vs_torch"].items())
            for mode in modes
            for r in results[(lib, mode)][:1]
            if r.get("error_vs_torch")
        ]
        if errors:
            lines += ["", "Error against torch (max |ours − fp32 torch| ÷ max |torch|, first run):"]
            lines += [""] + [f"* {e}" for e in errors]
        check = checks.get(lib)
        lines += ["", "Chosen-kernel check (stock's `do_bench`, alternating, median ms):", ""]
        if check is None:
            lines.append("not run")
        elif "error" in check:
            lines.append(f"failed: {check['error'].splitlines()[-1][:200]}")
        elif check.get("matched", 0) < check.get("keys", 0) or not check.get("keys"):
            lines.append(
                f"{check.get('matched', 0)} of {check.get('keys', 0)} tuning keys found every "
                "mode's choice: the runs and the check did not tune the same keys"
            )
        elif not check.get("checks"):
            lines.append(
                f"every mode chose the same config for each of the {check['keys']} tuning keys"
            )
        else:
            lines += [
                "| kernel | key | "
                + " | ".join(modes)
                + " | worst vs stock | "
                + f"runs whose choice is over {WORSE_BY:.0%} slower than stock's: "
                + ", ".join(modes)
                + " |",
                "| --- | --- | " + " | ".join("---" for _ in modes) + " | --- | --- |",
            ]
            for row in check["checks"]:
                ms = row["ms"]
                worst = max((v for m, v in ms.items() if m != "stock" and v), default=None)
                worse = worse_runs(row)
                lines.append(
                    f"| `{row['kernel'].rsplit('.', 1)[-1]}` | {row['key'][:40]} | "
                    + " | ".join(_fmt(ms.get(m), 4) for m in modes)
                    + f" | {_ratio(worst, ms.get('stock'))} | "
                    + ", ".join(f"{worse.get(m, '–')}" for m in modes)
                    + " |"
                )
            lines += ["", "Each run's choice, re-timed (median ms, in round order):", ""]
            for row in check["checks"]:
                per_run = row.get("rounds_ms", {})
                lines.append(
                    f"* `{row['kernel'].rsplit('.', 1)[-1]}`: "
                    + "; ".join(
                        f"{m} " + ", ".join(_fmt(v, 4) for v in per_run.get(m, [])) for m in modes
                    )
                )
        lines.append("")
    if any(lib in SMALL for lib in libraries):
        lines += ["## Acceptance (the small ops)", ""]
        lines += [f"* {line}" for line in acceptance(results, checks)]
    return "\n".join(lines)


WORSE_BY = 0.01
"""A run's choice counts as worse than stock's when stock's ``do_bench`` times it over this much
slower than stock's own choice (both re-timed, alternating, in one quiet process)."""
SMALL_TARGET = 1.5
"""The whole process of each small op's first step, stock's time over each other mode's."""


def worse_runs(row: dict[str, Any]) -> dict[str, int]:
    """Per mode, how many runs chose a config over ``WORSE_BY`` slower than stock's median-run
    choice (a check row: ``ms`` by mode, ``rounds_ms`` by mode and run)."""
    stock = row["ms"].get("stock")
    if not stock:
        return {}
    return {
        mode: sum(1 for v in values if v is not None and v > stock * (1 + WORSE_BY))
        for mode, values in row.get("rounds_ms", {}).items()
    }


def acceptance(
    results: dict[tuple[str, str], list[dict[str, Any]]], checks: dict[str, dict[str, Any]]
) -> list[str]:
    """MET / MISSED per small op and mode: the whole process ≥ ``SMALL_TARGET``× faster than
    stock's (medians); the choice of the median run within ``WORSE_BY`` of stock's (re-timed by
    the check); no run's choice worse than that."""
    lines = []
    for lib in SMALL:
        stock = _median([r["process_s"] for r in results.get((lib, "stock"), []) if "step_s" in r])
        for mode in ("use", "install", "unscreened"):
            runs = [r for r in results.get((lib, mode), []) if "step_s" in r]
            if not runs or stock is None:
                continue
            ours = _median([r["process_s"] for r in runs])
            ratio = stock / ours if ours else None
            rows = (checks.get(lib) or {}).get("checks", [])
            slowest = max(
                (
                    r["ms"][mode] / r["ms"]["stock"]
                    for r in rows
                    if r["ms"].get(mode) and r["ms"].get("stock")
                ),
                default=1.0,
            )
            worse = sum(worse_runs(r).get(mode, 0) for r in rows)
            checked = lib in checks and "error" not in checks[lib]
            met = ratio is not None and ratio >= SMALL_TARGET and slowest <= 1 + WORSE_BY
            lines.append(
                f"{'MET' if met and checked and not worse else 'MISSED'}: {lib} {mode} — process "
                f"{_fmt(stock)} → {_fmt(ours)} s, {_fmt(ratio)}× (target {SMALL_TARGET:g}×); "
                f"chosen configs at most {slowest:.3f}× stock's choice"
                + ("" if checked else " (check not run)")
                + f"; {worse} runs chose over {WORSE_BY:.0%} slower than stock's choice"
            )
    return lines


def _machine() -> str:
    from benchmarks._common import git_revision, usable_cores, version

    gpu = "?"
    try:
        gpu = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except Exception:  # noqa: BLE001 - the report only names it
        pass
    return (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {gpu}, {usable_cores()} cores, "
        f"python {sys.version.split()[0]}, torch {version('torch')}, triton {version('triton')}, "
        f"fla-core {version('fla-core')}, liger-kernel {version('liger-kernel')}, "
        f"commit {git_revision()}; command: python -m benchmarks.triton_library_bench "
        + " ".join(sys.argv[1:])
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--child``/``--check``, one run of it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libraries", default=",".join(DEFAULT_LIBRARIES), help=str(LIBRARIES))
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=str(MODES))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--alternations", type=int, default=ALTERNATIONS)
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds per run")
    parser.add_argument("--out", type=Path, help="write the Markdown report here too")
    parser.add_argument("--plan", action="store_true", help="print the runs and exit")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: compile-only on a dry-run sm_90, 2 configs per kernel (tma-gemm and the "
        "small ops only)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the chosen-kernel check")
    parser.add_argument(
        "--deadline", type=float, help="start no run later than this many seconds in"
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="a JSON-lines file: runs found there are reported with this call's, and this "
        "call's runs are added to it (so rounds can be spread over several calls)",
    )
    parser.add_argument("--child", nargs=2, metavar=("LIBRARY", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--check", metavar="LIBRARY", help=argparse.SUPPRESS)
    parser.add_argument("--choices", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    DRY_RUN["on"] = args.dry_run
    if args.child:
        child(args.child[0], args.child[1], args.json)
        return 0
    if args.check:
        check_child(args.check, args.choices, args.alternations, args.json)
        return 0
    named = [x for x in args.libraries.split(",") if x]
    libraries = [y for x in named for y in (SMALL if x == "small" else [x])]
    modes = [x for x in args.modes.split(",") if x]
    unknown = [x for x in libraries if x not in LIBRARIES] + [x for x in modes if x not in MODES]
    if unknown:
        parser.error(f"unknown {unknown}: libraries are {LIBRARIES}, modes {MODES}")
    if args.dry_run and set(libraries) - {"tma-gemm", *SMALL}:
        parser.error("--dry-run runs --libraries tma-gemm and small only (the others need CUDA)")
    runs = plan(libraries, modes, args.rounds)
    if args.plan:
        for r, lib, mode in runs:
            print(f"round {r}: {lib} {mode}")
        return 0
    results = load_results(args.results, libraries, modes)
    machine = _machine()
    if args.dry_run:
        machine = (
            f"**DRY RUN** (--dry-run: a stand-in sm_90 GPU on a CPU; times made up). {machine}"
        )
    began = time.perf_counter()
    for r, lib, mode in runs:
        if args.deadline is not None and time.perf_counter() - began > args.deadline:
            print(f"round {r} {lib:6} {mode:8} not started: past --deadline", flush=True)
            continue
        result, wall_s = run(["--child", lib, mode], args.timeout)
        result.update(library=lib, mode=mode, process_s=wall_s)
        results.setdefault((lib, mode), []).append(result)
        if args.results:
            with args.results.open("a") as saved:
                saved.write(json.dumps(result) + "\n")
        print(
            f"round {r} {lib:6} {mode:8} process {wall_s:6.1f} s  "
            + (
                f"step {result['step_s']:6.1f} s  floor {result['floor_s']:5.1f} s  "
                f"executor {result.get('executor') or '-'}"
                if "step_s" in result
                else f"FAILED: {result['error'][-300:]}"
            ),
            flush=True,
        )
        if args.out:  # after every run, so a call cut short still leaves its tables
            args.out.write_text(report(results, {}, machine) + "\n")
    checks: dict[str, dict[str, Any]] = {}
    if not args.no_check and args.alternations > 0:
        for lib in libraries:
            choices = {m: choices_of(results.get((lib, m), [])) for m in modes}
            rounds = {m: all_choices(results.get((lib, m), [])) for m in modes}
            scratch = Path(tempfile.mkdtemp(prefix="pe-library-choices-"))
            path = scratch / "choices.json"
            path.write_text(json.dumps({"median": choices, "rounds": rounds}))
            check, _ = run(
                ["--check", lib, "--choices", str(path), "--alternations", str(args.alternations)],
                args.timeout,
            )
            shutil.rmtree(scratch, ignore_errors=True)
            checks[lib] = check
    text = report(results, checks, machine)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
