"""Spillover: a request this node would refuse or keep waiting goes to a peer with room (one hop).

Decided after routing, tokenization and the tenant's limits, just before admission: when the local
admission queue would refuse the request, or its estimated wait exceeds half of what is left of the
request's TTFT budget (the tightest `ttft` SLO threshold on its model, else `cluster.spill_wait_s`), and a live
peer's fresh load hint, less the slots this node's forwards took there since it was measured, says the
same model version is ready with a free slot and a wait within that budget
(inferd.cluster.Cluster.peer_with_room), the tenant's quota is charged here (once: the peer does not
charge it again) and the exact body is sent to that peer with the caller's identity signed by this
node (X-Inferd-Forwarded; never the client's key) and the version routing chose (X-Inferd-Version).
A forwarded request is never forwarded again. If the peer fails before answering with a status (no
connection, timeout, it refuses for lack of room or no longer serves that version), another peer is
tried, then the request runs here after all; once the peer has answered, its response is passed
through as it comes and fails as any stream would. Every response of a clustered node names the node
that served it (X-Inferd-Node). Usage comes back in the JSON body, or, for a stream, in an SSE comment
the peer adds for us (`: inferd-usage <prompt> <completion>`), which is taken out before the client
sees it.
"""
from __future__ import annotations

import asyncio
import hashlib
import time

import aiohttp
import orjson
from aiohttp import web

from inferd.admission import Lease
from inferd.api import appkeys as keys
from inferd.api.auth import PRINCIPAL
from inferd.api.pipeline.context import RequestContext
from inferd.api.pipeline.spill_decision import PEER_WAIT_LIMIT
from inferd.api.errors import INVALID_REQUEST, ApiError
from inferd.api.wire.responses import USAGE_COMMENT
from inferd.cluster import FORWARDED_HEADER, TOKEN_TTL_S, Cluster, ForwardedIdentity, Member, Rejected
from inferd.observability import TRACE_HEADERS
from inferd.types import Usage

NODE_HEADER = "X-Inferd-Node"
VERSION_HEADER = "X-Inferd-Version"
# Peers tried before the request runs here. Each one tried had room by its hint less our reservations,
# so a refusal is rare; more than 3 would only add delay to the request's first token.
MAX_PEERS_TRIED = 3
_PASSED_HEADERS = ("Content-Type", "Cache-Control", "X-Accel-Buffering", "X-Inferd-Model-Version",
                   "X-Inferd-Simulated", "Server-Timing")
# The peer's own queue refused it (its quota is never charged), it no longer serves that version
# (retired since its last load hint), or it does not hold our key yet (a rotation reaching it later:
# its 401 is about our signature, never the client's key, which is not sent): try elsewhere.
TRY_ELSEWHERE = {401, 404, 429, 503}
NO_ANSWER = 0                   # _PeerFailed.status of a peer that did not answer (no connection, timeout)
# No room there until its next hint: its queue refused, or it hangs (else the next spill waits on it again)
NO_ROOM = {429, 503, NO_ANSWER}


