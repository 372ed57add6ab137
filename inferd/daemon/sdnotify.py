"""systemd's sd_notify protocol, without libsystemd: datagrams to $NOTIFY_SOCKET.

Type=notify services tell systemd when they are READY, RELOADING and STOPPING, and ping
the watchdog. Everything here is a no-op when $NOTIFY_SOCKET is unset (not under systemd),
so the daemon calls it unconditionally.
"""
from __future__ import annotations

import asyncio
import os
import socket
import time


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address = _socket_address(env.get("NOTIFY_SOCKET", ""))
        self._sock: socket.socket | None = None
        self.watchdog_interval_s = _watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, message: str) -> None:
        """Send one state update; failures are swallowed: systemd going away must not kill us."""
        if self._address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(message.encode(), self._address)
        except OSError:
            pass

    def ready(self, status: str = "serving") -> None:
        self.notify(f"READY=1\nSTATUS={status}")

    def reloading(self) -> None:
        # systemd >= 253 (Type=notify-reload) requires MONOTONIC_USEC with RELOADING=1.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.notify(f"RELOADING=1\nMONOTONIC_USEC={usec}")

    def stopping(self, status: str = "draining") -> None:
        self.notify(f"STOPPING=1\nSTATUS={status}")

    def status(self, text: str) -> None:
        self.notify(f"STATUS={text}")

    async def watchdog_loop(self) -> None:
        """Ping from the event loop itself: if the loop is stuck, pings stop and systemd restarts us."""
        if self._address is None or self.watchdog_interval_s is None:
            return
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_interval_s)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _socket_address(value: str) -> str | bytes | None:
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()  # abstract namespace
    if value.startswith("/"):
        return value
    return None  # vsock and other forms are not used for services


def _watchdog_interval(env) -> float | None:
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None  # the watchdog is meant for another process (e.g. our parent)
    try:
        timeout_s = int(usec) / 1e6
    except ValueError:
        return None
    if timeout_s <= 0:
        return None
    return timeout_s / 2  # ping at half the timeout, as sd_watchdog_enabled(3) advises
