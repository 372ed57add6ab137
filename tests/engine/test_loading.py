"""inferd.engine.loading: loads run on one thread at nice 19; when the system refuses to lower its priority (a
seccomp filter), the loads still run and the log says so once, naming the fix."""
from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import threading

from inferd.engine import loading
from inferd.observability.log import JsonFormatter


async def test_a_refused_setpriority_is_logged_once_and_loads_still_run(monkeypatch, caplog):
    caplog.set_level(logging.INFO)

    def refused(*args: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refused)
    monkeypatch.setattr(loading, "_pool", None)         # a fresh load thread, as in a new process
    try:
        threads = {await loading.run_load(threading.get_native_id) for _ in range(3)}
    finally:
        loading._pool.shutdown(wait=True)
    assert len(threads) == 1 and threading.get_native_id() not in threads
    [warning] = [r for r in caplog.records if r.getMessage() == "load_priority_not_lowered"]
    assert warning.levelno == logging.WARNING and "SystemCallFilter=setpriority" in warning.fields["fix"]
    line = json.loads(JsonFormatter().format(warning))      # the daemon's JSON line carries the fields
    assert line["event"] == "load_priority_not_lowered" and line["error"].startswith("[Errno 1]")


async def test_the_load_thread_runs_at_nice_19(monkeypatch, caplog):
    monkeypatch.setattr(loading, "_pool", None)
    try:
        nice = await loading.run_load(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    finally:
        loading._pool.shutdown(wait=True)
    assert nice == loading.LOAD_NICE
    assert not [r for r in caplog.records if r.getMessage() == "load_priority_not_lowered"]


async def test_startup_loads_run_at_normal_priority_two_at_once(monkeypatch):
    # At startup nothing serves yet: a niced load would only yield to the machine's other processes.
    monkeypatch.setattr(loading, "_startup_executor", None)
    both = threading.Barrier(2, timeout=30)            # passes only when two loads run at the same time

    def load() -> int:
        both.wait()
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    try:
        with loading.startup_loads():
            nices = await asyncio.gather(loading.run_load(load), loading.run_load(load))
    finally:
        loading._startup_executor.shutdown(wait=True)
    assert nices == [os.getpriority(os.PRIO_PROCESS, 0)] * 2
