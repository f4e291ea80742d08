#!/usr/bin/env bash
# The Helion acceptance run on a GPU machine, from the repository root:
#   bash benchmarks/gpu_helion.sh            (writes everything under $OUT, default ./bench-out)
# Installs the wheels carried in .whl/ (helion 1.5.1, filecheck, loky; packaging only if the
# image lacks it) into /tmp/site, then runs the GPU tests of tests/test_helion.py and the
# benchmark. Each step continues after a failure of the previous one; the exit status is the
# first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/bench-out}"
mkdir -p "$OUT"
status=0

wheels=(.whl/helion-*.whl .whl/filecheck-*.whl .whl/loky-*.whl)
python3 -c "import packaging" 2>/dev/null || wheels+=(.whl/packaging-*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}" || exit 1
export PYTHONPATH=/tmp/site:$PWD

{
  echo "# Helion GPU run: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  echo "cores: $(nproc)"
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import benchmarks.helion_bench as b, helion; print('helion', helion.__version__ if hasattr(helion, '__version__') else '?', '| IntelGPUError shim used:', b.SHIMMED)"
} 2>&1 | tee "$OUT/helion-env.txt"

# 1. GPU tests (and the CPU ones) of the Helion integration. The test session imports helion in
#    this interpreter, so the shim goes in through a conftest-free path: sitecustomize.
mkdir -p /tmp/site-shim
cat > /tmp/site-shim/sitecustomize.py <<'PY'
# Measurement-only: define torch's IntelGPUError where this torch lacks it (helion 1.5.1 needs it).
try:
    from torch._inductor.runtime import triton_compat as _tc
    if not hasattr(_tc, "IntelGPUError"):
        class IntelGPUError(RuntimeError):
            pass
        _tc.IntelGPUError = IntelGPUError
except Exception:
    pass
PY
PYTHONPATH=/tmp/site-shim:$PYTHONPATH timeout 3000 python3 -m pytest tests/test_helion.py -v \
    -p no:cacheprovider -o faulthandler_timeout=900 2>&1 | tee "$OUT/helion-tests.txt"
rc=${PIPESTATUS[0]}; [ "$status" -eq 0 ] && status=$rc

# 2. The benchmark: four modes x seeded RandomSearch(32), then LFBO quick; one fresh
#    interpreter per scenario.
timeout 5400 python3 -m benchmarks.helion_bench --out "$OUT/helion-bench.md" \
    2>&1 | tee "$OUT/helion-bench.log"
rc=${PIPESTATUS[0]}; [ "$status" -eq 0 ] && status=$rc
exit "$status"
