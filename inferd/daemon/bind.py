"""The listening socket, bound before any engine loads, so a taken port fails the start at once.

Bound but not yet listening, the port is ours and a client's connect is refused (not left hanging)
until the daemon is ready; aiohttp's SockSite calls listen() on it once the app is set up.
"""
from __future__ import annotations

import socket

from inferd.config import ServerConfig


class BindError(OSError):
    """The configured host:port cannot be bound (in use, not an address of this host, no permission)."""


def bind_listener(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket bound to host:port (port 0: any free one); IPv4 first for a name
    such as localhost that resolves to both."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BindError(f"server.host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = sorted(infos, key=lambda info: info[0] != socket.AF_INET)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as aiohttp's TCPSite: restarts rebind
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise BindError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def listen_backlog(server: ServerConfig) -> int:
    """The listen queue's length: every connection the listener takes (`max_connections` and the probe reserve)
    may arrive at once (clients reconnecting together after a restart or a failover) and wait in it to be
    accepted. aiohttp's default of 128 overflowed: the kernel then drops the handshake's last packet, a client
    that already sent its request waits for SYN-ACK retransmissions (a second, then 3, 7, 15, 31 s), and
    bench/frontend.py at 2,048 streams found 887 of them with no response byte 30 s on. The kernel caps it at
    net.core.somaxconn (4096 on current kernels). Read at start: a SIGHUP does not change it."""
    return server.max_connections + server.probe_connections
