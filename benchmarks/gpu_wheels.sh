#!/usr/bin/env bash
# Makes .whl/, the wheels benchmarks/gpu_session.sh installs on the GPU machine (which has no
# network), here, from the repository root: `bash benchmarks/gpu_wheels.sh`. .whl/ is ignored by
# git; pass it to the device run in `carry` (about 10 MB). The machine's image has Python 3.12,
# torch 2.11 and Triton 3.6, and the rest of dask's needs (click, cloudpickle, fsspec, jinja2,
# msgpack, psutil, pyyaml, sortedcontainers, toolz); these are what it lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
# pure-Python wheels: any platform
pip download -q --no-deps -d .whl loky==3.7.0 helion==1.5.1 filecheck==1.0.6 packaging==26.4 \
  fla-core==0.6.0 einops==0.8.2 liger-kernel==0.8.5 dask==2026.8.0 distributed==2026.8.0 \
  partd==1.4.2 locket==1.0.0 tblib==3.2.2 zict==3.0.0
# tornado has a compiled part: the machine's Python and platform
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_5_x86_64 -d .whl tornado==6.6.1
ls -l .whl
du -sh .whl
