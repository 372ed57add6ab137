"""What peers say to each other: the gossip datagram and the messages it carries (msgpack, array-like).

One datagram is one `Packet`: who sent it (`sender`, `seq`, `ts`: inferd.cluster.wire authenticates
them), one `body` (a probe, its answer, a state sync or a load report) and membership `updates`
piggybacked on whatever is sent (SWIM's dissemination). inferd.cluster.wire seals a Packet into bytes
(HMAC, at most MAX_DATAGRAM bytes) and opens it again; inferd.cluster.membership decides what the
updates mean; inferd.cluster.gossip moves them over UDP.
"""
from __future__ import annotations

import enum

import msgspec

MAX_DATAGRAM = 1400        # bytes on the wire, MAC included: under a 1,500-byte Ethernet MTU with IP/UDP headers


class State(enum.IntEnum):
    """A member's state as one node believes it. Ordered: at one incarnation a later state overrides."""

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3          # announced its own departure (SIGTERM): never suspected, never probed again


class MemberUpdate(msgspec.Struct, array_like=True, frozen=True):
    """One claim about one member: `node` is `state` at `incarnation` (the member's own counter, which
    only it raises, to refute a suspicion). `by` is who claims it (suspicion confirmations count distinct
    `by`s). `addr` is the member's gossip address "host:port"; `http` its API base URL."""

    node: str
    addr: str
    http: str
    state: State
    incarnation: int
    by: str


class Ping(msgspec.Struct, array_like=True, tag="ping", frozen=True):
    """Are you alive? `probe` matches the Ack; `target` names who should answer (a stale address may
    reach someone else, who must not ack)."""

    probe: int
    target: str


class Ack(msgspec.Struct, array_like=True, tag="ack", frozen=True):
    probe: int
    node: str                  # who is alive (the target, also when an indirect prober relays it)


class PingReq(msgspec.Struct, array_like=True, tag="ping_req", frozen=True):
    """Probe `target` at `target_addr` for me and relay its Ack (SWIM's indirect probe)."""

    probe: int
    target: str
    target_addr: str


class Nack(msgspec.Struct, array_like=True, tag="nack", frozen=True):
    """Lifeguard: an indirect prober reached no answer from `target` in time (so the asker knows the
    relay itself is alive and the silence is the target's)."""

    probe: int
    target: str


class Sync(msgspec.Struct, array_like=True, tag="sync", frozen=True):
    """Push-pull of the member table (a join, and periodic anti-entropy). `reply`: answer with mine."""

    members: tuple[MemberUpdate, ...]
    reply: bool


class VersionLoad(msgspec.Struct, array_like=True, frozen=True):
    """One loaded model version on the sender, as its admission queue and engine see it."""

    model: str
    version: str
    ready: bool                # started, warmed and healthy
    free_slots: int            # sequences the engine could start now
    free_kv_blocks: int
    queued: tuple[int, ...]    # requests waiting in admission, per priority class (interactive, standard, batch)
    est_wait_s: float          # how long a new standard request would wait before it starts
    tokens_per_s: float        # measured served cost per second (0: not measured yet)


class TenantDemand(msgspec.Struct, array_like=True, frozen=True):
    """How much one tenant asked of the sender lately (attempts, refused or not): per second, smoothed."""

    tenant: str
    requests_per_s: float      # quota shares split a tenant's limits in proportion to this
    in_flight: int
    spend: float = 0.0         # this node's recorded cost in the tenant's current budget period
    tokens_today: int = 0      # ... and tokens today (budgets are enforced on the cluster's sum)


class Load(msgspec.Struct, array_like=True, tag="load", frozen=True):
    """The sender's own load hints. `age_s` is how old they were when sent; a receiver adds the time
    since it received them, so no clocks need to agree. A report too big for one datagram is sent as
    `part` of `parts`; each part stands alone (its versions and tenants)."""

    age_s: float
    versions: tuple[VersionLoad, ...]
    demand: tuple[TenantDemand, ...]
    part: int = 0
    parts: int = 1


class Broadcast(msgspec.Struct, array_like=True, tag="broadcast", frozen=True):
    """Nothing but the piggybacked updates (the periodic gossip to a few random peers)."""


class Leave(msgspec.Struct, array_like=True, tag="leave", frozen=True):
    """The sender is going away on purpose (SIGTERM); `incarnation` is its current one."""

    incarnation: int


Body = Ping | Ack | PingReq | Nack | Sync | Load | Broadcast | Leave


class Packet(msgspec.Struct, array_like=True, frozen=True):
    """One datagram's content. `seq` rises with every datagram a sender sends (for replay detection; it
    starts from the wall clock in microseconds, so a restarted node keeps rising); `ts` is the sender's
    wall clock (seconds) when it sent the packet."""

    sender: str
    seq: int
    ts: float
    body: Body
    updates: tuple[MemberUpdate, ...] = ()
