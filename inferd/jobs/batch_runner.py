"""The Batch API's runner: a background task that takes batches from the store and runs their lines.

It leases one batch at a time (inferd.store.batches: safe across processes and nodes sharing a store),
renews the lease while it works, and POSTs each line not yet recorded to this daemon's own listener,
`concurrency` at a time, with `X-Inferd-Batch: <secret> <tenant> <batch id>` (inferd.api.pipeline.internal): the
line is the batch's tenant's request, admitted in the `batch` priority class and recorded in the ledger,
exactly as a live one. A 429 or 503 (quota, queue full, draining) is waited out (its Retry-After) and
sent again, as is a connection error; any other answer is the line's result, recorded at once. So a
runner killed mid-batch loses only its lines in flight: whoever takes the batch over (after the lease
expires, or at once when the daemon restarts on the same node) runs just the lines not recorded, and the
output holds each line exactly once.

validating (the input is read and checked) -> in_progress (lines run) -> finalizing -> completed, with the
output and error files written ordered by line; `cancelling` (inferd.api.routes.batches) stops starting lines
and ends `cancelled` with the lines finished; past expires_at a batch ends `expired`, its lines not run
written as `batch_expired` errors. Lines already in flight when a batch is cancelled or expires finish.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import ssl
import time
from collections.abc import Awaitable, Callable

import aiohttp

from inferd.api import (BATCH_CALLER_HEADER, BatchLine, InputError, ServerState, batch_caller_header, expired_results,
                        http_result, output_files, stored_lines)
from inferd.observability import get_logger
from inferd.store import BatchError, BatchRecord, BatchResult, BatchStore, FileStore, StoreError, process_owner

log = get_logger("inferd.batch")

RETRY_S = 1.0                   # after a connection error (our own listener restarting)
MAX_RETRY_AFTER_S = 60.0
OnResult = Callable[[str, BatchResult], "Awaitable[None] | None"]


def listener_url(host: str, port: int, *, tls: bool = False) -> str:
    """The base URL of this daemon's own listener (a wildcard bind is reached on loopback)."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"{'https' if tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}"


