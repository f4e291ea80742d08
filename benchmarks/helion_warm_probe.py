"""Where the warm-up of Helion's spawn-mode executor goes, step by step (docs/helion.md, "Warm-up
off the clock")

    python -m benchmarks.helion_warm_probe [--workers 16] [--out FILE]

``precompile_executor.helion`` builds ``PrecompileExecutor(16, initializer=import_helion,
initargs=("cuda:90",), devices=[0])`` and calls ``warm_up()``: loky spawns a warm template, which
runs the initializer (``import helion``: torch, ``torch._inductor``, triton; then one tiny Triton
compile, ``precompile_executor.triton.prewarm``); the workers are forked from it, and each pinned
worker opens its CUDA context (``_worker.open_cuda_context``) before it says hello. Each case runs
in a fresh interpreter (``subprocess``, its own session, killed with its process tree past
``--timeout``), prints one JSON line, and a markdown table ends the run:

* ``imports``: ``import torch``, ``import triton``, ``import helion`` (after torch) and
  ``prewarm("cuda:90")`` (a cross-target compile: no GPU needed), timed one after the other —
  what the template's initializer costs serially;
* ``imports-inductor``: ``import torch``, ``import torch._inductor``, then ``import helion``:
  how much of helion's import is the inductor it imports;
* ``cuda-context-1`` (GPU only): ``torch.cuda.init()``, ``torch.empty(1, device="cuda")``,
  ``torch.cuda.synchronize()`` in one process, each timed;
* ``cuda-context-N`` (GPU only): N interpreters import torch, then wait on their stdin; all are
  released at once and each times release → context ready (min/median/max, and the spread of the
  moments they were ready): whether concurrent context creations serialise in the driver;
* ``ex-1-noinit``, ``ex-N-noinit``: ``PrecompileExecutor(n)`` then ``warm_up()``, no initializer;
* ``ex-N-helion-cpu``: ``initializer=import_helion, initargs=("cuda:90",)``, no devices;
* ``ex-N-helion-gpu`` (GPU only): the same with ``devices=[0]`` — the recommended set-up;
* ``ex-N-helion-gpu-notarget`` (GPU only): ``initargs=(None,)`` (no prewarm), ``devices=[0]``.

An executor case's seconds run from just before the constructor to ``warm_up()`` returning. With
an initializer it is :func:`timed_import_helion`, which writes when it entered, when torch and
then helion were imported and when ``import_helion`` returned; so a case splits into template
start (constructor → initializer entry), the three steps, and initializer end → ``warm_up()``
returned (forks, worker starts, CUDA contexts). Every worker's fork moment is read from
``/proc/<pid>/stat`` (its start time, on the boot clock) for the pids ``warm_up()`` returns: the
first, median and last fork after the initializer's end. All cross-process moments are
``CLOCK_BOOTTIME`` (the clock of ``/proc`` start times, the same in every process; psutil's
``create_time`` adds the boot time rounded to a second, too coarse here). Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

CASE_TIMEOUT_S = 300.0
"""Default limit for one case's interpreter; past it its process tree is killed."""

TARGET = "cuda:90"
"""The Triton target of the H200 that the recommended set-up prewarms for."""


def _now() -> float:
    """The cross-process clock: seconds since boot, as ``/proc/<pid>/stat`` counts start times."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _started_at(pid: int) -> float:
    """When process ``pid`` was created (forked), on :func:`_now`'s clock."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in clock ticks


def timed_import_helion(path: str, target: str | None) -> None:
    """The real ``import_helion(target)``, with the moment of each step appended to ``path``.

    An initializer: runs once in the warm template (or in each worker if the template could not
    fork). Imports torch and then helion first, each timed; ``import_helion`` then finds them
    imported, so what it adds is the prewarm compile.
    """

    def mark(step: str) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "step": step, "t": _now()}) + "\n")

    mark("entry")
    import torch  # noqa: F401

    mark("torch")
    import helion  # noqa: F401

    mark("helion")
    from precompile_executor.helion import import_helion

    import_helion(target)
    mark("end")


# -- the cases, each run in its own interpreter (``--child CASE``) ---------------------------------


def _child_imports() -> dict[str, Any]:
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    import triton

    t2 = time.perf_counter()
    import helion

    t3 = time.perf_counter()
    from importlib.metadata import version

    from precompile_executor.triton import prewarm

    t4 = time.perf_counter()
    prewarm(TARGET)
    t5 = time.perf_counter()
    # Asked only after the timings (with NVML, as ``import torch._inductor`` asks: no context).
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    return {
        "import_torch_s": round(t1 - t0, 3),
        "import_triton_s": round(t2 - t1, 3),
        "import_helion_s": round(t3 - t2, 3),
        "prewarm_s": round(t5 - t4, 3),
        "seconds": round(t5 - t0, 3),
        "cuda": bool(torch.cuda.is_available()),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "helion": getattr(helion, "__version__", None) or version("helion"),
        },
    }


