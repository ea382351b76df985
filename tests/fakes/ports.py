"""Free TCP ports for test servers."""

from __future__ import annotations

import socket


def free_port_on_all(hosts: list[str]) -> int:
    """A port that is free on every one of `hosts` (loopback aliases such as 127.0.0.2)."""
    for _ in range(20):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no port free on every loopback address")
