"""SWIM membership: the one owner of the member table, as a pure state machine with an injected clock.

Modelled on HashiCorp memberlist (state.go, suspicion.go): a probe that fails (direct and indirect)
makes the prober suspect the target; the suspicion becomes `dead` after a timeout that starts at
suspicion_max_mult x the minimum and shrinks towards the minimum as other members independently
confirm it (Lifeguard); a member refutes a suspicion of itself by raising its incarnation and
announcing itself alive. Every accepted change is queued for dissemination: it piggybacks on
outgoing datagrams, the least-sent first, each at most retransmit_mult * ceil(log10(n + 1)) times,
and a newer claim about a member replaces the queued older one. No sockets here: inferd.cluster.gossip
moves the updates; tests drive this with a fake clock.

Precedence, for a claim about another member at incarnation i against what we know at incarnation j:
alive wins if i > j (or the member is new); suspect if i >= j and we think it alive (or suspect at a
lower incarnation); dead and left if i >= j and it is not already dead or left. A claim about
ourselves that is not alive (suspect or dead) is refuted, unless we are leaving.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

from inferd.cluster.messages import MemberUpdate, State
from inferd.config import ClusterConfig

REAP_AFTER_PROBES = 100     # probe intervals a left member stays in the table (100 s at the default 1 s)


class MembershipStats:
    """What the member table counts (inferd.cluster.gossip.GossipStats extends it; metrics read it)."""

    def __init__(self) -> None:
        self.suspicions = 0         # members this node came to hold suspect (its own probes or others' claims)
        self.refutations = 0        # claims about this node (suspect, dead, stale) it refuted
        self.deaths = 0             # suspicions that ran out here: members this node declared dead


class Member:
    """What this node believes of one member (itself included)."""

    __slots__ = ("node", "addr", "http", "state", "incarnation", "since")

    def __init__(self, node: str, addr: str, http: str, state: State, incarnation: int, since: float) -> None:
        self.node = node
        self.addr = addr                # gossip "host:port"
        self.http = http                # API base URL
        self.state = state
        self.incarnation = incarnation
        self.since = since              # clock time of the last state change

    def update(self, by: str) -> MemberUpdate:
        return MemberUpdate(self.node, self.addr, self.http, self.state, self.incarnation, by)


ChangeHook = Callable[[Member, "State | None"], None]    # (member after the change, its previous state or None if new)


class Membership:
    """The member table of node `node_id` (gossip address `addr`, API URL `http`). Loop thread only."""

    def __init__(self, node_id: str, addr: str, http: str, config: ClusterConfig, *,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 stats: MembershipStats | None = None) -> None:
        self.config = config
        self.on_change = None
        self.stats = stats if stats is not None else MembershipStats()
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._self = Member(node_id, addr, http, State.ALIVE, 0, clock())
        self._members: dict[str, Member] = {node_id: self._self}
        self._suspicions: dict[str, tuple[float, set[str]]] = {}     # node -> (since, who suspects it)
        self._queue: dict[str, tuple[MemberUpdate, int, int]] = {}   # node -> (claim, times sent, queued order)
        self._queued = 0
        self._order: list[str] = []     # this round's probe order (node ids); self._next is the next to probe
        self._next = 0
        self._arrivals: list[str] = []  # members new or back from dead/left since take_arrivals() last ran

    config: ClusterConfig           # settable: a reload swaps it (timeouts, multipliers)
    on_change: ChangeHook | None    # called after every accepted state change (metrics, forgetting load hints)

    # -- what we know ---------------------------------------------------------------------
    @property
    def node_id(self) -> str:
        return self._self.node

    @property
    def incarnation(self) -> int:
        return self._self.incarnation

    def get(self, node: str) -> Member | None:
        """The member (itself included), or None if unknown."""
        return self._members.get(node)

    def members(self) -> list[Member]:
        """Every known member except this node, any state."""
        return [m for m in self._members.values() if m is not self._self]

    def live(self) -> list[Member]:
        """Other members that are alive or suspect (those we still probe and send to)."""
        return [m for m in self.members() if m.state <= State.SUSPECT]

    def dead(self) -> list[Member]:
        """Other members held dead (not left): those partition healing push-pulls with now and then."""
        return [m for m in self.members() if m.state == State.DEAD]

    def take_arrivals(self) -> list[str]:
        """Members that became known, or alive again after dead or left, since the last call (oldest first)."""
        arrivals, self._arrivals = self._arrivals, []
        return arrivals

    def queue_depth(self) -> int:
        """Claims waiting in the dissemination queue."""
        return len(self._queue)

    def counts(self) -> dict[State, int]:
        """Members by state, this node included (as alive, or left once leaving)."""
        counts = dict.fromkeys(State, 0)
        for member in self._members.values():
            counts[member.state] += 1
        return counts

    def snapshot(self) -> tuple[MemberUpdate, ...]:
        """Every member's current claim, this node's first: the content of a Sync."""
        return tuple(m.update(self.node_id) for m in (self._self, *self.members()))

    # -- claims from others ---------------------------------------------------------------
    def apply(self, update: MemberUpdate) -> bool:
        """Take one claim (piggybacked or from a Sync); True if it changed what we believe (then it is
        queued for dissemination). A suspect claim about a member already suspect at that incarnation
        counts as a confirmation from `update.by` and shortens its timeout."""
        if update.node == self.node_id:
            return self._about_self(update)
        member = self._members.get(update.node)
        if update.state == State.ALIVE:
            return self._alive(member, update)
        if member is None:              # as memberlist: suspect, dead or left about an unknown node says nothing
            return False
        if update.state == State.SUSPECT:
            return self._suspect(member, update.incarnation, update.by)
        return self._down(member, update.state, update.incarnation, update.by)

    def apply_leave(self, node: str, incarnation: int) -> bool:
        """The member says it is leaving (a Leave datagram from it)."""
        member = self._members.get(node)
        if member is None or member is self._self:
            return False
        return self._down(member, State.LEFT, incarnation, node)

    # -- probing ----------------------------------------------------------------------------
    def next_probe(self) -> Member | None:
        """The next member to probe: round-robin over live members in an order reshuffled every round
        (so every member is probed within one round of n probe intervals). None when alone."""
        for _ in range(2):              # the rest of this round, else a new round
            while self._next < len(self._order):
                member = self._members.get(self._order[self._next])
                self._next += 1
                if member is not None and member.state <= State.SUSPECT:
                    return member
            self._order = [m.node for m in self.live()]
            self._rng.shuffle(self._order)
            self._next = 0
        return None

    def helpers(self, target: str, k: int) -> list[Member]:
        """Up to k random alive members, neither this node nor `target`, for an indirect probe."""
        pool = [m for m in self.members() if m.state == State.ALIVE and m.node != target]
        return self._rng.sample(pool, max(0, min(k, len(pool))))

    def probe_failed(self, node: str) -> None:
        """Neither a direct nor an indirect probe of `node` got an ack in time: suspect it."""
        member = self._members.get(node)
        if member is not None and member is not self._self:
            self._suspect(member, member.incarnation, self.node_id)

    def tick(self) -> list[str]:
        """Suspicions whose timeout has passed become dead (queued). Returns the nodes declared dead."""
        now = self._clock()
        expired = [node for node, (since, by) in self._suspicions.items()
                   if now - since >= self.suspicion_timeout(len(by) - 1)]
        for node in expired:
            member = self._members[node]
            self._set(member, State.DEAD, member.incarnation, self.node_id)
        self.stats.deaths += len(expired)
        # Forget members gone for long, so a table of nodes that restart under new ids (host:port with
        # port 0) does not grow forever: left ones once their claims have stopped circulating; dead ones
        # only after reconnect_timeout_s, since until then a partition may still heal (gossip's reconnect).
        for node in [m.node for m in self.members() if now - m.since > self._reap_after(m.state)]:
            del self._members[node]
            self._queue.pop(node, None)
        return expired

    def _reap_after(self, state: State) -> float:
        if state == State.LEFT:
            return REAP_AFTER_PROBES * self.config.probe_interval_s
        return self.config.reconnect_timeout_s if state == State.DEAD else math.inf

    def suspicion_timeout(self, confirmations: int) -> float:
        """Seconds from suspicion to dead with `confirmations` independent confirmations (memberlist's
        formula: min = suspicion_mult * max(1, log10(n)) * probe_interval_s, max = suspicion_max_mult * min,
        k = suspicion_mult - 2 expected confirmations (0 when fewer than k + 2 members),
        timeout = max(min, max - (max - min) * log(c + 1) / log(k + 1)))."""
        c = self.config
        n = self._n()
        low = c.suspicion_mult * max(1.0, math.log10(max(1, n))) * c.probe_interval_s
        high = c.suspicion_max_mult * low
        k = c.suspicion_mult - 2
        if n < k + 2 or k < 1:          # no confirmations expected: memberlist starts at the minimum
            return low
        return max(low, high - (high - low) * math.log(max(0, confirmations) + 1) / math.log(k + 1))

    def leave(self) -> MemberUpdate:
        """This node is leaving: its own `left` claim at a raised incarnation, queued to disseminate."""
        me = self._self
        if me.state == State.LEFT:      # already leaving: the same claim again
            self._enqueue(me.update(me.node))
        else:
            self._set(me, State.LEFT, me.incarnation + 1, me.node)
        return me.update(me.node)

    # -- dissemination ----------------------------------------------------------------------
    def pending(self) -> list[MemberUpdate]:
        """Queued claims, least transmitted first (the order to piggyback them in)."""
        return [claim for claim, _, _ in sorted(self._queue.values(), key=lambda e: (e[1], -e[2]))]

    def sent(self, updates: list[MemberUpdate]) -> None:
        """These were piggybacked once more; those sent their retransmit limit times leave the queue."""
        limit = max(1, self.config.retransmit_mult * math.ceil(math.log10(self._n() + 1)))
        for update in updates:
            entry = self._queue.get(update.node)
            if entry is None or entry[0] != update:     # replaced by a newer claim meanwhile: that one starts at 0
                continue
            if entry[1] + 1 >= limit:
                del self._queue[update.node]
            else:
                self._queue[update.node] = (update, entry[1] + 1, entry[2])

    # -- private ----------------------------------------------------------------------------
    def _about_self(self, update: MemberUpdate) -> bool:
        """Refute any claim about this node but alive at our own addresses (unless leaving): raise the
        incarnation above the claim's if it is not already, and queue our alive claim. Also an alive claim
        with other addresses (a stale one from before a restart) is refuted, as memberlist does."""
        me = self._self
        if me.state == State.LEFT or update.state == State.ALIVE and (update.addr, update.http) == (me.addr, me.http):
            return False
        me.incarnation = max(me.incarnation, update.incarnation + 1)
        self._enqueue(me.update(me.node))
        self.stats.refutations += 1
        return True

    def _alive(self, member: Member | None, update: MemberUpdate) -> bool:
        if member is None:
            member = Member(update.node, update.addr, update.http, State.ALIVE, update.incarnation, self._clock())
            self._members[member.node] = member
            self._became_live(member.node)
            self._arrivals.append(member.node)
            self._enqueue(member.update(update.by))
            if self.on_change is not None:
                self.on_change(member, None)
            return True
        if update.incarnation <= member.incarnation:
            return False
        if member.state >= State.DEAD:
            self._became_live(member.node)
            self._arrivals.append(member.node)
        member.addr, member.http = update.addr, update.http
        self._set(member, State.ALIVE, update.incarnation, update.by)
        return True

    def _suspect(self, member: Member, incarnation: int, by: str) -> bool:
        if incarnation < member.incarnation or member.state >= State.DEAD:
            return False
        if member.state == State.SUSPECT and incarnation == member.incarnation:    # a confirmation
            confirmed = self._suspicions[member.node][1]
            if by in confirmed:
                return False
            confirmed.add(by)
            self._enqueue(member.update(by))
            return True
        self._suspicions[member.node] = (self._clock(), {by})
        if member.state != State.SUSPECT:
            self.stats.suspicions += 1
        self._set(member, State.SUSPECT, incarnation, by)
        return True

    def _down(self, member: Member, state: State, incarnation: int, by: str) -> bool:
        if incarnation < member.incarnation or member.state >= State.DEAD:
            return False
        self._set(member, state, incarnation, by)
        return True

    def _set(self, member: Member, state: State, incarnation: int, by: str) -> None:
        """Record an accepted claim: queue it, and tell on_change if the state changed."""
        previous = member.state
        member.incarnation = incarnation
        if state != State.SUSPECT:
            self._suspicions.pop(member.node, None)
        if state != previous:
            member.state, member.since = state, self._clock()
        self._enqueue(member.update(by))
        if state != previous and self.on_change is not None:
            self.on_change(member, previous)

    def _became_live(self, node: str) -> None:
        """A new or revived member joins the current round at a random place among those not yet probed."""
        if node not in self._order[self._next:]:
            self._order.insert(self._rng.randint(self._next, len(self._order)), node)

    def _enqueue(self, claim: MemberUpdate) -> None:
        self._queued += 1
        self._queue[claim.node] = (claim, 0, self._queued)

    def _n(self) -> int:
        """Members not dead or left, this node included (unless leaving)."""
        return sum(1 for m in self._members.values() if m.state <= State.SUSPECT)
