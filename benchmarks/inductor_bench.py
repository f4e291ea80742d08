"""Cold-cache ``torch.compile``: Inductor's own compile pool vs ``precompile_executor.inductor``.

    python -m benchmarks.inductor_bench [--models gpt2,convnet,llama]
        [--modes default,max-autotune] [--variants stock,ours,ours-install]
        [--only gpt2:max-autotune,...] [--rounds 3] [--layers 2] [--seq 256] [--batch 4]
        [--width W] [--heads H] [--vocab V] [--mlp M] [--image 224] [--cnn-batch 16]
        [--no-instruments] [--process-timeout 600] [--out FILE.json] [--results RUNS.jsonl]
    python -m benchmarks.inductor_bench --smoke [--only llama:default]  # CPU, tiny, one round

Every measurement is one fresh interpreter with empty Inductor and Triton caches (its own
``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``) that builds a model from ``torch.nn`` (no
downloaded weights), runs a step eagerly, compiles it with ``torch.compile(model, mode=...)``
and runs the step once, then compares the output with eager's. A step is one call
(inference, ``torch.no_grad()``) for ``gpt2`` and ``convnet``, and a training step for
``llama`` (forward, cross-entropy, backward; the loss and every gradient compared). Variants:

* ``stock`` — Inductor as it is: its compile pool (a sidecar process and its workers) for Triton
  kernels, threads in the process for C++ kernels and max-autotune's template precompiles;
* ``ours`` — the same program with the compile and first call inside
  ``precompile_executor.inductor.use()`` (the shared default executor: Inductor's worker count,
  its warm-up started by ``use()``, in the clock);
* ``ours-install`` — ``precompile_executor.inductor.install()`` at the program's top, right after
  ``import torch`` and before the model is built.

Rounds are interleaved (every model, mode and variant once, then again), and the figures are the
medians over rounds. Reported per process: the whole-process wall (interpreter start to exit, as
the parent sees it), the compile and first call (our timer, synchronised), and where the time
went by torch's own timers (``torch._dynamo.utils.compilation_time_metrics``, summed per name;
they nest: ``_compile.compile_inner`` ⊃ ``OutputGraph.call_user_compiler`` ⊃
``compile_fx_inner`` ⊃ {``GraphLowering.run``, ``GraphLowering.codegen``,
``async_compile.wait``}; max-autotune's ``*_template_precompiling`` and
``*_template_autotuning`` (benchmarking) run inside lowering), Inductor's counters, and for
``ours`` the compiles per kind (``precompile_executor.inductor.statistics()``).

Models: ``gpt2`` — a GPT-2-size decoder (width 768, 12 heads, MLP 3072, vocabulary 50257,
learned positions, pre-norm blocks: fused QKV projection, causal
``scaled_dot_product_attention``, GELU MLP; tied LM head) with ``--layers`` blocks (GPT-2 small
has 12; the kernels are the same for every block, so fewer blocks mostly saves tracing);
``convnet`` — a ResNet-18-shaped network
(``nn.Conv2d``/``BatchNorm2d``/``ReLU`` basic blocks, 64 to 512 channels); ``llama`` — a
Llama-style decoder (RMSNorm, rotary positions, causal attention, SwiGLU MLP, untied LM head;
width 1024, 16 heads, MLP 2816, vocabulary 32000 unless given), bf16 on a GPU.

Writes one JSON record per process (``--out``) with the machine and versions, and prints a table
per model and mode. ``--results RUNS.jsonl`` spreads rounds over several calls (a device call
has a time limit): the runs found there with the same sizes are reported with this call's, and
each of this call's runs is appended to it as it ends; ``--only model:mode,...`` (or
``--models``/``--modes``) runs a part of a round. ``--smoke`` runs a tiny decoder on the CPU
(C++ kernels), default mode, one round: what ``tests/test_inductor_bench.py`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROCESS_START = time.time()  # before torch is imported: the child's own view of its start

MODELS = ("gpt2", "convnet", "llama")
MODES = ("default", "max-autotune")
VARIANTS = ("stock", "ours", "ours-install")
RESULT_MARK = "INDUCTOR_BENCH_RESULT "
"""Prefix of the one stdout line that carries a child's JSON record."""
CORRECT_REL_ERR = 1e-2
"""Largest error, relative to eager's largest magnitude, that counts as equal: fp32 kernels
reordering their sums stay far below it (about 1e-5); a wrong kernel is far above it."""
CORRECT_REL_ERR_BF16 = 5e-2
"""The same for a bf16 training step (loss and every gradient): bf16 keeps 8 bits of mantissa
(0.4 % a rounding), and fused kernels round at other points than eager's."""
LLAMA_DEFAULTS = {"width": 1024, "heads": 16, "vocab": 32000, "mlp": 2816}
"""The ``llama`` model's sizes unless given (``--width`` …): a 1B-class block's width halved."""

