"""inferd.cluster.gossip: real nodes on loopback UDP (ephemeral ports), short intervals, bounded waits."""
from __future__ import annotations

import asyncio
import random

import msgspec
import pytest

from inferd.cluster.gossip import Gossip
from inferd.cluster.messages import (
    Ack,
    Broadcast,
    Leave,
    Load,
    MemberUpdate,
    Nack,
    Ping,
    PingReq,
    State,
    Sync,
    TenantDemand,
    VersionLoad,
)
from inferd.cluster.wire import Keyring, Opener, Sealer
from inferd.config import ClusterConfig

KEY = bytes(range(32))
OTHER_KEY = bytes(range(100, 132))
WAIT_S = 3.0
FAST = dict(bind_host="127.0.0.1", bind_port=0, key_file="cluster.key", probe_interval_s=0.05, probe_timeout_s=0.02,
            gossip_interval_s=0.02, sync_interval_s=0.5, load_interval_s=0.05, load_max_age_s=1.0)


def config(**overrides) -> ClusterConfig:
    return ClusterConfig(**{**FAST, **overrides})


def seed_of(node: Gossip) -> str:
    host, port = node.address
    return f"{host}:{port}"


async def until(condition, what: str = "condition", timeout_s: float = WAIT_S) -> None:
    """Poll `condition()` every 10 ms; fail the test after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)


def state_of(viewer: Gossip, node: Gossip) -> State | None:
    member = viewer.membership.get(node.node_id)
    return None if member is None else member.state


def all_alive(nodes: list[Gossip]) -> bool:
    return all(v.membership.counts()[State.ALIVE] == len(nodes) and
               all(state_of(v, n) is State.ALIVE for n in nodes) for v in nodes)


@pytest.fixture
async def make_node():
    """make_node(*seeds (nodes or "host:port"), key=KEY, **config overrides) -> a started Gossip node; all
    closed afterwards."""
    made: list[Gossip] = []

    async def make(*seeds: Gossip | str, key: bytes = KEY, load_report=None, on_load=None, **overrides) -> Gossip:
        addrs = tuple(s if isinstance(s, str) else seed_of(s) for s in seeds)       # a node, or "host:port"
        node = Gossip(config(seeds=addrs, **overrides), Keyring(key),
                      http_url=f"http://127.0.0.1:{8000 + len(made)}", load_report=load_report, on_load=on_load,
                      rng=random.Random(len(made)))
        await node.start()
        made.append(node)
        return node

    yield make
    for node in made:
        await node.close()


class Inbox(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.datagrams: list[bytes] = []

    def datagram_received(self, data: bytes, addr) -> None:
        self.datagrams.append(data)


@pytest.fixture
async def raw_socket():
    """A plain UDP socket on loopback (transport, inbox): what an attacker or a buggy peer sends from."""
    transport, inbox = await asyncio.get_running_loop().create_datagram_endpoint(Inbox, local_addr=("127.0.0.1", 0))
    yield transport, inbox
    transport.close()
    await asyncio.sleep(0)


async def test_three_nodes_converge_through_one_seed(make_node):
    seed = await make_node()
    b = await make_node(seed)
    c = await make_node(seed)
    await until(lambda: all_alive([seed, b, c]), "all three alive at all three")
    assert b.membership.get(c.node_id).http == "http://127.0.0.1:8002"
    await until(lambda: all(n.stats.probe_rtt_count > 0 for n in (seed, b, c)), "acked probes")
    for node in (seed, b, c):
        assert not any(node.stats.rejected.values()) and node.stats.sent > 0 and node.stats.received > 0
        assert sum(node.stats.probe_rtt_buckets.values()) > 0 and node.stats.probe_rtt_sum_s > 0


async def test_a_new_seed_from_reconfigure_is_joined(make_node):
    a = await make_node()
    b = await make_node()
    assert a.membership.live() == []
    a.reconfigure(config(seeds=(seed_of(b),)))
    await until(lambda: all_alive([a, b]), "a and b alive at both")


async def test_a_node_closed_without_leaving_becomes_dead_at_the_others(make_node):
    nodes = [await make_node()]
    nodes += [await make_node(nodes[0]) for _ in range(2)]
    await until(lambda: all_alive(nodes), "convergence")
    a, b, gone = nodes
    await gone.close()
    await until(lambda: state_of(a, gone) is State.DEAD and state_of(b, gone) is State.DEAD, "dead at both")
    assert a.stats.probe_failures + b.stats.probe_failures > 0
    assert state_of(a, b) is State.ALIVE and state_of(b, a) is State.ALIVE


async def test_a_node_that_leaves_is_seen_as_left_never_dead(make_node):
    nodes = [await make_node()]
    nodes += [await make_node(nodes[0]) for _ in range(2)]
    await until(lambda: all_alive(nodes), "convergence")
    a, b, leaver = nodes
    seen: list[tuple[str, State]] = []
    for node in (a, b):
        node.membership.on_change = lambda member, previous: seen.append((member.node, member.state))
    await asyncio.wait_for(leaver.leave(timeout_s=1.0), 2.0)
    await leaver.close()
    await until(lambda: state_of(a, leaver) is State.LEFT and state_of(b, leaver) is State.LEFT, "left at both")
    # Long enough for a suspicion to have become `dead` had the left node been probed (it must not be).
    timeout = a.membership.suspicion_timeout(0)
    await asyncio.sleep(timeout + 3 * FAST["probe_interval_s"])
    assert state_of(a, leaver) is State.LEFT and state_of(b, leaver) is State.LEFT
    assert (leaver.node_id, State.DEAD) not in seen and (leaver.node_id, State.SUSPECT) not in seen


async def test_forged_and_replayed_datagrams_are_rejected_and_change_nothing(make_node, raw_socket):
    node = await make_node()
    transport, inbox = raw_socket
    host, port = transport.get_extra_info("sockname")[:2]
    intruder = MemberUpdate("evil", f"{host}:{port}", "http://evil", State.ALIVE, 7, "evil")
    forged, _ = Sealer("evil", Keyring(OTHER_KEY)).seal(Sync((intruder,), reply=True), (), node.node_id)
    transport.sendto(forged, node.address)
    await until(lambda: node.stats.rejected.get("bad_mac") == 1, "the forged datagram counted")
    assert node.membership.get("evil") is None and inbox.datagrams == []

    # A peer's genuine Ping, answered once; the same bytes again are a replay: no second Ack.
    genuine, _ = Sealer("peer", Keyring(KEY)).seal(Ping(41, node.node_id), (), node.node_id)
    transport.sendto(genuine, node.address)
    await until(lambda: len(inbox.datagrams) == 1, "the Ack to the genuine ping")
    sent = node.stats.sent
    transport.sendto(genuine, node.address)
    await until(lambda: node.stats.rejected.get("replay") == 1, "the replay counted")
    await asyncio.sleep(5 * FAST["probe_interval_s"])
    assert len(inbox.datagrams) == 1 and node.stats.sent == sent
    assert {k: n for k, n in node.stats.rejected.items() if n} == {"bad_mac": 1, "replay": 1}


async def test_a_sync_reply_too_big_for_one_datagram_comes_in_several(make_node, raw_socket):
    node = await make_node()
    transport, inbox = raw_socket
    here = "%s:%d" % transport.get_extra_info("sockname")[:2]
    for i in range(40):
        node.membership.apply(MemberUpdate(f"member-{i:02d}.example", f"127.0.0.1:{9 + i}", f"http://10.0.0.{i}:8000",
                                           State.ALIVE, 0, "test"))
    peer = MemberUpdate("peer", here, "http://127.0.0.1:1", State.ALIVE, 0, "peer")
    transport.sendto(Sealer("peer", Keyring(KEY)).seal(Sync((peer,), reply=True), (), "")[0], node.address)
    opener, syncs = Opener(Keyring(KEY), node_id="peer", window_s=30.0), []

    def heard() -> set[str]:
        while inbox.datagrams:
            if isinstance(body := opener.open(inbox.datagrams.pop(0)).body, Sync):
                syncs.append(body)
        return {m.node for sync in syncs for m in sync.members}

    expected = {node.node_id, "peer", *(f"member-{i:02d}.example" for i in range(40))}
    await until(lambda: heard() == expected, "every member in the reply")
    assert len(syncs) > 1 and not any(sync.reply for sync in syncs)
    assert syncs[0].members[0].node == node.node_id


async def test_load_reports_reach_the_other_nodes_also_when_split_into_parts(make_node):
    small = ((VersionLoad("m", "v1", True, 4, 100, (0, 1, 2), 0.5, 1000.0),), (TenantDemand("acme", 1.0, 2),))
    versions = tuple(VersionLoad(f"model-{i}", f"version-{i}", True, i, 10 * i, (i, 0, 1), 0.25, 99.5)
                     for i in range(40))
    demand = tuple(TenantDemand(f"tenant-{i:03d}", 0.5 * i, i) for i in range(80))
    assert len(msgspec.msgpack.encode(Load(0.0, versions, demand))) > 1400          # needs several datagrams
    got: dict[str, list[Load]] = {}

    def sink(sender: str, load: Load) -> None:
        got.setdefault(sender, []).append(load)

    receiver = await make_node(on_load=sink)
    one = await make_node(receiver, load_report=lambda: small)
    big = await make_node(receiver, load_report=lambda: (versions, demand))

    def whole(sender: str) -> tuple[tuple, tuple] | None:
        parts = {load.part: load for load in got.get(sender, ()) if load.parts > 1}
        if not parts or len(parts) < next(iter(parts.values())).parts:
            return None
        ordered = [parts[i] for i in sorted(parts)]
        return (tuple(v for p in ordered for v in p.versions), tuple(d for p in ordered for d in p.demand))

    await until(lambda: small in [(x.versions, x.demand) for x in got.get(one.node_id, ())], "the small report")
    assert all(load.parts == 1 and load.part == 0 and load.age_s == 0.0 for load in got[one.node_id])
    await until(lambda: whole(big.node_id) is not None, "every part of the big report")
    assert whole(big.node_id) == (versions, demand)


async def test_bad_bytes_and_odd_but_authentic_packets_never_break_the_node(make_node, raw_socket):
    node = await make_node()
    other = await make_node(node)
    await until(lambda: all_alive([node, other]), "convergence")
    transport, inbox = raw_socket
    rng = random.Random(7)
    junk = [rng.randbytes(rng.randrange(0, 1600)) for _ in range(150)]
    junk += [b"IG\x01" + rng.randbytes(rng.randrange(0, 300)) for _ in range(50)] + [b"\x00", b"IG\x01", b"\x00" * 3000]
    for i, data in enumerate(junk):
        transport.sendto(data, node.address)
        if i % 20 == 19:                                      # paced: a burst could overflow the socket buffer
            await until(lambda: sum(node.stats.rejected.values()) == i + 1, "the junk so far rejected")
    await until(lambda: sum(node.stats.rejected.values()) == len(junk), "every junk datagram rejected")
    assert {k for k, n in node.stats.rejected.items() if n} <= {"oversize", "malformed", "bad_mac"}
    assert node.stats.rejected["oversize"] > 0
    # Genuine key, nonsense content: unknown probes, a bad address, a leave from a stranger, a load nobody asked for.
    sealer = Sealer("stranger", Keyring(KEY))
    odd = [Ack(123, "nobody"), Nack(5, "nobody"), PingReq(9, "ghost", "not an address"),
           PingReq(10, "x", "127.0.0.1:9"), Leave(3), Broadcast(), Load(0.0, (), ()), Ping(1, "someone else"),
           Sync((MemberUpdate("odd", "nowhere", "", State.SUSPECT, 1, "stranger"),), reply=False)]
    for body in odd:
        transport.sendto(sealer.seal(body, (), node.node_id)[0], node.address)
    await until(lambda: node.stats.received >= len(junk) + len(odd), "the odd packets")
    late = await make_node(node)                              # still joins, probes and answers
    await until(lambda: all_alive([node, other, late]), "convergence after the junk")


async def test_start_on_a_taken_port_raises_and_close_is_idempotent(make_node):
    node = await make_node()
    twin = Gossip(config(bind_port=node.address[1]), Keyring(KEY), http_url="http://127.0.0.1:1")
    with pytest.raises(OSError):
        await twin.start()
    await twin.close()
    await node.close()
    await node.close()


async def test_a_push_pull_is_answered_at_the_senders_own_address_not_the_datagrams_source(make_node, raw_socket):
    """A join to a seed names no receiver, so a captured copy opens at any node. Replayed from another
    (forged) source, the answer still goes to the address the sender claims for itself in it, never to
    the source (before: every node a copy reached sent its table to whatever source it bore)."""
    node = await make_node()
    victim, victim_inbox = raw_socket
    loop = asyncio.get_running_loop()
    joiner_sock, joiner_inbox = await loop.create_datagram_endpoint(Inbox, local_addr=("127.0.0.1", 0))
    try:
        host, port = joiner_sock.get_extra_info("sockname")[:2]
        claim = MemberUpdate("joiner", f"{host}:{port}", "http://joiner", State.ALIVE, 0, "joiner")
        join, _ = Sealer("joiner", Keyring(KEY)).seal(Sync((claim,), True), (), "")
        victim.sendto(join, node.address)                  # the copy, sent from the victim's address
        await until(lambda: joiner_inbox.datagrams, "the answer at the joiner's own address")
        assert victim_inbox.datagrams == []
    finally:
        joiner_sock.close()
