"""Caller side: the cache key of a compile, and installing a worker's files in the caller's cache.

Triton stores one compile as a *group*: files named ``<kernel>.<ext>`` (``.source``, ``.ttir``,
``.ttgir``, ``.llir``, ``.ptx``, ``.cubin``, ``.json``) under a directory named after the compile's
hash, plus ``__grp__<kernel>.json`` that lists their paths. ``triton.compile`` looks the group up by
hash and, when it is there, returns ``CompiledKernel(src, group, hash)`` without compiling.

:func:`install` writes a worker's files through the caller's own cache manager
(``triton.runtime.cache.get_cache_manager``), so whatever cache the caller configured (a
directory, ``TRITON_CACHE_DIR``, a custom or remote manager) receives them, and the group file is
written last, so a concurrent reader sees either no entry or a complete one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from triton import knobs
from triton.compiler import CompiledKernel, make_backend
from triton.runtime.cache import get_cache_key, get_cache_manager

from ._errors import CacheKeyMismatchError, UnsupportedTritonError
from ._messages import CompiledArtifacts

METADATA_NAME_LIMIT_CHARS = 150
"""Triton truncates a kernel's name to this many characters to name its cache files."""


def metadata_filename(src: Any) -> str:
    """Return the name of the metadata file (and group) for ``src``, as ``triton.compile`` does."""
    return f"{src.name[:METADATA_NAME_LIMIT_CHARS]}.json"


def expected_hash(
    src: Any, target: Any, options: Mapping[str, Any], env_vars: Mapping[str, str]
) -> str:
    """Return the hash under which ``triton.compile(src, target, options)`` caches its result.

    This repeats the first lines of ``triton.compile`` (3.6 to 3.9): parse the options with the
    target's backend, then hash Triton's key, the source, the backend, the options and the
    cache-invalidating environment variables.

    Raises:
        UnsupportedTritonError: a stages-inspection hook is set; its pipelines exist only in the
            caller's process, so a worker cannot compile them.
    """
    if getattr(knobs.runtime, "add_stages_inspection_hook", None) is not None:
        raise UnsupportedTritonError(
            "knobs.runtime.add_stages_inspection_hook is set: a custom pass pipeline lives in "
            "this process and cannot run in a worker. Unset the hook to precompile in workers."
        )
    backend = make_backend(target)
    parsed = backend.parse_options(dict(dict(options), **src.parse_options()))
    key = get_cache_key(src, backend, parsed, env_vars=dict(env_vars))
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def cached_group(hash_: str, filename: str) -> dict[str, str] | None:
    """Return the caller's cache group for ``hash_``, or ``None`` if it has none (or must not
    use it: ``TRITON_ALWAYS_COMPILE``)."""
    if knobs.compilation.always_compile:
        return None
    group = get_cache_manager(hash_).get_group(filename)
    if not group or filename not in group:
        return None
    return dict(group)


def install(artifacts: CompiledArtifacts, expected: str) -> dict[str, str]:
    """Write a worker's files into the caller's Triton cache and return the group.

    Args:
        artifacts: what the worker sent back.
        expected: the hash the caller computed for this compile.

    Returns:
        File name to path in the caller's cache, as ``CompiledKernel`` takes it.

    Raises:
        CacheKeyMismatchError: the worker hashed the compile differently.
    """
    if artifacts.hash != expected:
        raise CacheKeyMismatchError.from_hashes(expected, artifacts.hash, artifacts.worker_pid)
    manager = get_cache_manager(artifacts.hash)
    group = {
        name: manager.put(data, name, binary=True) for name, data in sorted(artifacts.files.items())
    }
    manager.put_group(artifacts.metadata_filename, group)
    return group


def load_compiled(src: Any, group: Mapping[str, str], hash_: str) -> Any:
    """Rebuild the ``CompiledKernel`` of a cache group, as ``triton.compile`` does on a hit."""
    return CompiledKernel(src, dict(group), hash_)
