"""Initializers for the GPU tests' executors, kept out of ``test_gpu.py``.

An initializer runs in the warm template, which must stay safe to fork. A worker kind's template
imports the initializer's module to unpickle it, and ``test_gpu.py`` asks
``torch.cuda.is_available()`` at import (for its skip markers), which on a GPU machine leaves a
CUDA/NVML thread in the process: every template would refuse to fork and the GPU tests would run
on fresh interpreters instead. This module imports nothing at import time.
"""

from __future__ import annotations

import os


def tag(name: str) -> None:
    """An initializer that only gives executors distinct worker pools."""
    os.environ["PRECOMPILE_TEST_POOL"] = name


def import_torch_tagged(name: str) -> None:
    """``import torch`` (what a GPU worker needs), in a pool of its own."""
    import torch  # noqa: F401

    tag(name)


def import_torch_asking_for_cuda(name: str) -> None:
    """``import torch`` and ``torch.cuda.is_available()``, as ``import torch._inductor`` (and so
    ``import helion``) does at import: with the NVML check on, NVML is left initialized, with a
    thread — which the template must be rid of before it forks."""
    import torch

    torch.cuda.is_available()
    tag(name)


def import_torch_counting_with_the_runtime(name: str) -> None:
    """``torch.cuda.is_available()`` without the NVML check: the CUDA runtime counts devices,
    after which torch refuses CUDA in a forked child — the template must refuse to fork."""
    os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    import torch

    torch.cuda.is_available()
    tag(name)