TIMERS = (
    ("_compile.compile_inner", "dynamo total"),
    ("OutputGraph.call_user_compiler", "aot+inductor"),
    ("compile_fx_inner", "inductor"),
    ("GraphLowering.run", "lowering"),
    ("GraphLowering.codegen", "codegen"),
    ("async_compile.wait", "wait on compiles"),
    ("*_template_precompiling", "template precompile"),
    ("*_template_autotuning", "template benchmark"),
)
"""torch's timers reported (name, or ``*suffix`` summed over every name with that suffix)."""

WORKER_QUESTION_TIMEOUT_S = 60.0
"""Longest the record waits for a compile worker to report its environment."""

COUNTERS = (
    "async_compile_cache_miss",
    "select_algorithm_precompile",
    "select_algorithm_num_precompiles",
    "select_algorithm_num_precompilation_exceptions",
)


# -- the models ----------------------------------------------------------------------------------


def _build(spec: dict[str, Any]) -> tuple[Any, Any]:
    """Return (model in eval mode on the device, input) for ``spec``."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    device = spec["device"]
    if spec["model"] == "llama":
        llama, ids = _llama(spec)
        dtype = getattr(torch, spec.get("dtype") or "float32")
        return llama.to(device=device, dtype=dtype).train(), ids.to(device)
    if spec["model"] == "gpt2":
        width, heads, vocab = spec["width"], spec["heads"], spec["vocab"]
        seq, batch = spec["seq"], spec["batch"]

        class Block(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.ln1 = nn.LayerNorm(width)
                self.qkv = nn.Linear(width, 3 * width)
                self.proj = nn.Linear(width, width)
                self.ln2 = nn.LayerNorm(width)
                self.mlp = nn.Sequential(
                    nn.Linear(width, 4 * width),
                    nn.GELU(approximate="tanh"),
                    nn.Linear(4 * width, width),
                )

            def forward(self, x: Any) -> Any:
                b, t, c = x.shape
                q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
                q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
                y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
                return x + self.mlp(self.ln2(x))

        class Decoder(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.tokens = nn.Embedding(vocab, width)
                self.positions = nn.Embedding(seq, width)
                self.blocks = nn.ModuleList(Block() for _ in range(spec["layers"]))
                self.ln = nn.LayerNorm(width)

            def forward(self, ids: Any) -> Any:
                x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
                for block in self.blocks:
                    x = block(x)
                return self.ln(x) @ self.tokens.weight.T  # tied LM head

        model: nn.Module = Decoder()
        inputs = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    else:

        class Basic(nn.Module):
            def __init__(self, cin: int, cout: int, stride: int) -> None:
                super().__init__()
                self.body = nn.Sequential(
                    nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                    nn.BatchNorm2d(cout),
                    nn.ReLU(),
                    nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                    nn.BatchNorm2d(cout),
                )
                self.skip = (
                    nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                    if stride != 1 or cin != cout
                    else nn.Identity()
                )

            def forward(self, x: Any) -> Any:
                return torch.relu(self.body(x) + self.skip(x))

        widths = spec["channels"]
        layers: list[nn.Module] = [
            nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        ]
        cin = widths[0]
        for i, cout in enumerate(widths):
            stride = 1 if i == 0 else 2
            layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
            cin = cout
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
        model = nn.Sequential(*layers)
        size = spec["image"]
        inputs = torch.randn(
            spec["cnn_batch"], 3, size, size, generator=torch.Generator().manual_seed(1)
        )
    return model.to(device).eval(), inputs.to(device)


def _llama(spec: dict[str, Any]) -> tuple[Any, Any]:
    """A Llama-style decoder (RMSNorm, rotary positions, causal attention, SwiGLU MLP, untied
    LM head) with ``spec["layers"]`` blocks, and a batch of token ids (inputs and targets)."""
    import torch
    from torch import nn

    sizes = {k: spec.get(k) or v for k, v in LLAMA_DEFAULTS.items()}
    width, heads, vocab, hidden = sizes["width"], sizes["heads"], sizes["vocab"], sizes["mlp"]
    seq, batch, head = spec["seq"], spec["batch"], sizes["width"] // sizes["heads"]

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x: Any) -> Any:
            scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
            return (x.float() * scale).type_as(x) * self.weight

    def rotate(x: Any, cos: Any, sin: Any) -> Any:
        x1, x2 = x[..., : head // 2], x[..., head // 2 :]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn_norm, self.mlp_norm = RMSNorm(), RMSNorm()
            self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in "qkvo")
            self.gate = nn.Linear(width, hidden, bias=False)
            self.up = nn.Linear(width, hidden, bias=False)
            self.down = nn.Linear(hidden, width, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any) -> Any:
            b, t, _ = x.shape
            h = self.attn_norm(x)
            q, k, v = (
                proj(h).view(b, t, heads, head).transpose(1, 2) for proj in (self.q, self.k, self.v)
            )
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(y.transpose(1, 2).reshape(b, t, width))
            h = self.mlp_norm(x)
            return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(Block() for _ in range(spec["layers"]))
            self.norm = RMSNorm()
            self.head = nn.Linear(width, vocab, bias=False)
            inverse = 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head))
            angles = torch.outer(torch.arange(seq).float(), inverse)
            angles = torch.cat((angles, angles), dim=-1)
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

        def forward(self, ids: Any) -> Any:
            x = self.tokens(ids)
            cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
            for block in self.blocks:
                x = block(x, cos, sin)
            return self.head(self.norm(x))

    ids = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(1))
    return Llama(), ids


def _step(model: Any, inputs: Any, spec: dict[str, Any]) -> Any:
    """One step of ``model``: a call without gradients (``gpt2``, ``convnet``), or a training
    step (``llama``: forward, cross-entropy, backward), returning its loss and every gradient
    as one flat tensor, the gradients then cleared."""
    import torch

    if spec["model"] != "llama":
        with torch.no_grad():
            return model(inputs)
    ids, targets = inputs[:, :-1], inputs[:, 1:]
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([loss.detach().float().view(1)] + [p.grad.float().flatten() for p in params])
    for p in params:
        p.grad = None
    return flat


# -- one process ------------------------------------------------------------------------------


def _timer_sums() -> dict[str, float]:
    from torch._dynamo import utils

    metrics: dict[str, list[float]] = getattr(utils, "compilation_time_metrics", {})
    sums = {}
    for name, _ in TIMERS:
        if name.startswith("*"):
            sums[name] = sum(sum(v) for k, v in metrics.items() if k.endswith(name[1:]))
        else:
            sums[name] = sum(metrics.get(name, ()))
    return sums


def child(
    spec: dict[str, Any],
    build: Callable[[dict[str, Any]], tuple[Any, Any]] | None = None,
    around_compile: Callable[[Callable[[], Any]], Any] | None = None,
    before_use: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Compile and check one model in this (fresh) process; return its record.

    Args:
        spec: the model, mode, variant and sizes (see ``_specs``).
        build: returns (model, input) for ``spec``; default: this module's models.
        around_compile: runs the compile and first call (a function of no arguments) and
            returns its result, e.g. under a profiler; default: calls it.
        before_use: called just before ``use()`` (a variant whose name starts with ``ours``).
    """
    started = time.perf_counter()
    import torch

    from benchmarks import _inductor_instruments as instruments

    imported = time.perf_counter()
    record: dict[str, Any] = {"spec": spec}
    if spec.get("instruments", True):
        instruments.install()  # before use() patches Inductor: the seam then calls the wrappers
    if spec["variant"] == "ours-install":
        import precompile_executor.inductor as pe_inductor

        entered = time.perf_counter()
        pe_inductor.install()  # at the program's top, as a program would: before its model
        record["use_enter_s"] = time.perf_counter() - entered
    sync = torch.cuda.synchronize if spec["device"] == "cuda" else (lambda: None)
    model, inputs = (build or _build)(spec)
    eager = _step(model, inputs, spec)
    sync()
    built = time.perf_counter()
    run = around_compile or (lambda fn: fn())

    def compile_and_call() -> Any:
        out = _step(torch.compile(model, mode=spec["mode"]), inputs, spec)
        sync()
        return out

    if spec["variant"] == "ours-install":
        out = run(compile_and_call)
        record["children_cpu"] = instruments.children_cpu()
        default = pe_inductor.state.default
        counts = default.statistics() if default is not None else None
        record["ours"] = {
            "compiles": vars(pe_inductor.statistics()),
            "executor": {
                k: getattr(counts, k, None)
                for k in ("completed", "failed", "crashed", "timed_out", "start")
            },
        }
    else:
        if spec["variant"].startswith("ours"):
            import precompile_executor.inductor as pe_inductor

            if before_use is not None:
                before_use()

            entered = time.perf_counter()
            with pe_inductor.use() as executor:
                record["use_enter_s"] = time.perf_counter() - entered  # version check, patch
                out = run(compile_and_call)
                record["children_cpu"] = instruments.children_cpu()
                try:
                    arch = instruments.ptxas_facts().get("arch")
                    record["worker_env"] = executor.submit(instruments.worker_env, arch).result(
                        timeout=WORKER_QUESTION_TIMEOUT_S
                    )
                except Exception as exc:  # noqa: BLE001 - reported, not fatal to the record
                    record["worker_env"] = {"error": f"{type(exc).__name__}: {exc}"}
            record["ours"] = {
                "compiles": vars(pe_inductor.statistics()),
                "executor": {
                    k: getattr(executor.statistics(), k, None)
                    for k in ("completed", "failed", "crashed", "timed_out", "start")
                },
                "workers_alive": getattr(executor.statistics(), "workers_alive", None),
            }
        else:
            out = run(compile_and_call)
            record["children_cpu"] = instruments.children_cpu()
    compiled = time.perf_counter()
    scale = float(eager.float().abs().max()) or 1.0
    error = float((out.float() - eager.float()).abs().max()) / scale
    bf16 = spec.get("dtype") == "bfloat16"
    from torch._dynamo.utils import counters

    record |= {
        "import_torch_s": imported - started,
        "build_and_eager_s": built - imported,
        "compile_and_first_call_s": compiled - built,
        "since_process_start_s": time.time() - PROCESS_START,
        "rel_error": error,
        "equal": error <= (CORRECT_REL_ERR_BF16 if bf16 else CORRECT_REL_ERR),
        "timers_s": _timer_sums(),
        "counters": {k: int(counters["inductor"].get(k, 0)) for k in COUNTERS},
        "instruments": instruments.snapshot(),
        "caller_thread_cpu_s": instruments.thread_cpu(),
        "ptxas": instruments.ptxas_facts(),
        "triton_cache": instruments.triton_cache_census(os.environ.get("TRITON_CACHE_DIR")),
    }
    return record


