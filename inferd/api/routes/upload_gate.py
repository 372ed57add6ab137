"""The per-tenant bounds on uploads (`[tenants.<name>]`): how many run at once on this node
(`max_concurrent_uploads`, 429 + Retry-After) and how many bytes of files the tenant may hold
(`max_stored_file_bytes`: the files it has, uploads and batch outputs, plus what its uploads on this node
have received so far; 413 the moment an upload would pass it). A tenant's stored bytes come from the
store (SUM over its files), so every node of a cluster counts the same files; only uploads in flight are
counted per node.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from aiohttp import web

from inferd.api.errors import ApiError

RATE_LIMIT = "rate_limit_error"
RETRY_AFTER_S = 5               # an upload takes seconds: sooner would be refused again


class UploadGate:
    """Loop thread only: uploads in progress on this node, and their bytes received, per tenant."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.receiving: dict[str, int] = {}         # bytes received by the tenant's running uploads
        # One chunk at a time, node-wide, is checked (a thread) and written (the store's writer): however
        # many uploads run, they take one thread's share of the CPU and one write's share of the writer.
        self.lane = asyncio.Lock()
        self._next_at = 0.0                         # loop time the lane's next chunk may start

    async def paced(self, nbytes: int, rate: int) -> None:
        """Hold the lane (the caller holds it) until `nbytes` more fit the node's upload rate: uploads
        together take a bounded share of the loop and the writer, and the uploaders wait on TCP."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        start = max(now, self._next_at)
        self._next_at = start + nbytes / rate
        if start > now:
            await asyncio.sleep(start - now)

    @contextlib.contextmanager
    def slot(self, tenant: str, cap: int) -> Iterator[UploadBytes]:
        """Hold one of the tenant's `cap` upload slots for the block; 429 when all are taken."""
        running = self.running.get(tenant, 0)
        if running >= cap:
            raise ApiError(429, f"Tenant {tenant!r} already has {running} uploads in progress, its limit "
                           f"(tenants.{tenant}.max_concurrent_uploads = {cap}); retry when one has ended.",
                           type=RATE_LIMIT, param="file", code="too_many_concurrent_uploads",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        self.running[tenant] = running + 1
        counted = UploadBytes(self, tenant)
        try:
            yield counted
        finally:
            self._less(self.running, tenant, 1)
            self._less(self.receiving, tenant, counted.size)

    @staticmethod
    def _less(table: dict[str, int], tenant: str, n: int) -> None:
        left = table.get(tenant, 0) - n
        if left > 0:
            table[tenant] = left
        else:
            table.pop(tenant, None)


class UploadBytes:
    """One upload's bytes, counted against the tenant's `max_stored_file_bytes` as they arrive."""

    def __init__(self, gate: UploadGate, tenant: str) -> None:
        self._gate = gate
        self.tenant = tenant
        self.size = 0
        self.stored = 0             # the tenant's files, as the store said when the upload began
        self.cap: int | None = None

    def check(self, more: int) -> None:
        """413 file_quota_exceeded when `more` bytes (this upload's, or the declared rest) would take the
        tenant past its cap."""
        if self.cap is None:
            return
        held = self.stored + self._gate.receiving.get(self.tenant, 0)
        if held + more > self.cap:
            raise quota_exceeded(self.tenant, self.cap, self.stored)

    def add(self, n: int) -> None:
        self.check(n)
        self.size += n
        self._gate.receiving[self.tenant] = self._gate.receiving.get(self.tenant, 0) + n


def quota_exceeded(tenant: str, cap: int, stored: int) -> ApiError:
    # 413, not 429: waiting does not help, deleting files (or a smaller file) does.
    return ApiError(413, f"This upload would take tenant {tenant!r} past its file storage limit of {cap} bytes "
                    f"(tenants.{tenant}.max_stored_file_bytes); it holds {stored} bytes of files now. "
                    "Delete files (DELETE /v1/files/{file_id}) to make room.",
                    param="file", code="file_quota_exceeded")


UPLOADS = web.AppKey("inferd_uploads", UploadGate)
