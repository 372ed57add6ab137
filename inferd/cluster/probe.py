"""SWIM probing for inferd.cluster.gossip (ping the next member, go indirect on silence, relay for others),
and the node's small datagram helpers (the socket's protocol, addresses, cutting what is sent into parts that fit).

`Prober.loop` probes one member per probe interval: a Ping; no Ack within `probe_timeout_s` sends a
PingReq to `indirect_probes` helpers and a second direct Ping (memberlist's fallback probe, here over
UDP too); no Ack by the end of the interval marks the member failed (Membership.probe_failed). A
PingReq from a peer makes us ping its target with a fresh probe id and relay the Ack, or a Nack once
`probe_timeout_s` passed without one. Acks resolve waiters by probe id and must name the expected node.
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, Protocol, TypeVar

from inferd.cluster.membership import Member, Membership
from inferd.cluster.messages import Ack, Body, Load, Nack, Ping, PingReq, TenantDemand, VersionLoad
from inferd.config import ClusterConfig, parse_address
from inferd.observability import get_logger

log = get_logger("inferd.cluster")

RTT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
T = TypeVar("T")
MAX_RELAYS = 64                # indirect probes run for others at once; more PingReqs are dropped


@lru_cache(maxsize=4096)
def address(text: str) -> tuple[str, int] | None:
    """("host", port) of a member's "host:port" (cached: every send needs one), None if malformed."""
    return parse_address(text)


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Endpoint(asyncio.DatagramProtocol):
    """The gossip socket's protocol: datagrams go to `receive`; `closed` resolves once the socket is."""

    def __init__(self, receive: Callable[[bytes, Any], None]) -> None:
        self.receive = receive
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.receive(data, addr)

    def error_received(self, exc: Exception) -> None:      # e.g. ICMP port unreachable from a dead peer
        log.debug("gossip_socket_error", error=str(exc))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def cancel_all(tasks: Sequence[asyncio.Task]) -> None:
    """Cancel `tasks` and wait until every one has ended. asyncio.wait_for (3.10/3.11) can swallow a
    cancel that races its inner future, leaving a probe or join loop running: whatever is still
    running after a short wait is cancelled again."""
    pending = [t for t in tasks if not t.done()]
    while pending:
        for task in pending:
            task.cancel()
        _, still = await asyncio.wait(pending, timeout=0.1)
        pending = list(still)
    for task in tasks:
        if not task.cancelled():
            task.exception()        # retrieved: a loop that had failed was logged when it did


def pack(items: Sequence[T], make: Callable[[Sequence[T]], Body], fits: Callable[[Body], bool]) -> list[Sequence[T]]:
    """`items` cut into consecutive runs, each as long as still fits one datagram as `make(run)` (at least
    one item a run; one empty run for no items)."""
    runs: list[Sequence[T]] = []
    i = 0
    while i < len(items):
        lo, hi = 1, len(items) - i             # the longest run that fits: all of it, else a binary search
        if fits(make(items[i:])):
            lo = hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(make(items[i:i + mid])):
                lo = mid
            else:
                hi = mid - 1
        runs.append(items[i:i + lo])
        i += lo
    return runs or [items[:0]]


def load_parts(versions: Sequence[VersionLoad], demand: Sequence[TenantDemand],
               fits: Callable[[Body], bool]) -> list[Load]:
    """A load report (age 0: it is sent right away) as the fewest Load parts that each fit a datagram."""
    items: list[VersionLoad | TenantDemand] = [*versions, *demand]

    def make(run: Sequence[VersionLoad | TenantDemand], part: int, parts: int) -> Load:
        return Load(0.0, tuple(x for x in run if isinstance(x, VersionLoad)),
                    tuple(x for x in run if isinstance(x, TenantDemand)), part, parts)

    # parts <= len(items): runs are sized with that (the widest part numbers), then sent with the real ones
    runs = pack(items, lambda run: make(run, len(items), len(items)), fits)
    return [make(run, i, len(runs)) for i, run in enumerate(runs)]


class ProbeStats(Protocol):
    """The counters of inferd.cluster.gossip.GossipStats that probing keeps."""

    probes: int
    indirect_probes: int
    probe_failures: int
    probe_rtt_count: int
    probe_rtt_sum_s: float
    probe_rtt_buckets: dict[float, int]


Send = Callable[[Body, "str | tuple[str, int]", str], None]     # (body, address, receiving node id)


