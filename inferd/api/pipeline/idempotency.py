"""`Idempotency-Key` on POST /v1/completions and /v1/chat/completions (IETF httpapi idempotency-key draft).

Scoped per tenant and checked once the body is read, before anything runs: the first request with a
key claims it in the store (inferd.store.IdempotencyStore) and runs; its response, if it succeeded,
is stored for `store.idempotency_ttl_s` (a stream as the exact SSE bytes sent). A later request with
the same key then gets:
- the stored response, with `Idempotent-Replayed: true` (a stream replays as a stream of the same
  content; nothing runs and no quota is charged);
- 409 `idempotency_key_in_flight` while the first is still running (Retry-After: 1 until the first's
  deadline, by which a live first attempt has ended; then the seconds until its claim lapses, since
  only a holder that died still holds it then);
- 422 `idempotency_key_reused` when its body differs from the first's.
Only a 200 is stored: a refused, failed or abandoned first attempt releases the key, so the retry that
the draft expects clients to make runs the request; so does a claim that failed (503 store_unavailable)
but may still commit, once its outcome is known. A claim's owner names this process
(inferd.store.process_owner) beside the request id: a daemon restarted after a crash releases its
predecessor's claims before it serves (inferd.daemon.reclaim), so a retry then runs at once.
"""
from __future__ import annotations

import asyncio
import contextvars
import hashlib
import math
import re
import time

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.errors import INVALID_REQUEST, ApiError, invalid
from inferd.api.wire.responses import DONE_FRAME
from inferd.api.wire.responses_output import ended_normally
from inferd.observability import get_logger
from inferd.store import StoredResponse, StoreError, process_owner

log = get_logger("inferd.idempotency")
HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_STORED_BYTES = 8 << 20          # a response larger than this is served but not kept for replay
HOLD_MARGIN_S = 60.0                # a crashed first attempt's claim can be taken over this long after its deadline
_KEY = re.compile(r"[\x21-\x7e]{1,255}")
_KEPT_HEADERS = ("Content-Type", "X-Inferd-Model-Version", "X-Inferd-Simulated", "X-Inferd-Node", "Server-Timing")


class Capture:
    """The claimed key of a running request, and the bytes of its stream as they are sent."""

    __slots__ = ("key", "tenant", "owner", "chunks", "size", "overflow")

    def __init__(self, key: str, tenant: str, owner: str) -> None:
        self.key, self.tenant, self.owner = key, tenant, owner
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflow = False

    def add(self, frame: bytes) -> None:
        if self.overflow:
            return
        self.size += len(frame)
        if self.size > MAX_STORED_BYTES:
            self.overflow, self.chunks = True, []
            return
        self.chunks.append(frame)


CAPTURE: web.RequestKey[Capture] = web.RequestKey("inferd_idempotency", Capture)


