#!/usr/bin/env bash
# The GPU-machine runs of this repository, by stage, from the repository root:
#   bash benchmarks/gpu_session.sh tests     # GPU + fault + Triton + Helion tests
#   bash benchmarks/gpu_session.sh starts    # s8: warm templates vs interpreters (16 workers)
#   bash benchmarks/gpu_session.sh ordering  # s7: ordering by predicted cost (16 workers, 64 configs)
#   bash benchmarks/gpu_session.sh helion    # the Helion benchmark (benchmarks.helion_bench)
# Carry .whl (loky, helion, filecheck, packaging wheels; see docs/gpu-runs.md). Output under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/bench-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
wheels=(.whl/loky-*.whl)
ls .whl/helion-*.whl >/dev/null 2>&1 && wheels+=(.whl/helion-*.whl .whl/filecheck-*.whl)
python3 -c "import packaging" 2>/dev/null || wheels+=(.whl/packaging-*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}" || exit 1
# Measurement-only shim: torch 2.11 lacks the IntelGPUError that helion 1.5.1 imports.
mkdir -p /tmp/site-shim
cat > /tmp/site-shim/sitecustomize.py <<'PY'
try:
    from torch._inductor.runtime import triton_compat as _tc
    if not hasattr(_tc, "IntelGPUError"):
        class IntelGPUError(RuntimeError):
            pass
        _tc.IntelGPUError = IntelGPUError
except Exception:
    pass
PY
export PYTHONPATH=/tmp/site-shim:/tmp/site:$PWD
{
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  echo "cores: $(nproc)"
  python3 -c "import sys, torch, triton, loky; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'loky', loky.__version__)"
} 2>&1 | tee -a "$OUT/env.txt"
case "${1:-tests}" in
  tests)
    timeout "${TESTS_TIMEOUT:-560}" python3 -m pytest -q -p no:cacheprovider -rfEs \
      ${TESTS:-tests/test_gpu.py tests/test_triton.py tests/test_devices.py tests/test_faults.py tests/test_helion.py} \
      > "$OUT/tests.txt" 2>&1; tail -40 "$OUT/tests.txt" ;;
  starts)
    timeout "${STARTS_TIMEOUT:-560}" python3 -m benchmarks.run --workers 16 --configs "${CONFIGS:-64}" --repeats 1 --only s8 \
      --out "$OUT/starts" 2>&1 | tee "$OUT/starts.log" | tail -40 ;;
  ordering)
    timeout 560 python3 -m benchmarks.run --workers 16 --configs 64 --repeats 1 --only s7 \
      --contention --out "$OUT/ordering" 2>&1 | tee "$OUT/ordering.log" | tail -60 ;;
  helion)
    timeout "${HELION_TIMEOUT:-560}" python3 -m benchmarks.helion_bench --out "$OUT/helion-bench.md" \
      --timeout 150 ${HELION_ONLY:+--only $HELION_ONLY} 2>&1 | tee "$OUT/helion-bench.log" | tail -60 ;;
esac
