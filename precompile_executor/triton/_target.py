"""Parse a compile target such as ``"cuda:90"`` into Triton's ``GPUTarget``."""

from __future__ import annotations

import re
import sys
from typing import Any

from triton.backends.compiler import GPUTarget

CUDA_WARP_SIZE = 32
"""Threads per warp on every NVIDIA GPU."""

HIP_WAVE64_WARP_SIZE = 64
"""Threads per wavefront on CDNA/GCN (gfx9xx) AMD GPUs."""

HIP_WAVE32_WARP_SIZE = 32
"""Threads per wavefront on RDNA (gfx10xx and later) AMD GPUs."""

TARGET_FORMS = "'cuda:90', 'cuda:90:32', 'hip:gfx942' or 'hip:gfx942:64'"
"""The spellings :func:`parse_target` accepts, for error messages."""

_CUDA = re.compile(r"cuda:(?:sm_?)?(\d+)(?::(\d+))?")
_HIP = re.compile(r"hip:(gfx[0-9a-f]+)(?::(\d+))?")


def parse_target(spec: str | Any) -> Any:
    """Return the ``GPUTarget`` that ``spec`` names.

    Args:
        spec: ``"cuda:<compute capability>[:<warp size>]"`` (``"cuda:90"``, ``"cuda:sm_80"``),
            ``"hip:<gfx arch>[:<warp size>]"`` (``"hip:gfx942"``), or a ``GPUTarget``, returned
            as it is.

    Returns:
        A ``triton.backends.compiler.GPUTarget``.

    Raises:
        ValueError: ``spec`` is not one of the accepted forms.
    """
    if isinstance(spec, GPUTarget):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"a target must be a string such as {TARGET_FORMS}, not {spec!r}")
    text = spec.strip().lower()
    if match := _CUDA.fullmatch(text):
        warp_size = int(match.group(2)) if match.group(2) else CUDA_WARP_SIZE
        return GPUTarget("cuda", int(match.group(1)), warp_size)
    if match := _HIP.fullmatch(text):
        arch = match.group(1)
        default = HIP_WAVE64_WARP_SIZE if arch.startswith("gfx9") else HIP_WAVE32_WARP_SIZE
        warp_size = int(match.group(2)) if match.group(2) else default
        return GPUTarget("hip", arch, warp_size)
    raise ValueError(f"unknown target {spec!r}: use {TARGET_FORMS}")


def format_target(target: Any) -> str:
    """Return the ``"backend:arch:warp_size"`` spelling of a ``GPUTarget``."""
    return f"{target.backend}:{target.arch}:{target.warp_size}"


FALLBACK_TARGET = "cuda:90"
"""The target warmed while this process has no CUDA context to ask (asking would create one):
the costly part of a first compile — loading the compiler and hashing Triton's installation —
is the same for every target (``benchmarks/fork_cold_probe.py``)."""


def caller_target() -> str:
    """This process's Triton target (``"cuda:90"``) if it has a CUDA context already, else
    :data:`FALLBACK_TARGET`."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    hip = getattr(getattr(torch, "version", None), "hip", None)
    if cuda is None or hip or not cuda.is_initialized():
        return FALLBACK_TARGET
    major, minor = cuda.get_device_capability(cuda.current_device())
    return f"cuda:{major}{minor}"
