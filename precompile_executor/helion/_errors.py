"""The integration's own error (its home, so every module of ``helion/`` can raise it)."""

from __future__ import annotations


class UnsupportedHelionError(RuntimeError):
    """The installed Helion is not one whose precompile seam this integration knows.

    Nothing was patched. The message names what differs; pin ``helion==1.5.1`` (the
    ``precompile-executor[helion]`` extra does) or run Helion without this integration.
    """