class _PeerFailed(Exception):
    """The peer gave no usable answer before its first byte (`status`: the one it refused with)."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.status = status


def forwarded_identity(request: web.BaseRequest, cluster: Cluster | None) -> ForwardedIdentity:
    """The identity a peer signed for a request it forwarded (before its body is read), or 401."""
    if cluster is None:
        raise _bad_identity("Forwarded requests are accepted only by a node in a cluster.")
    try:
        return cluster.verify(request.headers.get(FORWARDED_HEADER, ""))
    except Rejected as exc:
        raise _bad_identity(f"Invalid {FORWARDED_HEADER} identity ({exc.reason}).") from None


def check_forwarded_body(cluster: Cluster, ident: ForwardedIdentity, body: bytes) -> None:
    """401 unless `body` is the one the identity was signed for."""
    try:
        cluster.check_body(ident, body)
    except Rejected as exc:
        raise _bad_identity(f"Invalid {FORWARDED_HEADER} identity ({exc.reason}).") from None


def _bad_identity(message: str) -> ApiError:
    return ApiError(401, message, type=INVALID_REQUEST, code="invalid_forwarded_identity")


async def spill(ctx: RequestContext, lease: Lease, headers: dict[str, str]) -> web.StreamResponse | None:
    """Serve `ctx` on a peer with room; its response, or None when no peer took it (run it here). The
    lease (charged here) is released with the usage the peer reports."""
    out = Outgoing(ctx.request, ctx.tenant, ctx.request_id, ctx.deadline, ctx.model, ctx.engine.info.version,
                   ctx.body, within_s=ctx.extras.get(PEER_WAIT_LIMIT))
    return await forward(out, ctx.state.cluster, lease, headers, "forwarded")


class Outgoing:
    """What forwarding needs of a request: a routed one's RequestContext, or a cold model's
    before it has one. `version` None: the peer routes it as its own. `within_s`: the longest estimated
    wait a peer may have (None: spill_wait_s)."""

    __slots__ = ("request", "tenant", "request_id", "deadline", "model", "version", "body", "within_s")

    def __init__(self, request: web.Request, tenant: str, request_id: str, deadline: float, model: str,
                 version: str | None, body: bytes, within_s: float | None = None) -> None:
        self.request, self.tenant, self.request_id, self.deadline = request, tenant, request_id, deadline
        self.model, self.version, self.body, self.within_s = model, version, body, within_s


async def forward(out: Outgoing, cluster: Cluster, lease: Lease, headers: dict[str, str],
                  outcome: str) -> web.StreamResponse | None:
    """Send `out` to the best peer with room for its model (and version), trying another if one fails
    before answering; the peer's response, counted as `outcome`, or None when none took it. Each try
    holds a reservation on the peer's slot until the request ends there (or the peer refused it), so
    the forwards that follow count it before the peer's next hint does."""
    tried: set[str] = set()
    while len(tried) < MAX_PEERS_TRIED:
        peer = cluster.peer_with_room(out.model, out.version, frozenset(tried), within_s=out.within_s)
        if peer is None:
            break
        tried.add(peer.node)
        held = cluster.reservations.reserve(peer.node, out.model, out.version)
        try:
            upstream = await _send(out, cluster, peer)
        except _PeerFailed as exc:
            held.release()
            # Its hint was out of date, or it hangs: no room there until a newer hint (else the next
            # spill picks the same peer and waits forward_timeout_s again).
            if exc.status in NO_ROOM:
                cluster.reservations.refused(peer.node, out.model, out.version)
            _count(cluster, "peer_failed")
            out.request[keys.LOG_FIELDS]["spill_failed"] = f"{peer.node}: {exc}"
            continue
        except BaseException:
            held.release()
            raise
        held.answered()
        _count(cluster, outcome)
        out.request[keys.LOG_FIELDS]["served_by"] = peer.node
        try:
            return await _relay(out, upstream, peer.node, lease, headers)
        finally:
            held.release()
    _count(cluster, "no_peer" if not tried else "ran_locally")
    return None


def _count(cluster: Cluster, outcome: str) -> None:
    cluster.spillovers[outcome] = cluster.spillovers.get(outcome, 0) + 1