INSTRUMENT_LINES = (
    ("precompile.submit", "template precompile: submitting choices (caller)"),
    ("precompile.wait", "template precompile: waiting for the choices (caller)"),
    ("precompile.sent_to_pool", "template choices sent to a pool (AsyncCompile.triton)"),
    ("precompile.in_caller", "template choices compiled in the caller (precompile())"),
    ("benchmark.choices", "benchmarking choices (AlgorithmSelectorCache.benchmark)"),
    ("Scheduler.speedup_by_fusion", "fusion decisions incl. epilogue benchmarks"),
    ("TritonScheduling.benchmark_codegened_module", "benchmarking fused kernels"),
    ("async_compile.triton", "kernels sent (AsyncCompile.triton, submit time)"),
    ("caller_triton_compile", "Triton compiles run by the caller (triton.compile)"),
    ("caller_triton_compile.while_benchmarking", "  of which while benchmarking choices"),
    ("caller_triton_compile.miss", "  of which Triton cache misses (listener: compile s)"),
    ("caller_triton_compile.hit", "  of which Triton cache hits (listener)"),
    ("caller_triton_compile.over_250ms", "  of which over 0.25 s (full compiles)"),
)
"""The instruments' rows in a breakdown (``_inductor_instruments``), as (name, label)."""


