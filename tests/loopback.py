"""A network namespace with only loopback, for the test's Ray cluster (``ray_cluster`` fixture).

Ray picks the machine's interface address for its services even when told 127.0.0.1
(``_node_ip_address``, ``--node-ip-address``): ``gcs_server`` and ``raylet`` then listen on every
interface. In a namespace whose only interface is ``lo`` Ray finds no other address, and every
Ray process binds to 127.0.0.1 (docs/ray.md, "Tests on loopback only").

:func:`loopback_only` moves the *calling thread* — and every thread and process it starts from
then on (a thread's namespace is inherited at ``clone``) — into such a namespace and back at the
end, so a module's Ray tests run inside it while the rest of the session (and threads that
already exist, such as a dask client's IO loop) stays where it was. It needs ``CAP_SYS_ADMIN``
(root, as in CI); without it the fixture skips with the reason.

:func:`non_loopback_sockets` is the check: every inet socket of the given processes, listening
or connected, on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct
from collections.abc import Iterable, Iterator

import psutil

CLONE_NEWNET = 0x40000000  # <sched.h>
SIOCGIFFLAGS = 0x8913  # <linux/sockios.h>
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1  # <net/if.h>
_IFREQ = "16sH14x"  # struct ifreq: the name, then ifr_flags (a short) in the 24-byte union

LOOPBACK = frozenset({"127.0.0.1", "::ffff:127.0.0.1"})
"""Addresses that are 127.0.0.1: IPv4, or IPv4-mapped on a dual-stack IPv6 socket."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _bring_up_loopback() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0))
        flags = struct.unpack(_IFREQ, ifreq)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | IFF_UP))


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Run the block (this thread, and what it starts) in a new namespace holding only ``lo``.

    Raises:
        PermissionError: this process may not create network namespaces (not root).
    """
    libc = _libc()
    previous = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise PermissionError(errno, f"unshare(CLONE_NEWNET): {os.strerror(errno)}")
        try:
            _bring_up_loopback()
            names = [name for _, name in socket.if_nameindex()]
            assert names == ["lo"], names
            yield
        finally:
            if libc.setns(previous, CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, f"setns back to the first namespace: {os.strerror(errno)}")
    finally:
        os.close(previous)


def non_loopback_sockets(pids: Iterable[int]) -> list[str]:
    """Every inet socket of these processes whose local or remote address is not 127.0.0.1."""
    bad: list[str] = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            conns = proc.net_connections(kind="inet")
            name = proc.name()
        except psutil.Error:
            continue  # gone already: nothing listens
        for c in conns:
            for addr in (c.laddr, c.raddr):
                if addr and addr.ip not in LOOPBACK:
                    bad.append(f"{name} (pid {pid}): {c.status} {c.laddr} -> {c.raddr}")
    return bad


def listening(pids: Iterable[int]) -> list[str]:
    """The addresses these processes' TCP sockets listen on, as ``ip:port``."""
    found: list[str] = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:
            continue
        found += [f"{c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def ray_processes() -> list[psutil.Process]:
    """This process's descendants that belong to Ray (its services, raylets and workers)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "/ray/" in cmdline or cmdline.startswith("ray::"):
            found.append(proc)
    return found