async def _send(out: Outgoing, cluster: Cluster, peer: Member) -> aiohttp.ClientResponse:
    request = out.request
    principal = request.get(PRINCIPAL)
    remaining = out.deadline - time.monotonic()
    if remaining <= 0:
        raise _PeerFailed("deadline passed")
    ident = ForwardedIdentity(tenant=out.tenant, key_id=principal.key_id if principal is not None else None,
                              origin=cluster.node_id, destination=peer.node, request_id=out.request_id,
                              body_sha256=hashlib.sha256(out.body).digest(), expires=time.time() + TOKEN_TTL_S)
    headers = {"Content-Type": "application/json", FORWARDED_HEADER: cluster.sign(ident),
               "X-Request-Id": out.request_id, "X-Request-Timeout": f"{remaining:.3f}"}
    if out.version is not None:     # None: the peer routes it as its own (a cold model's default)
        headers[VERSION_HEADER] = f"{out.model}@{out.version}"
    trace = request.get(keys.TRACE)        # the peer's spans join this request's trace
    headers.update(trace.headers() if trace is not None else
                   {k: request.headers[k] for k in TRACE_HEADERS if k in request.headers})
    timeout = aiohttp.ClientTimeout(total=None, sock_read=remaining, sock_connect=cluster.config.forward_timeout_s)
    try:
        upstream = await asyncio.wait_for(
            cluster.http.post(peer.http.rstrip("/") + request.path, data=out.body, headers=headers, timeout=timeout),
            min(remaining, cluster.config.forward_timeout_s))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise _PeerFailed(type(exc).__name__, NO_ANSWER) from None
    if upstream.status in TRY_ELSEWHERE:
        upstream.release()
        raise _PeerFailed(f"answered {upstream.status}", upstream.status)
    return upstream


async def _relay(sent: Outgoing, upstream: aiohttp.ClientResponse, node: str, lease: Lease,
                 headers: dict[str, str]) -> web.StreamResponse:
    """Pass the peer's response through; release the lease with the usage it reports."""
    usage = None
    done = False
    try:
        out = {k: upstream.headers[k] for k in _PASSED_HEADERS if k in upstream.headers}
        out.update(headers)                  # X-RateLimit-* charged here, X-Request-Id
        out[NODE_HEADER] = node
        sent.request[keys.LOG_FIELDS]["outcome_status"] = upstream.status
        if upstream.content_type != "text/event-stream":
            data = await upstream.read()        # one JSON body, from a peer that holds the cluster key
            done = True
            usage = _json_usage(data)
            if usage is None and upstream.status >= 400:
                usage = Usage(prompt_tokens=0, completion_tokens=0)    # refused there: nothing ran
            return web.Response(status=upstream.status, body=data, headers=out)
        resp = web.StreamResponse(status=upstream.status, headers=out)
        await resp.prepare(sent.request)
        lines = _UsageFilter()
        async for chunk in upstream.content.iter_any():
            data = lines.feed(chunk)
            if data:
                await resp.write(data)
        await resp.write(lines.rest())
        done = True
        usage = lines.usage
        await resp.write_eof()
        return resp
    finally:
        if done:
            upstream.release()
        else:           # the client left or the peer failed mid-way: drop the connection, the peer aborts
            upstream.close()
        lease.release(usage if usage is not None else _all_charged(lease))


def _all_charged(lease: Lease) -> Usage:
    """No usage came back (the peer failed mid-way): keep everything charged, never refund on a guess."""
    return Usage(prompt_tokens=lease.prompt_tokens, completion_tokens=lease.max_tokens)


def _json_usage(data: bytes) -> Usage | None:
    try:
        u = orjson.loads(data).get("usage") or {}
        return Usage(prompt_tokens=int(u["prompt_tokens"]), completion_tokens=int(u["completion_tokens"]))
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        return None


class _UsageFilter:
    """Passes SSE bytes through whole lines at a time, taking out our `: inferd-usage` comment."""

    def __init__(self) -> None:
        self._tail = b""
        self.usage: Usage | None = None

    def feed(self, chunk: bytes) -> bytes:
        data = self._tail + chunk
        cut = data.rfind(b"\n") + 1
        self._tail = data[cut:]
        return self._strip(data[:cut])

    def rest(self) -> bytes:
        data, self._tail = self._tail, b""
        return self._strip(data)

    def _strip(self, data: bytes) -> bytes:
        start = data.find(USAGE_COMMENT)
        if start < 0:
            return data
        end = data.find(b"\n\n", start)
        end = len(data) if end < 0 else end + 2
        fields = data[start + len(USAGE_COMMENT):end].split()
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            self.usage = Usage(prompt_tokens=int(fields[0]), completion_tokens=int(fields[1]))
        return data[:start] + data[end:]