def breakdown(record: dict[str, Any]) -> list[str]:
    """One line per phase of one process's record, for printing as soon as it ends."""
    spec = record["spec"]
    head = f"{spec['model']} {spec['mode']} {spec['variant']}"
    lines = [f"[{head}] process wall {record['process_wall_s']:.2f} s, ok={record['ok']}"]
    if not record["ok"]:
        lines.append(f"[{head}] output tail: {record.get('output_tail', '')[-800:]!r}")
        return lines
    for key, label in (
        ("import_torch_s", "import torch"),
        ("build_and_eager_s", "build + eager call"),
        ("use_enter_s", "use() entry"),
        ("compile_and_first_call_s", "compile + first call"),
    ):
        if key in record:
            lines.append(f"[{head}]   {label}: {record[key]:.2f} s")
    lines.append(f"[{head}]   equal to eager: {record['equal']} ({record['rel_error']:.1e})")
    for name, label in TIMERS:
        lines.append(f"[{head}]   torch timer {label}: {record['timers_s'][name]:.2f} s")
    seen = record.get("instruments", {}).get("seen", {})
    for name, label in INSTRUMENT_LINES:
        if name in seen:
            lines.append(f"[{head}]   {label}: {seen[name]['n']} calls, {seen[name]['s']:.2f} s")
    for key in (
        "counters",
        "ptxas",
        "worker_env",
        "triton_cache",
        "children_cpu",
        "executor_timeline",
    ):
        if record.get(key):
            lines.append(f"[{head}]   {key}: {json.dumps(record[key], sort_keys=True)}")
    if "ours" in record:
        lines.append(f"[{head}]   compiles on the executor: {record['ours']['compiles']}")
    busiest = sorted(record.get("caller_thread_cpu_s", {}).items(), key=lambda kv: -kv[1])[:6]
    lines.append(f"[{head}]   caller CPU by thread (s): {dict(busiest)}")
    return lines


