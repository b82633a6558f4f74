"""Ports for the servers tests start: free when chosen, and below the kernel's ephemeral range.

A port from bind(port 0) lies in the ephemeral range, which connect() draws from as well.
Between the test choosing a port and the server binding it, and for the 60 s a closed client
connection's port stays in TIME_WAIT, that port or the one next to it (`metrics.port + 1`, the
second worker's metrics) may be the local end of one of the tests' own client connections: the
server's bind then fails with EADDRINUSE. A full run leaves thousands of such ports in
TIME_WAIT. connect() never picks a port below the ephemeral range.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10_000
DEFAULT_EPHEMERAL_LOW = 32_768


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> int:
    """The first of `count` consecutive loopback ports, each free when checked, all below
    the ephemeral range."""
    high = _ephemeral_low() - count
    if high <= LOWEST:
        raise RuntimeError(f"no room below the ephemeral range for {count} ports")
    for _ in range(1000):
        first = random.randrange(LOWEST, high)
        if all(_bindable(port) for port in range(first, first + count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports found")


def free_port() -> int:
    """One free loopback port below the ephemeral range."""
    return free_ports(1)
