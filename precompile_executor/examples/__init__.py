"""Example Triton kernels that ship with the package.

:mod:`precompile_executor.examples.kernels` holds a matmul, a row softmax, a layer norm and a
fused add + GELU, each under ``@triton.autotune`` with a realistic list of configs, plus the
``PRECOMPILE_SPECS`` that ``precompile-executor demo`` warms. Importing this package does not
import Triton; importing ``kernels`` does.
"""
