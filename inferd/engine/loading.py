"""Where model loads do their blocking work: one thread, at the lowest CPU priority.

A load verifies every file's sha256, reads and converts the weights and allocates the KV pool. Run in
asyncio's default executor at normal priority, that work took the CPU from the versions already
serving (bench/lifecycle_stall.py: the reference engine's TTFT p99 x2.4 while another version loaded,
on the one CPU they share). Here the thread is `nice` 19 (Linux: per thread), so the scheduler gives
the serving threads the CPU whenever they want it and the load the rest; hashing, file reads and
NumPy's conversions release the GIL, so the load does not hold them up there either. One thread:
loads are one at a time anyway (inferd.models.memory_budget), and a second would only compete with the first.
The daemon's first loads are the exception (`startup_loads`): nothing serves yet for them to yield to.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

# The stdlib logger with the `fields` inferd's JSON lines carry: inferd.observability imports this package back.
log = logging.getLogger(__name__)
LOAD_NICE = 19
T = TypeVar("T")
_pool: ThreadPoolExecutor | None = None
STARTUP_LOADS = 2
_startup: contextvars.ContextVar[bool] = contextvars.ContextVar("inferd_startup_load", default=False)
_startup_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _lower_priority() -> None:
    """The load thread's initializer (once a process: the pool's one thread lives as long as it does)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOAD_NICE)
    except AttributeError:                  # not Linux: a load at normal priority
        pass
    except OSError as exc:                  # a seccomp filter (systemd's ~@resources), say: say so, loads still run
        log.warning("load_priority_not_lowered", extra={"fields": {
            "error": str(exc), "nice": LOAD_NICE,
            "consequence": "model loads run at normal priority and can slow the versions serving",
            "fix": "allow the setpriority system call (systemd: SystemCallFilter=setpriority)"}})


def load_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(1, thread_name_prefix="inferd-load", initializer=_lower_priority)
        return _pool


async def run_load(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` on the load thread (inside `startup_loads()`: on a startup thread, at normal priority)."""
    pool = _startup_pool() if _startup.get() else load_pool()
    return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))


@contextlib.contextmanager
def startup_loads() -> Iterator[None]:
    """Loads started inside (and in the tasks it creates) run at normal priority, STARTUP_LOADS at once.
    At startup no version serves yet, so a load at nice 19 yields only to the other processes on the
    machine: on a 2-core laptop with one core busy elsewhere, loading the shipped small + embed took
    22 s instead of 2 (bench/first_start.py)."""
    token = _startup.set(True)
    try:
        yield
    finally:
        _startup.reset(token)


def _startup_pool() -> ThreadPoolExecutor:
    global _startup_executor
    with _lock:
        if _startup_executor is None:
            _startup_executor = ThreadPoolExecutor(STARTUP_LOADS, thread_name_prefix="inferd-startup-load")
        return _startup_executor