def _child_imports_inductor() -> dict[str, Any]:
    """How much of ``import helion`` is ``import torch._inductor`` (which helion imports)."""
    t0 = time.perf_counter()
    import torch  # noqa: F401

    t1 = time.perf_counter()
    import torch._inductor  # noqa: F401

    t2 = time.perf_counter()
    import helion  # noqa: F401

    t3 = time.perf_counter()
    return {
        "import_torch_s": round(t1 - t0, 3),
        "import_torch_inductor_s": round(t2 - t1, 3),
        "import_helion_rest_s": round(t3 - t2, 3),
        "seconds": round(t3 - t0, 3),
    }


def _child_cuda_context_1() -> dict[str, Any]:
    import torch

    t0 = time.perf_counter()
    torch.cuda.init()
    t1 = time.perf_counter()
    torch.empty(1, device="cuda")
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    return {
        "init_s": round(t1 - t0, 3),
        "empty_s": round(t2 - t1, 3),
        "synchronize_s": round(t3 - t2, 3),
        "seconds": round(t3 - t0, 3),
    }


def _child_context_member() -> dict[str, Any]:
    """One of ``cuda-context-N``'s processes: import torch, say ready, wait, open the context."""
    import torch

    print("ready", flush=True)
    sys.stdin.readline()
    released = _now()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    ready = _now()
    return {"released": released, "ready": ready, "seconds": round(ready - released, 3)}


def _child_executor(workers: int, init: str | None, gpu: bool) -> dict[str, Any]:
    from precompile_executor import PrecompileExecutor

    fd, marks = tempfile.mkstemp(suffix="_warm_marks.jsonl")
    os.close(fd)
    kwargs: dict[str, Any] = {}
    if init is not None:
        kwargs.update(
            initializer=timed_import_helion,
            initargs=(marks, None if init == "notarget" else TARGET),
        )
    if gpu:
        kwargs["devices"] = [0]
    b0 = _now()
    t0 = time.perf_counter()
    ex = PrecompileExecutor(workers, **kwargs)
    try:
        pids = ex.warm_up(timeout=CASE_TIMEOUT_S)
        seconds = time.perf_counter() - t0
        b1 = _now()
        forks = sorted(_started_at(pid) for pid in pids)
    finally:
        ex.terminate_workers()
    with open(marks) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    os.unlink(marks)
    result: dict[str, Any] = {"seconds": round(seconds, 3), "workers": len(pids)}
    first = {}
    for line in lines:
        first.setdefault(line["step"], line["t"])
    result["initializer_runs"] = sum(line["step"] == "entry" for line in lines)
    # Fork moments count from the initializer's end when there is one, else from the constructor.
    origin = first.get("end", b0)
    if {"entry", "torch", "helion", "end"} <= first.keys():
        result["split"] = {
            "template_start_s": round(first["entry"] - b0, 3),
            "import_torch_s": round(first["torch"] - first["entry"], 3),
            "import_helion_s": round(first["helion"] - first["torch"], 3),
            "prewarm_s": round(first["end"] - first["helion"], 3),
            "init_end_to_warm_up_s": round(b1 - first["end"], 3),
        }
    if forks:
        result["forks_after_" + ("init_end_s" if "end" in first else "constructor_s")] = {
            "first": round(forks[0] - origin, 3),
            "median": round(statistics.median(forks) - origin, 3),
            "last": round(forks[-1] - origin, 3),
            "warm_up_returned": round(b1 - origin, 3),
        }
    return result


def _child(case: str) -> None:
    if case == "imports":
        result = _child_imports()
    elif case == "imports-inductor":
        result = _child_imports_inductor()
    elif case == "cuda-context-1":
        result = _child_cuda_context_1()
    elif case == "context-member":
        result = _child_context_member()
    else:
        _, n, *rest = case.split("-", 2)
        init = {"noinit": None, "helion-cpu": "target", "helion-gpu": "target"}.get(
            rest[0], "notarget"
        )
        result = _child_executor(int(n), init, gpu="gpu" in rest[0])
    print("RESULT " + json.dumps(result), flush=True)