async def claim(request: web.BaseRequest, state, tenant: str, body: bytes, deadline: float) -> web.Response | None:
    """None: run the request (its key, if any, is now held: `settle` when it ends). Else the stored
    response to replay. Raises ApiError 400 (malformed key), 409 (in flight) or 422 (another body)."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not _KEY.fullmatch(key):
        raise invalid(f"{HEADER}: expected 1 to 255 visible ASCII characters.", param=HEADER,
                      code="invalid_idempotency_key")
    store = state.idempotency
    if store is None:
        raise invalid(f"{HEADER}: this server keeps no durable store, so it cannot honour idempotency keys.",
                      param=HEADER, code="idempotency_unavailable")
    owner = process_owner(state.node_name, request[keys.REQUEST_ID])
    now = time.time()
    try:
        got = await store.claim(tenant, key, hashlib.sha256(body).digest(), owner, now=now,
                                hold_s=max(0.0, deadline - time.monotonic()) + HOLD_MARGIN_S,
                                ttl_s=state.config.store.idempotency_ttl_s)
    except StoreError as exc:       # 503 to the client; the claim must not outlive it
        _release_after(store, tenant, key, owner, exc)
        raise
    if got.outcome == "done":
        return replay(got.response)
    if got.outcome == "in_flight":
        raise ApiError(409, f"A request with this {HEADER} is still running; retry once it has finished.",
                       type=INVALID_REQUEST, param=HEADER, code="idempotency_key_in_flight",
                       headers={"Retry-After": str(_retry_after(got.held_until, now))})
    if got.outcome == "mismatch":
        raise ApiError(422, f"This {HEADER} was used with a different request body.", type=INVALID_REQUEST,
                       param=HEADER, code="idempotency_key_reused")
    request[CAPTURE] = Capture(key, tenant, owner)
    return None


_RELEASING: set[asyncio.Task] = set()      # at most one per request whose claim failed


def _release_after(store, tenant: str, key: str, owner: str, failed: StoreError) -> None:
    """Release the claim a failed `claim` may still leave: its write timed out with its COMMIT under way
    (`pending`), or the store answered too late. The release runs after the claim (SQLite's one writer
    takes writes in order; a pending PostgreSQL claim is awaited first), deletes only this request's
    claim (its owner), and runs in an empty context: the request's deadline is not its bound."""
    async def release() -> None:
        pending = getattr(failed, "pending", None)
        if pending is not None:
            await asyncio.wait([pending])
        try:
            await store.release(tenant, key, owner)
        except StoreError as exc:       # the claim lapses at its hold time instead (409 until then)
            log.error("idempotency_release_failed", key=key, tenant=tenant, error=str(exc))

    task = asyncio.get_running_loop().create_task(release(), context=contextvars.Context())
    _RELEASING.add(task)
    task.add_done_callback(_RELEASING.discard)


def _retry_after(held_until: float | None, now: float) -> int:
    """1 s while the holder may still be running (it may end any moment); past its deadline (the last
    HOLD_MARGIN_S of the hold) only a dead holder keeps the key: the seconds until its claim lapses."""
    left = (held_until or now) - now
    return 1 if left > HOLD_MARGIN_S else max(1, math.ceil(left))


def replay(stored: StoredResponse) -> web.Response:
    headers = {**stored.headers, REPLAYED: "true"}
    return web.Response(status=stored.status, body=stored.body, headers=headers)


async def settle(request: web.BaseRequest, state, response: web.StreamResponse | None) -> None:
    """The request that holds a key ended with `response` (None: it raised): keep a 200 for replays,
    release the key otherwise."""
    capture = request.get(CAPTURE)
    if capture is None:
        return
    store = state.idempotency
    body = None
    if response is not None and response.status == 200 and not capture.overflow:
        body = response.body if isinstance(response, web.Response) else b"".join(capture.chunks)
        if isinstance(body, bytes) and len(body) > MAX_STORED_BYTES:
            body = None         # served, not kept (a large embeddings response, say)
        elif not isinstance(response, web.Response) and not (body.endswith(DONE_FRAME) or ended_normally(body)):
            body = None         # a stream that ended in an error frame (a bug, its ledger row not recorded)
    try:
        if not isinstance(body, bytes):
            await store.release(capture.tenant, capture.key, capture.owner)
            return
        headers = {k: response.headers[k] for k in _KEPT_HEADERS if k in response.headers}
        stored = StoredResponse(status=200, headers=headers, body=body,
                                stream=not isinstance(response, web.Response))
        await store.finish(capture.tenant, capture.key, capture.owner, stored, now=time.time(),
                           ttl_s=state.config.store.idempotency_ttl_s)
    except StoreError as exc:
        # The response stands (it was served and billed); the key cannot keep it. A release that failed
        # is tried again once it has settled; a stored response that failed leaves the claim to lapse at
        # its hold time (409 until then: a served response is not run twice), then a retry runs again.
        log.error("idempotency_store_failed", key=capture.key, tenant=capture.tenant, error=str(exc))
        if not isinstance(body, bytes):
            _release_after(store, capture.tenant, capture.key, capture.owner, exc)