class Prober:
    """The probes in flight of one gossip node; `send` seals and sends a body (with piggybacked updates)."""

    def __init__(self, membership: Membership, send: Send, stats: ProbeStats, *, config: Callable[[], ClusterConfig],
                 leaving: Callable[[], bool], clock: Callable[[], float], rng: random.Random) -> None:
        self._membership = membership
        self._send = send
        self._stats = stats
        self._config = config
        self._leaving = leaving
        self._clock = clock
        self._waiting: dict[int, tuple[str, asyncio.Future[str]]] = {}   # probe id -> (target, future of who acked)
        self._relays: set[asyncio.Task[None]] = set()
        self._next_id = rng.randrange(1 << 31)
        self.nacks = 0                  # Nacks for our probes: the helper was alive, the target silent

    async def loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            deadline = loop.time() + self._config().probe_interval_s
            member = None if self._leaving() else self._membership.next_probe()
            if member is not None:
                try:
                    await self._probe(member, deadline)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("gossip_probe_failed", node=member.node)
            await asyncio.sleep(max(0.0, deadline - loop.time()))

    async def _probe(self, member: Member, deadline: float) -> None:
        config, stats, loop = self._config(), self._stats, asyncio.get_running_loop()
        probe, acked = self._expect(member.node)
        try:
            stats.probes += 1
            sent_at = self._clock()
            self._send(Ping(probe, member.node), member.addr, member.node)
            try:
                if await asyncio.wait_for(asyncio.shield(acked), config.probe_timeout_s) == member.node:
                    self._observe_rtt(self._clock() - sent_at)
                return
            except asyncio.TimeoutError:
                pass
            helpers = self._membership.helpers(member.node, config.indirect_probes)
            if helpers:
                stats.indirect_probes += 1
            for helper in helpers:
                self._send(PingReq(probe, member.node, member.addr), helper.addr, helper.node)
            self._send(Ping(probe, member.node), member.addr, member.node)
            try:
                await asyncio.wait_for(acked, max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                stats.probe_failures += 1
                self._membership.probe_failed(member.node)
                log.debug("gossip_probe_unanswered", node=member.node, helpers=len(helpers))
        finally:
            self._waiting.pop(probe, None)

    def _expect(self, target: str) -> tuple[int, asyncio.Future[str]]:
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[self._next_id] = (target, future)
        return self._next_id, future

    def _observe_rtt(self, rtt: float) -> None:
        stats = self._stats
        stats.probe_rtt_count += 1
        stats.probe_rtt_sum_s += rtt
        for bound in RTT_BUCKETS:
            if rtt <= bound:
                stats.probe_rtt_buckets[bound] = stats.probe_rtt_buckets.get(bound, 0) + 1

    def acked(self, ack: Ack, sender: str) -> None:
        """An Ack arrived (from the target itself, or relayed by a helper)."""
        waiter = self._waiting.get(ack.probe)
        if waiter is not None and waiter[0] == ack.node and not waiter[1].done():
            waiter[1].set_result(sender)

    def nacked(self, nack: Nack) -> None:
        """A helper reached no answer from the target: only counted (the asker waits out the interval)."""
        if nack.probe in self._waiting:
            self.nacks += 1

    def relay(self, req: PingReq, asker: tuple[str, int], asker_node: str) -> None:
        """Probe `req.target` for `asker` (its address and node id; in the background; bounded)."""
        if len(self._relays) >= MAX_RELAYS or self._leaving():
            return
        task = asyncio.get_running_loop().create_task(self._relay(req, asker, asker_node))
        self._relays.add(task)
        task.add_done_callback(self._relays.discard)

    async def _relay(self, req: PingReq, asker: tuple[str, int], asker_node: str) -> None:
        probe, acked = self._expect(req.target)
        try:
            self._send(Ping(probe, req.target), req.target_addr, req.target)
            try:
                await asyncio.wait_for(acked, self._config().probe_timeout_s)
            except asyncio.TimeoutError:
                self._send(Nack(req.probe, req.target), asker, asker_node)
            else:
                self._send(Ack(req.probe, req.target), asker, asker_node)
        finally:
            self._waiting.pop(probe, None)

    async def close(self) -> None:
        await cancel_all(list(self._relays))
        for _, future in self._waiting.values():
            future.cancel()
        self._waiting.clear()
