"""Uploads' batch lines checked in a worker process, so a 90 MB upload does not compete with the event loop.

Checking a line (decode, then the same checks as a live request) is pure Python: in a thread of the
daemon it holds the GIL and shares the daemon's CPU with the loop, and other tenants' requests wait for it.
So one worker process per node (spawned at the first upload, `multiprocessing` "spawn": nothing of the
daemon's state is copied) checks every upload's lines, at the lowest CPU priority (SCHED_IDLE where the
kernel allows it, else nice 19): whenever the daemon has work, the kernel runs the daemon first.

Each upload's LineChecker lives in the worker, keyed by a token; the daemon sends one chunk at a time
(the uploads' lane) and gets back only what the route needs: the models first named in that chunk (with
their line number, for check_models) or the InputError. The worker dies with the daemon (PR_SET_PDEATHSIG,
and a thread watching its parent). If it crashes, the uploads it was checking fail with 503
`upload_checker_unavailable` (retryable) and the next upload starts a new one.
"""
from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import os
import signal
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from aiohttp import web

from inferd.api.errors import ApiError
from inferd.api.routes.batch_input import BatchLine, LineChecker

RETRY_AFTER_S = 5
_PR_SET_PDEATHSIG = 1


class WorkerLost(Exception):
    """The worker holding an upload's checker has gone (it crashed, or was replaced)."""


def unavailable() -> ApiError:
    return ApiError(503, "The upload's line checker stopped (its worker process exited); nothing was stored. "
                    "Retry the upload.", type="server_error", param="file", code="upload_checker_unavailable",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


class LineWorker:
    """Loop thread only: the node's one worker process, started at first use."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(os.getpid(),))
        return self._pool

    async def call(self, fn, *args):
        pool = self._executor()
        try:
            return await asyncio.wrap_future(pool.submit(fn, *args))
        except (BrokenProcessPool, WorkerLost):
            if self._pool is pool:          # the next upload gets a fresh worker
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            raise unavailable() from None

    def post(self, fn, *args) -> None:
        """Fire and forget (dropping an aborted upload's checker); nothing if no worker runs."""
        if self._pool is not None:
            try:
                self._pool.submit(fn, *args).add_done_callback(lambda f: f.cancelled() or f.exception())
            except RuntimeError:            # broken or shut down: its checkers went with it
                pass

    def pids(self) -> list[int]:
        return [] if self._pool is None else list(getattr(self._pool, "_processes", None) or {})

    async def close(self, _app: web.Application | None = None) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class RemoteChecker:
    """One upload's LineChecker, in the worker: `feed` pieces in order, then `finish`, or `discard`."""

    def __init__(self, worker: LineWorker, max_line_bytes: int | None) -> None:
        self.worker, self.max_line_bytes = worker, max_line_bytes
        self.token = uuid.uuid4().hex
        self._fed = False

    async def feed(self, data: bytes) -> list[BatchLine]:
        first, self._fed = not self._fed, True
        return _lines(await self.worker.call(_feed, self.token, first, self.max_line_bytes, data))

    async def finish(self) -> list[BatchLine]:
        return _lines(await self.worker.call(_finish, self.token, not self._fed, self.max_line_bytes))

    def discard(self) -> None:
        if self._fed:
            self.worker.post(_discard, self.token)


def _lines(firsts: list[tuple[str, int]]) -> list[BatchLine]:
    # check_models reads a line's model and number only
    return [BatchLine(idx=idx, custom_id="", url="", body=b"", model=model) for model, idx in firsts]


# -- in the worker process ---------------------------------------------------------------------------

_checkers: dict[str, tuple[LineChecker, set[str]]] = {}


def _init_worker(parent: int) -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 19)
        except OSError:
            pass
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def _checker(token: str, first: bool, max_line_bytes: int | None) -> tuple[LineChecker, set[str]]:
    if first:
        return _checkers.setdefault(token, (LineChecker(max_line_bytes), set()))
    try:
        return _checkers[token]
    except KeyError:
        raise WorkerLost(token) from None


def _new_models(lines: list[BatchLine], seen: set[str]) -> list[tuple[str, int]]:
    out = []
    for line in lines:
        if line.model not in seen:
            seen.add(line.model)
            out.append((line.model, line.idx))
    return out


def _feed(token: str, first: bool, max_line_bytes: int | None, data: bytes) -> list[tuple[str, int]]:
    checker, seen = _checker(token, first, max_line_bytes)
    try:
        return _new_models(checker.feed(data), seen)
    except BaseException:
        _checkers.pop(token, None)
        raise


def _finish(token: str, first: bool, max_line_bytes: int | None) -> list[tuple[str, int]]:
    checker, seen = _checker(token, first, max_line_bytes)
    _checkers.pop(token, None)
    return _new_models(checker.finish(), seen)


def _discard(token: str) -> None:
    _checkers.pop(token, None)


LINE_WORKER = web.AppKey("inferd_line_worker", LineWorker)