class _Job:
    """The batch a runner is working on, and why it should stop starting lines, if it should."""

    def __init__(self, batch: BatchRecord) -> None:
        self.batch = batch
        self.reason: str | None = None      # "closing" | "lost" | "cancel" | "expired"
        self.stopped = asyncio.Event()

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.stopped.set()

    def resume(self) -> None:
        self.reason = None
        self.stopped.clear()

    async def wait(self, seconds: float) -> bool:
        """Wait `seconds` unless stopped first; True when stopped."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopped.wait(), seconds)
        return self.stopped.is_set()


class BatchRunner:
    """Loop thread only. `start()` once the listener at `base_url` serves; `close()` before it stops."""

    def __init__(self, state: ServerState, base_url: str, *, concurrency: int = 8, lease_s: float = 30.0,
                 poll_s: float = 1.0, owner: str | None = None, ssl_context: ssl.SSLContext | bool | None = None,
                 clock: Callable[[], float] = time.time, on_result: OnResult | None = None,
                 on_end: Callable[[str, str], None] | None = None) -> None:
        for name, value in (("concurrency", concurrency), ("lease_s", lease_s), ("poll_s", poll_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        self._state, self._base_url = state, base_url.rstrip("/")
        self.concurrency, self.lease_s, self.poll_s = int(concurrency), float(lease_s), float(poll_s)
        # The lease owner names this process (inferd.store.owner), so a restart on this node frees a
        # crashed runner's leases at once (inferd.daemon.reclaim).
        self.owner = owner or process_owner(state.node_name, f"runner-{id(self):x}")
        # Observers (metrics, tests): a line's result once recorded; a batch's end (id, status).
        self._ssl, self._clock, self._on_result, self._on_end = ssl_context, clock, on_result, on_end
        self._wake = asyncio.Event()
        self._closing = False
        self._job: _Job | None = None
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("BatchRunner.start() called twice")
        connector = aiohttp.TCPConnector(limit=self.concurrency, ssl=self._ssl if self._ssl is not None else True)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=10))
        self._task = asyncio.create_task(self._main(), name="inferd-batch-runner")
        self._state.batch_runners.add(self)

    async def close(self) -> None:
        """Stop: lines in flight are abandoned (they run again after a restart), the lease released.
        Idempotent."""
        self._closing = True
        self._state.batch_runners.discard(self)
        if self._job is not None:
            self._job.stop("closing")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()
            self._session = None

    def wake(self, cancelled: str | None = None) -> None:
        self._wake.set()
        job = self._job
        if cancelled is not None and job is not None and job.batch.id == cancelled:
            job.stop("cancel")

    # -- the loop --------------------------------------------------------------------------------

    async def _main(self) -> None:
        while not self._closing:
            self._wake.clear()      # before looking: a batch created meanwhile wakes the next wait
            db = self._state.store
            batch = None
            if db is not None:
                try:
                    batch = await BatchStore(db).acquire(self.owner, self._clock(), self.lease_s)
                except StoreError as exc:
                    log.warning("batch_store_error", error=str(exc))
            if batch is None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
                continue
            job = self._job = _Job(batch)
            keeper = asyncio.create_task(self._keep_lease(job, BatchStore(db)))
            try:
                await self._drive(job, BatchStore(db), FileStore(db))
            except StoreError as exc:   # the store failed under us: leave the batch to the next lease
                log.warning("batch_store_error", batch=batch.id, error=str(exc))
            except Exception:           # noqa: BLE001 - a bug: keep the traceback, keep the runner alive
                log.exception("batch_runner_error", batch=batch.id)
                with contextlib.suppress(asyncio.TimeoutError):     # not a hot loop over the same batch
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
            finally:
                self._job = None
                keeper.cancel()
                with contextlib.suppress(Exception):
                    await BatchStore(db).release(batch.id, self.owner)     # no-op once it ended

    async def _keep_lease(self, job: _Job, store: BatchStore) -> None:
        """Renew the lease until cancelled (the batch is done with); notice a cancel (made on any node),
        an expiry, a lost lease."""
        interval = min(self.poll_s, self.lease_s / 3)
        while True:
            await asyncio.sleep(interval)       # a periodic timer, cancelled with the job
            try:
                if not await store.renew(job.batch.id, self.owner, self._clock(), self.lease_s):
                    job.stop("lost")
                    return
                batch = await store.load(job.batch.id)
            except StoreError as exc:
                log.warning("batch_store_error", batch=job.batch.id, error=str(exc))
                continue
            if batch is not None and batch.status == "cancelling":
                job.stop("cancel")
            elif self._clock() >= job.batch.expires_at:
                job.stop("expired")

    async def _drive(self, job: _Job, store: BatchStore, files: FileStore) -> None:
        """Take the batch through its states until it ends or this runner must stop."""
        lines: list[BatchLine] | None = None
        while job.reason not in ("closing", "lost"):
            batch = await store.load(job.batch.id)
            if batch is None or batch.ended or batch.lease_owner != self.owner:
                return
            job.batch = batch
            now = self._clock()
            if batch.status in ("validating", "in_progress") and now >= batch.expires_at:
                if lines is None:
                    lines, _ = await self._input(batch, files)
                await self._finish(job, store, "expired", lines or [])
            elif batch.status in ("validating", "in_progress") and lines is None:
                lines, error = await self._input(batch, files)
                if error is not None and await store.fail(batch.id, self.owner, [error], now=now):
                    log.warning("batch_failed", batch=batch.id, tenant=batch.tenant, error=error.message)
                    if self._on_end is not None:
                        self._on_end(batch.id, "failed")
            elif batch.status == "validating":
                await store.advance(batch.id, self.owner, "validating", "in_progress", now=now)
            elif batch.status == "in_progress":
                await self._run_lines(job, store, lines)
                if job.reason is None:      # every line recorded
                    await store.advance(batch.id, self.owner, "in_progress", "finalizing", now=self._clock())
                elif job.reason in ("cancel", "expired"):
                    job.resume()            # the next turn reads the status (cancelling) or the time
            elif batch.status == "cancelling":
                await self._finish(job, store, "cancelled", [])
            elif batch.status == "finalizing":
                await self._finish(job, store, "completed", [])

    async def _input(self, batch: BatchRecord, files: FileStore) -> tuple[list[BatchLine] | None, BatchError | None]:
        """The input file's lines, or why there are none (the file is gone or unusable). Read and checked a
        chunk at a time, each off the loop: the file's bytes are never held whole, only its lines."""
        try:
            lines = await stored_lines(files, batch.tenant, batch.input_file_id)
        except InputError as exc:
            return None, BatchError(code="invalid_batch_input", message=exc.message, line=exc.line, param=exc.param)
        if lines is None:
            return None, BatchError(code="input_file_not_found", param="input_file_id",
                                    message=f"The input file {batch.input_file_id!r} was deleted before the batch ran.")
        return lines, None

    async def _run_lines(self, job: _Job, store: BatchStore, lines: list[BatchLine]) -> None:
        done = await store.recorded(job.batch.id)
        todo = [line for line in lines if line.idx not in done]
        pending = iter(todo)

        async def worker() -> None:
            for line in pending:        # shared: each line goes to exactly one worker
                if job.reason is not None:
                    return
                result = await self._send(job, line)
                if result is None:      # stopped while waiting to retry
                    return
                await store.record(job.batch.id, result)
                if self._on_result is not None:
                    maybe = self._on_result(job.batch.id, result)
                    if inspect.isawaitable(maybe):
                        await maybe

        workers = [asyncio.create_task(worker()) for _ in range(min(self.concurrency, len(todo)))]
        try:
            await asyncio.gather(*workers)
        finally:        # one failed (the store), or the runner is closing: the others stop too
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _send(self, job: _Job, line: BatchLine) -> BatchResult | None:
        batch = job.batch
        headers = {BATCH_CALLER_HEADER: batch_caller_header(self._state.batch_secret, batch.tenant, batch.id),
                   "Content-Type": "application/json"}
        while True:
            try:
                async with self._session.post(self._base_url + line.url, data=line.body, headers=headers) as resp:
                    raw = await resp.read()
                    if resp.status not in (429, 503):
                        return http_result(line, resp.status, resp.headers.get("X-Request-Id"), raw)
                    delay = _retry_after(resp.headers.get("Retry-After"))
            except (aiohttp.ClientError, OSError) as exc:
                log.debug("batch_line_retry", batch=batch.id, error=str(exc))
                delay = RETRY_S
            if await job.wait(delay):      # stopped meanwhile: the line stays unrecorded
                return None

    async def _finish(self, job: _Job, store: BatchStore, status: str, lines: list[BatchLine]) -> None:
        batch = job.batch
        results = await store.results(batch.id)
        now = self._clock()
        # Off the loop: tens of thousands of lines encoded, sorted and joined into files of megabytes.
        results, (statements, output, errors) = await asyncio.to_thread(
            _final_files, batch.id, batch.tenant, status, lines, results, now)
        if not await store.renew(batch.id, self.owner, now, self.lease_s):
            job.stop("lost")
            return
        ok = sum(r.ok for r in results)
        if await store.finish(batch.id, self.owner, status, files=statements, now=now,
                              output_file_id=output.id if output else None,
                              error_file_id=errors.id if errors else None, completed=ok, failed=len(results) - ok):
            log.info("batch_ended", batch=batch.id, tenant=batch.tenant, status=status, completed=ok,
                     failed=len(results) - ok)
            if self._on_end is not None:
                self._on_end(batch.id, status)


def _retry_after(value: str | None) -> float:
    try:
        seconds = float(value) if value is not None else RETRY_S
    except ValueError:
        seconds = RETRY_S
    return min(max(seconds, 0.05), MAX_RETRY_AFTER_S)


def _final_files(batch_id: str, tenant: str, status: str, lines: list[BatchLine], results: list[BatchResult],
                 now: float) -> tuple[list[BatchResult], tuple]:
    """The batch's results (an expired one's unrun lines as errors) and its output and error files."""
    if status == "expired":
        results = results + expired_results(lines, {r.idx for r in results})
    return results, output_files(batch_id, tenant, results, now=now)
