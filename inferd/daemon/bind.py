"""The listening socket, bound before any engine loads, so a taken port fails the start at once.

Bound but not yet listening, the port is ours and a client's connect is refused (not left hanging)
until the daemon is ready; aiohttp's SockSite calls listen() on it once the app is set up.
"""
from __future__ import annotations

import socket


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
