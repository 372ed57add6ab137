"""The push-pulls of inferd.cluster.gossip: joining seeds (IP or DNS name), anti-entropy, members heard
of from others, and partition healing.

Join (at start, and for seeds a reload adds): a push-pull (Sync, reply wanted) to every seed address,
each one that has not answered sent again every min(JOIN_RETRY_S, probe_interval_s) for at most
JOIN_PATIENCE_S, so a node starts with the union of every seed's table, not just the first one's.
Periodic (every `sync_interval_s`): with one random known member, dead included. New member: a
member this node hears of from a third node (new, or alive again after dead) gets one at once, sent
again until it answers (NEW_MEMBER_TRIES), at most once per member per sync_interval_s, so a cold
start converges in one round instead of waiting for the periodic one. Reconnect (as Serf does it,
every `reconnect_interval_s`): a push-pull with one random member held dead, and a Sync to every
seed address that is not a live member. Dead members are kept in the table for
`reconnect_timeout_s` (inferd.cluster.membership), so after a partition both sides still know whom
to try; the exchange makes each side see the other's claim that it is dead, which it refutes (a
higher incarnation), and each takes the other's refutation.

Seed names are resolved off the loop (loop.getaddrinfo) at every join and re-join; a name that does
not resolve is logged and tried again next time, never fatal.
"""
from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Callable, Sequence

from inferd.cluster.membership import Membership
from inferd.cluster.messages import State
from inferd.cluster.probe import address, cancel_all, host_port, log
from inferd.config import ClusterConfig, parse_seed

JOIN_RETRY_S = 1.0             # a seed that has not answered gets the Sync again this often (at most)
JOIN_PATIENCE_S = 10.0         # ... for this long; then the reconnect loop re-joins it every reconnect_interval_s
RESOLVE_TIMEOUT_S = 5.0        # one seed name's resolution (getaddrinfo runs in a thread)
MAX_SEED_ADDRESSES = 8         # addresses of one seed name tried (a name may list many)
NEW_MEMBER_TRIES = 3           # a new member's push-pull is sent again (each probe interval) until it answers
NEW_MEMBER_BURST = 16          # new-member push-pulls per tick (half a probe interval) at most; the rest wait

Addr = tuple[str, int]
# (address, reason: "join", "periodic", "reconnect", "new_member", receiver node id or "") -> a Sync, reply wanted
SendSync = Callable[[Addr | str, str, str], None]


async def resolve_seeds(seeds: Sequence[str], family: int) -> tuple[set[Addr], int]:
    """The addresses of `seeds` ("host:port", host an IP or a DNS name), and how many seeds gave none;
    names resolve (all at once) to addresses of the gossip socket's `family` only. A seed that does not
    parse or resolve is logged and left out (the caller tries again later)."""
    found = await asyncio.gather(*(_resolve(seed, family) for seed in seeds))
    return {a for addrs in found for a in addrs}, sum(1 for addrs in found if not addrs)


async def _resolve(seed: str, family: int) -> list[Addr]:
    if (ip := address(seed)) is not None:                  # an IP address: nothing to resolve
        return [ip]
    parsed = parse_seed(seed)
    if parsed is None:
        log.warning("gossip_seed_malformed", seed=seed)
        return []
    host, port = parsed
    try:
        infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(
            host, port, family=family, type=socket.SOCK_DGRAM), RESOLVE_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError) as e:
        log.warning("gossip_seed_unresolved", seed=seed, error=str(e) or type(e).__name__)
        return []
    return sorted({(info[4][0], info[4][1]) for info in infos})[:MAX_SEED_ADDRESSES]