# -- the parent -----------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _kill_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc``, everything under it, and its session's process group."""
    try:
        import psutil

        tree = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - gone already, or no psutil: the group kill below remains
        tree = []
    for p in tree:
        try:
            p.kill()
        except Exception:  # noqa: BLE001 - it ended meanwhile
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _parse(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            parsed: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return parsed
    return None


def _run_child(case: str, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Run ``--child case`` in a fresh interpreter; its result, or its error and stderr tail."""
    argv = [sys.executable, "-m", "benchmarks.helion_warm_probe", "--child", case]
    proc = subprocess.Popen(
        argv,
        cwd=_root(),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        stdout, stderr = proc.communicate()
        return {"error": f"timed out after {timeout:.0f} s", "stderr": stderr[-1500:]}
    result = _parse(stdout)
    if result is None or proc.returncode != 0:
        return {"error": f"exit status {proc.returncode}", "stderr": stderr[-1500:]}
    return result


def _run_contexts(n: int, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """``cuda-context-N``: N members import torch, are released together, open their contexts."""
    argv = [sys.executable, "-m", "benchmarks.helion_warm_probe", "--child", "context-member"]
    procs = [
        subprocess.Popen(
            argv,
            cwd=_root(),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(n)
    ]
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":  # EOF: it failed to import torch
                raise RuntimeError("a member ended before it was ready")
        for p in procs:  # the release: one line each, microseconds apart
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    except (subprocess.TimeoutExpired, RuntimeError) as exc:
        for p in procs:
            _kill_tree(p)
        tails = [p.stderr.read()[-400:] if p.stderr else "" for p in procs]
        return {"error": str(exc) or f"timed out after {timeout:.0f} s", "stderr": tails[0]}
    members = [_parse(out) for out, _ in outputs]
    if any(m is None for m in members) or any(p.returncode != 0 for p in procs):
        bad = next(i for i, m in enumerate(members) if m is None or procs[i].returncode != 0)
        return {"error": "a member failed", "stderr": outputs[bad][1][-1500:]}
    per = sorted(m["seconds"] for m in members if m is not None)
    released = min(m["released"] for m in members if m is not None)
    ready = sorted(m["ready"] - released for m in members if m is not None)
    return {
        "seconds": round(ready[-1], 3),
        "processes": n,
        "per_process_s": {
            "min": per[0],
            "median": round(statistics.median(per), 3),
            "max": per[-1],
        },
        "ready_after_release_s": {"first": round(ready[0], 3), "last": round(ready[-1], 3)},
    }


def _has_cuda(env: dict[str, str]) -> bool:
    """Whether torch sees a GPU, asked in a fresh interpreter (when ``imports`` failed)."""
    code = "import torch; print(torch.cuda.is_available())"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=dict(env, PYTORCH_NVML_BASED_CUDA_CHECK="1"),
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.stdout.strip().endswith("True")


def _notes(result: dict[str, Any]) -> str:
    """The table's notes column: the result less its seconds, flattened."""
    if "error" in result:
        tail = " ".join(result.get("stderr", "").split()[-30:])
        return f"FAILED: {result['error']}; stderr: …{tail}"
    if "skipped" in result:
        return "skipped: " + str(result["skipped"])
    parts = []
    for key, value in result.items():
        if key in ("case", "seconds", "versions"):
            continue
        if isinstance(value, dict):
            inner = ", ".join(f"{k} {v}" for k, v in value.items())
            parts.append(f"{key}: {inner}")
        else:
            parts.append(f"{key} {value}")
    return "; ".join(parts)


def main() -> int:
    """Run every case in order; print its JSON line, then the markdown table."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.helion_warm_probe", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--workers", type=int, default=16, help="N in the cases' names")
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, help="per case, seconds")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return 0
    n = args.workers
    env = _env()
    gpu_env = dict(env, CUDA_VISIBLE_DEVICES=env.get("CUDA_VISIBLE_DEVICES") or "0")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results: list[dict[str, Any]] = []

    def record(case: str, result: dict[str, Any]) -> dict[str, Any]:
        result = {"case": case, **result}
        results.append(result)
        print(json.dumps(result), flush=True)
        return result

    imports = record("imports", _run_child("imports", args.timeout, env))
    record("imports-inductor", _run_child("imports-inductor", args.timeout, env))
    cuda = imports["cuda"] if "cuda" in imports else _has_cuda(env)
    no_gpu = {"skipped": "no CUDA device (torch.cuda.is_available() is False)"}
    if cuda:
        record("cuda-context-1", _run_child("cuda-context-1", args.timeout, gpu_env))
        record(f"cuda-context-{n}", _run_contexts(n, args.timeout, gpu_env))
    else:
        record("cuda-context-1", dict(no_gpu))
        record(f"cuda-context-{n}", dict(no_gpu))
    for case in ("ex-1-noinit", f"ex-{n}-noinit", f"ex-{n}-helion-cpu"):
        record(case, _run_child(case, args.timeout, env))
    for case in (f"ex-{n}-helion-gpu", f"ex-{n}-helion-gpu-notarget"):
        record(case, _run_child(case, args.timeout, env) if cuda else dict(no_gpu))

    versions = imports.get("versions", {})
    header = (
        f"helion warm-up probe, {started}: {platform.node()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f"; one run per case, each a fresh interpreter; N = {n}"
    )
    lines = [header, "", "| case | seconds | notes |", "|---|---|---|"]
    for r in results:
        seconds = r.get("seconds")
        lines.append(f"| {r['case']} | {'' if seconds is None else seconds} | {_notes(r)} |")
    table = "\n".join(lines)
    print()
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
