"""GPU-machine probe: can a worker forked from a template still use CUDA? (docs/gpu-runs.md,
"Workers forked after CUDA's driver thread")

    python -m benchmarks.gpu_fork_probe            # prints one line per case, then a verdict

Each case runs in a fresh interpreter (``subprocess``), so nothing of one leaks into the next:

* ``torch``: the template imported torch only — what ``open_cuda_context`` does in a worker
  forked from it (``CUDA_VISIBLE_DEVICES`` set in the child, ``torch.cuda.init()``, a tensor on
  the GPU, a Triton kernel launched and checked);
* ``nvml``: the template also called ``torch.cuda.is_available()`` with
  ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (what ``import torch._inductor`` does at import): an NVML
  thread is left; can the child still do all of the above?
* ``runtime``: the same call without the NVML check (``cudaGetDeviceCount``: the driver is
  initialized in the template);
* ``helion``: the template imported helion (with the measurement-only ``IntelGPUError`` shim).

For each: the template's threads by kernel name, whether torch says CUDA is initialized there, and
in the child: ok or the exception; and what ``precompile_executor._fork_server.fork_safety()`` says
in the template (``None``: it forks). On the H200 with torch 2.11 (docs/gpu-runs.md, "Workers
forked after CUDA's driver thread"): the children of ``torch``, ``nvml`` and ``helion`` use CUDA,
the ``runtime`` one cannot ("Cannot re-initialize CUDA in forked subprocess"); ``fork_safety()``
accepts exactly the first three. (Shutting NVML down after the count does not end the driver's
thread.) Re-run it when torch changes how it counts devices.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CASES = ("torch", "nvml", "runtime", "helion")

_CHILD = r"""
import json, os, sys
case = sys.argv[1]
if case.startswith("nvml"):
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
import torch
if case.startswith("nvml") or case == "runtime":
    torch.cuda.is_available()
if case.startswith("helion"):
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    from benchmarks.helion_bench import worker_init
    worker_init()
from precompile_executor._fork_server import _thread_names, fork_safety
verdict = fork_safety()
maps = open("/proc/self/maps").read()
template = {"threads": _thread_names(), "cuda_initialized": torch.cuda.is_initialized(),
            "loaded": [lib for lib in ("libcuda.so", "libnvidia-ml.so") if lib in maps],
            "fork_safety": verdict}
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    result = {}
    try:
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        torch.cuda.init()
        x = torch.arange(1024, device="cuda", dtype=torch.float32)
        import triton, triton.language as tl
        @triton.jit
        def double(p, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(p + o, tl.load(p + o, mask=o < n) * 2, mask=o < n)
        import time
        t0 = time.perf_counter()
        double[(1,)](x, 1024, BLOCK=1024)
        torch.cuda.synchronize()
        result = {"ok": bool((x.cpu() == torch.arange(1024) * 2).all()),
                  "device_count": torch.cuda.device_count(),
                  "kernel_s": round(time.perf_counter() - t0, 3)}
    except BaseException as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
    os.write(w, json.dumps(result).encode())
    os._exit(0)
os.close(w)
data = b""
while chunk := os.read(r, 65536):
    data += chunk
os.waitpid(pid, 0)
print(json.dumps({"case": case, "template": template, "child": json.loads(data or b"{}")}))
"""


def main() -> int:
    """Run every case; print its line and a verdict for the NVML case."""
    argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_fork_probe", description=__doc__.split("\n")[0]
    ).parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["JE_ARROW_MALLOC_CONF"] = "background_thread:false"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    results = {}
    # A file, not ``-c``: @triton.jit reads its function's source, which ``-c`` code has none of.
    with tempfile.NamedTemporaryFile("w", suffix="_fork_probe.py", delete=False) as f:
        f.write(_CHILD)
    for case in CASES:
        try:
            proc = subprocess.run(
                [sys.executable, f.name, case], capture_output=True, text=True, timeout=180, env=env
            )
            line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
            results[case] = json.loads(line) if line else {"stderr": proc.stderr[-1500:]}
        except subprocess.TimeoutExpired:
            results[case] = {"error": "timed out after 180 s (a hang in the child?)"}
        print(json.dumps(results[case]), flush=True)
    os.unlink(f.name)
    for case, result in results.items():
        can = bool(result.get("child", {}).get("ok"))
        template = result.get("template", {})
        forks = "fork_safety" in template and template["fork_safety"] is None
        print(
            f"VERDICT {case}: its forked child {'can' if can else 'can NOT'} use CUDA;",
            f"fork_safety() {'accepts' if forks else 'refuses'}:",
            "right" if can == forks else "WRONG",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