class Joiner:
    """One gossip node's joins, reconnects and other push-pulls. Loop thread only."""

    def __init__(self, membership: Membership, send_sync: SendSync, *, own: set[Addr], family: int,
                 config: Callable[[], ClusterConfig], clock: Callable[[], float], rng: random.Random) -> None:
        self._membership = membership
        self._send_sync = send_sync
        self._own = own
        self._family = family
        self._config = config
        self._clock = clock
        self._rng = rng
        self._synced_new: dict[str, float] = {}   # member -> when it last got a new_member push-pull
        self._awaiting: dict[str, tuple[float, int]] = {}     # member -> (send (again) at, tries so far)
        self._budget = NEW_MEMBER_BURST                        # new-member push-pulls left this tick
        self._join: asyncio.Task[None] | None = None
        self._join_seeds: list[str] = []
        self._answered: set[Addr] = set()      # addresses a Sync reply came from during the current join
        self._reply = asyncio.Event()

    def join(self, seeds: Sequence[str]) -> None:
        """Push-pull with every one of `seeds` (in the background); an unfinished join's seeds are kept."""
        running = self._join
        if running is not None and not running.done():     # unfinished: its seeds are joined with the new ones
            seeds = [*self._join_seeds, *(s for s in seeds if s not in self._join_seeds)]
            if seeds == self._join_seeds:
                return
            running.cancel()
        elif not seeds:
            return
        self._join_seeds = list(seeds)
        self._answered.clear()
        self._join = asyncio.get_running_loop().create_task(self._guarded_join(seeds), name="gossip-join")

    def joining(self) -> bool:
        return self._join is not None and not self._join.done()

    def answered(self, source: Addr, sender: str) -> None:
        """A Sync reply (no reply wanted) came from `source`, node `sender`."""
        self._awaiting.pop(sender, None)
        if self.joining():
            self._answered.add(source)
            self._reply.set()

    def _live_addresses(self) -> set[Addr]:
        return {a for m in self._membership.live() if (a := address(m.addr)) is not None}

    async def _guarded_join(self, seeds: list[str]) -> None:
        try:
            await self._join_loop(seeds)
        except Exception:           # never silently: the reconnect loop re-joins the seeds later
            log.exception("gossip_join_failed", seeds=list(seeds))

    async def _join_loop(self, seeds: list[str]) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + JOIN_PATIENCE_S
        unanswered: set[Addr] = set()
        while True:
            targets, unresolved = await resolve_seeds(seeds, self._family)
            unanswered = targets - self._own - self._answered - self._live_addresses()
            if (not unanswered and not unresolved) or loop.time() >= give_up:
                break
            for target in sorted(unanswered):
                self._send_sync(target, "join", "")
            deadline = min(give_up, loop.time() + min(JOIN_RETRY_S, self._config().probe_interval_s))
            if not unanswered:          # only names that did not resolve: ask the resolver again after a pause
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                continue
            while unanswered - self._answered - self._live_addresses() and (left := deadline - loop.time()) > 0:
                self._reply.clear()
                try:
                    await asyncio.wait_for(self._reply.wait(), left)
                except asyncio.TimeoutError:
                    break
        log.info("gossip_joined", node=self._membership.node_id, seeds=list(seeds),
                 unanswered=[host_port(*a) for a in sorted(unanswered)])

    def push_pull(self) -> None:
        """Anti-entropy with one random known member, dead included (a partition heals this way too)."""
        known = [m for m in self._membership.members() if m.state <= State.DEAD]
        if known:
            peer = self._rng.choice(known)
            self._send_sync(peer.addr, "periodic", peer.node)

    def arrivals(self, sender: str) -> None:
        """Push-pull with each member just heard of (new, or alive again) from someone else than the
        member itself (a datagram from `sender`): it may not know this node, or know members this node
        does not. At most once per member per sync_interval_s."""
        now, period = self._clock(), self._config().sync_interval_s
        for node in self._membership.take_arrivals():
            member = self._membership.get(node)
            last = self._synced_new.get(node)
            if node == sender or member is None or (last is not None and now - last < period):
                continue
            if len(self._synced_new) >= 4 * len(self._membership.members()) + 64:      # forget old entries
                self._synced_new = {k: t for k, t in self._synced_new.items() if now - t < period}
            self._synced_new[node] = now
            self._awaiting[node] = (now, 0)
        if self._awaiting:
            self._send_due(now)

    def retry(self) -> None:
        """Every tick: new members' push-pulls not answered within a probe interval go again (a lost
        datagram must not leave a member unknown until the periodic push-pull), NEW_MEMBER_TRIES in all,
        and those over the last tick's NEW_MEMBER_BURST go now (a healed partition of many members)."""
        self._budget = NEW_MEMBER_BURST
        self._send_due(self._clock())

    def _send_due(self, now: float) -> None:
        for node, (at, tries) in list(self._awaiting.items()):
            member = self._membership.get(node)
            if member is None or member.state >= State.DEAD or tries >= NEW_MEMBER_TRIES:
                del self._awaiting[node]
            elif now >= at and self._budget > 0:
                self._budget -= 1
                self._awaiting[node] = (now + self._config().probe_interval_s, tries + 1)
                self._send_sync(member.addr, "new_member", node)

    async def reconnect(self) -> None:
        """Push-pull with one random dead member; re-join the seeds that are not live members (the gossip
        runs it every reconnect_interval_s)."""
        dead = self._membership.dead()
        if dead:
            member = self._rng.choice(dead)
            if (target := address(member.addr)) is not None:
                self._send_sync(target, "reconnect", member.node)
        seeds = self._config().seeds
        if not seeds or self.joining():
            return
        targets, _ = await resolve_seeds(seeds, self._family)
        for target in sorted(targets - self._own - self._live_addresses()):
            self._send_sync(target, "join", "")

    async def close(self) -> None:
        if self._join is not None:
            await cancel_all([self._join])
