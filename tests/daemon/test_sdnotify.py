import asyncio
import os
import socket

import pytest

from inferd.daemon.sdnotify import Notifier


@pytest.fixture
def notify_socket(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    yield path, sock
    sock.close()


def recv(sock) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.splitlines())


def test_notifier_is_a_no_op_without_notify_socket():
    n = Notifier(environ={})
    assert not n.enabled
    n.ready()  # must not raise


def test_ready_reloading_stopping_arrive_in_order(notify_socket):
    path, sock = notify_socket
    n = Notifier(environ={"NOTIFY_SOCKET": path})
    n.ready()
    n.reloading()
    n.ready()
    n.stopping()
    first, reload_, again, stop = (recv(sock) for _ in range(4))
    assert first["READY"] == "1"
    assert reload_["RELOADING"] == "1" and int(reload_["MONOTONIC_USEC"]) > 0
    assert again["READY"] == "1"
    assert stop["STOPPING"] == "1"
    n.close()


def test_abstract_namespace_socket_is_supported():
    name = f"inferd-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2)
    try:
        n = Notifier(environ={"NOTIFY_SOCKET": "@" + name})
        n.ready()
        assert recv(sock)["READY"] == "1"
        n.close()
    finally:
        sock.close()


def test_watchdog_interval_is_half_the_timeout_and_only_for_our_pid():
    assert Notifier(environ={"WATCHDOG_USEC": "2000000"}).watchdog_interval_s == 1.0
    other = Notifier(environ={"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval_s is None
    assert Notifier(environ={}).watchdog_interval_s is None


async def test_watchdog_loop_pings_from_the_event_loop(notify_socket):
    path, sock = notify_socket
    sock.setblocking(False)
    n = Notifier(environ={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000"})
    task = asyncio.create_task(n.watchdog_loop())
    loop = asyncio.get_running_loop()
    try:
        pings = 0
        while pings < 3:
            data = await asyncio.wait_for(loop.sock_recv(sock, 4096), timeout=2)
            assert data == b"WATCHDOG=1"
            pings += 1
    finally:
        task.cancel()
        n.close()