def run_child(
    spec: dict[str, Any],
    timeout_s: float,
    *,
    module: str = "benchmarks.inductor_bench",
    log_path: Path | None = None,
    extra_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter with empty caches; return its record.

    Args:
        spec: what the child measures (JSON), passed as ``--child SPEC``.
        timeout_s: the child and everything it started are killed past this.
        module: the ``python -m`` module whose ``--child`` runs it.
        log_path: where the child's output goes as it runs (a killed child's output stays);
            default: kept in memory only.
        extra_args: more arguments for the child's command line.
    """
    cache = tempfile.mkdtemp(prefix="inductor-bench-")
    env = dict(os.environ)
    env |= {
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor"),
        "TRITON_CACHE_DIR": os.path.join(cache, "triton"),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parent.parent)]
            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        ),
    }
    command = [sys.executable, "-m", module, "--child", json.dumps(spec), *extra_args]
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") if log_path is None else open(log_path, "w+") as log:
        proc = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own group: a run past its time goes with all it started
        )
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            timed_out = True
        wall = time.perf_counter() - start
        log.seek(0)
        output = log.read()
    shutil.rmtree(cache, ignore_errors=True)
    lines = [ln for ln in output.splitlines() if ln.startswith(RESULT_MARK)]
    if lines and not timed_out:
        record: dict[str, Any] = json.loads(lines[-1][len(RESULT_MARK) :])
        record |= {"ok": True, "process_wall_s": wall, "returncode": proc.returncode}
        return record
    return {
        "spec": spec,
        "ok": False,
        "process_wall_s": wall,
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "output_tail": output[-4000:],
    }


# -- the driver ---------------------------------------------------------------------------------


def _sizes(args: argparse.Namespace) -> dict[str, Any]:
    device = "cpu" if args.smoke else "cuda"
    llama = args.cells and all(model == "llama" for model, _ in args.cells)
    return {
        "device": device,
        "layers": args.layers,
        "width": args.width or (64 if args.smoke else None if llama else 768),
        "heads": args.heads or (4 if args.smoke else None if llama else 12),
        "vocab": args.vocab or (256 if args.smoke else None if llama else 50257),
        "mlp": args.mlp or (128 if args.smoke else None),
        "dtype": "bfloat16" if device == "cuda" else "float32",
        "seq": args.seq,
        "batch": args.batch,
        "image": args.image,
        "cnn_batch": args.cnn_batch,
        "channels": [8, 16] if args.smoke else [64, 128, 256, 512],
        "instruments": args.instruments,
    }


def _specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    sizes = _sizes(args)
    return [
        {"model": model, "mode": mode, "variant": variant, **sizes}
        for model, mode in args.cells
        for variant in args.variants
    ]


SIZE_KEYS = (
    "device",
    "layers",
    "width",
    "heads",
    "vocab",
    "mlp",
    "dtype",
    "seq",
    "batch",
    "image",
    "cnn_batch",
)
"""The spec's sizes: a saved run is reported with this call's only if all of them match."""


def parse_only(text: str) -> list[tuple[str, str]]:
    """``"gpt2:max-autotune,convnet:default"`` → the (model, mode) cells to run.

    Raises:
        ValueError: an item is not ``model:mode`` of the known models and modes.
    """
    cells = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        model, _, mode = item.partition(":")
        if model not in MODELS or mode not in MODES:
            raise ValueError(
                f"--only takes model:mode items (models {','.join(MODELS)}, modes "
                f"{','.join(MODES)}), got {item!r}"
            )
        cells.append((model, mode))
    if not cells:
        raise ValueError("--only names no model:mode")
    return cells


def load_results(path: Path | None, sizes: dict[str, Any]) -> list[dict[str, Any]]:
    """The records an earlier call appended to ``path`` (JSON lines) with these ``sizes``."""
    if path is None or not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        spec = record.get("spec", {})
        if all(spec.get(k) == sizes.get(k) for k in SIZE_KEYS):
            records.append(record)
    return records


def save_result(path: Path | None, record: dict[str, Any]) -> None:
    """Append one record to ``path`` (JSON lines), as soon as its run ends."""
    if path is None:
        return
    with path.open("a") as saved:
        saved.write(json.dumps(record) + "\n")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{_median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def _report(records: list[dict[str, Any]], models: list[str], modes: list[str]) -> str:
    lines = []
    for model in models:
        for mode in modes:
            rows = {
                v: [
                    r
                    for r in records
                    if r["spec"]["model"] == model
                    and r["spec"]["mode"] == mode
                    and r["spec"]["variant"] == v
                ]
                for v in VARIANTS
            }
            if not any(rows.values()):
                continue
            lines.append(f"\n## {model}, mode={mode}\n")
            header = ["variant", "ok", "process wall s", "compile+1st call s", "import torch s"]
            header += [label + " s" for _, label in TIMERS]
            header += [
                "equal to eager (max rel err)",
                "compiles on executor (cpp/triton/template/failed)",
            ]
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "---|" * len(header))
            for variant, runs in rows.items():
                if not runs:
                    continue
                good = [r for r in runs if r["ok"]]
                cells = [
                    variant,
                    f"{len(good)}/{len(runs)}",
                    _spread([r["process_wall_s"] for r in good]),
                    _spread([r["compile_and_first_call_s"] for r in good]),
                    _spread([r["import_torch_s"] for r in good]),
                ]
                cells += [_spread([r["timers_s"][name] for r in good]) for name, _ in TIMERS]
                errors = [r["rel_error"] for r in good]
                cells.append(
                    f"{all(r['equal'] for r in good) and bool(good)} ({max(errors):.1e})"
                    if errors
                    else "—"
                )
                counts = [r["ours"]["compiles"] for r in good if "ours" in r]
                cells.append(
                    "/".join(
                        str(int(_median([c.get(k, 0) for c in counts])))
                        for k in ("cpp", "triton", "template", "failed")
                    )
                    + " (in the caller: "
                    + "/".join(
                        str(int(_median([c.get(k, 0) for c in counts])))
                        for k in ("caller_cpp", "caller_triton", "caller_template")
                    )
                    + ")"
                    if counts
                    else "—"
                )
                lines.append("| " + " | ".join(cells) + " |")
            stock = [r["process_wall_s"] for r in rows["stock"] if r["ok"]]
            for variant in VARIANTS[1:]:
                ours = [r["process_wall_s"] for r in rows[variant] if r["ok"]]
                if stock and ours:
                    lines.append(
                        f"\nwhole-process wall, medians: stock {_median(stock):.2f} s, {variant} "
                        f"{_median(ours):.2f} s: **{_median(stock) / _median(ours):.2f}×** faster "
                        f"({variant}/stock {_median(ours) / _median(stock):.3f})"
                    )
            for variant, runs in rows.items():
                for r in runs:
                    if not r["ok"]:
                        lines.append(
                            f"\n{variant} failed (returncode {r['returncode']}, timed out: "
                            f"{r.get('timed_out')}):\n```\n{r['output_tail'][-1500:]}\n```"
                        )
    return "\n".join(lines)


def _stamp(command: str) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks._common import stamp, usable_cores

    info: dict[str, Any] = stamp(usable_cores(), command)
    # nvidia-smi rather than torch: the driver process stays without a CUDA context.
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    try:
        info["gpu"] = subprocess.run(
            query, capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["gpu"] = "none found"
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, one round")
    parser.add_argument(
        "--models", help=f"comma-separated, of {','.join(MODELS)} (default: gpt2,convnet)"
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--variants",
        default="stock,ours",
        help=f"comma-separated, of {','.join(VARIANTS)} (default: stock,ours)",
    )
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--layers", type=int, default=2, help="decoder blocks (GPT-2 small: 12)")
    parser.add_argument("--width", type=int, help="decoder width (gpt2 768, llama 1024)")
    parser.add_argument("--heads", type=int, help="attention heads (gpt2 12, llama 16)")
    parser.add_argument("--vocab", type=int, help="vocabulary (gpt2 50257, llama 32000)")
    parser.add_argument("--mlp", type=int, help="llama's MLP width (2816)")
    parser.add_argument(
        "--no-instruments",
        dest="instruments",
        action="store_false",
        help="leave Inductor unwrapped (the instruments import Inductor at the process's start, "
        "before use()/install() could start their warm-up)",
    )
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--cnn-batch", type=int, default=16)
    parser.add_argument("--process-timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path, help="write the records and the stamp as JSON")
    parser.add_argument(
        "--only",
        help="comma-separated model:mode cells to run (instead of --models × --modes), e.g. "
        "gpt2:max-autotune,convnet:default",
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="a JSON-lines file: runs found there (same sizes) are reported with this call's, "
        "and this call's runs are appended to it as each ends (rounds spread over calls)",
    )
    args = parser.parse_args(argv)
    args.rounds_given = args.rounds is not None
    args.rounds = 3 if args.rounds is None else args.rounds
    if args.child is not None:
        record = child(json.loads(args.child))
        print(RESULT_MARK + json.dumps(record), flush=True)
        return 0
    models_given = args.models is not None
    args.models = [m for m in (args.models or "gpt2,convnet").split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    args.variants = [v for v in args.variants.split(",") if v]
    if args.smoke:  # CPU, tiny sizes, one round; gpt2 unless --models or --only say otherwise
        args.models = args.models if models_given else ["gpt2"]
        args.modes, args.rounds = ["default"], args.rounds if args.rounds_given else 1
        args.layers, args.seq, args.batch = 1, 16, 2
    for name, given, allowed in (
        ("--models", args.models, MODELS),
        ("--modes", args.modes, MODES),
        ("--variants", args.variants, VARIANTS),
    ):
        unknown = [g for g in given if g not in allowed]
        if unknown or not given:
            parser.error(f"{name} takes a comma-separated subset of {','.join(allowed)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.only is not None:
        try:
            args.cells = parse_only(args.only)
        except ValueError as exc:
            parser.error(str(exc))
    else:
        args.cells = [(model, mode) for model in args.models for mode in args.modes]
    command = " ".join(["python -m benchmarks.inductor_bench", *(argv or sys.argv[1:])])
    info = _stamp(command)
    print(json.dumps(info, indent=1), flush=True)
    specs = _specs(args)
    saved = load_results(args.results, _sizes(args))
    if saved:
        print(
            f"{len(saved)} runs found in {args.results} are reported with this call's", flush=True
        )
    records = []
    for round_ in range(args.rounds):
        for spec in specs:  # interleaved: every model, mode and variant once per round
            spec = {**spec, "round": round_}
            record = run_child(spec, args.process_timeout)
            records.append(record)
            save_result(args.results, record)
            print(
                f"round {round_ + 1}/{args.rounds} {spec['model']} {spec['mode']} "
                f"{spec['variant']}: ok={record['ok']} wall {record['process_wall_s']:.2f} s",
                flush=True,
            )
            print("\n".join(breakdown(record)), flush=True)
    everything = saved + records
    cells = {(r["spec"]["model"], r["spec"]["mode"]) for r in everything}
    report = _report(
        everything,
        [m for m in MODELS if any(c[0] == m for c in cells)],
        [m for m in MODES if any(c[1] == m for c in cells)],
    )
    old_python = (3, 11, 0) <= sys.version_info[:3] <= (3, 11, 8)
    if old_python and any(mode == "max-autotune" for _, mode in cells):
        report += (
            "\n\nNote: on Python 3.11.0 to 3.11.8 Inductor skips max-autotune's precompile step"
            " (python/cpython#106905): template choices compile when first benchmarked."
        )
    print(report, flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"stamp": info, "records": everything}, indent=1))
    return 0 if all(r["ok"] and r["equal"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
