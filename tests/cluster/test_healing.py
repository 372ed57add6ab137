"""Partition healing, joining every seed, DNS seeds and push-pulls with new members: real Gossip nodes on
loopback UDP (a partition is both sides dropping all they send), short intervals, bounded waits."""
from __future__ import annotations

import asyncio
import logging
import random
import socket

from inferd.cluster.joining import Joiner, resolve_seeds
from inferd.cluster.membership import Membership
from inferd.cluster.messages import MemberUpdate, State
from inferd.config import ClusterConfig
from inferd.config.cluster import cluster_errors
from tests.cluster.test_gossip import FAST, all_alive, make_node, state_of, until  # noqa: F401 (make_node: a fixture)


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_partition_heals_once_both_sides_hold_each_other_dead(make_node):
    a = await make_node(reconnect_interval_s=0.2, sync_interval_s=60.0)
    b = await make_node(a, reconnect_interval_s=0.2, sync_interval_s=60.0)
    c = await make_node(a, reconnect_interval_s=0.2, sync_interval_s=60.0)
    await until(lambda: all_alive([a, b, c]), "convergence")
    a.drop_rate = 1.0                               # a hears b and c but nothing it sends arrives: cut both ways
    b.drop_rate = c.drop_rate = 1.0
    await until(lambda: state_of(a, b) is State.DEAD and state_of(b, a) is State.DEAD
                and state_of(c, a) is State.DEAD, "both sides to hold the other dead")
    # Longer than a dead member's claims circulate (the old code's only way back), then reconnect.
    await asyncio.sleep(40 * FAST["probe_interval_s"])
    a.drop_rate = b.drop_rate = c.drop_rate = 0.0
    await until(lambda: all_alive([a, b, c]), "the partition to heal")
    assert a.stats.refutations > 0 and b.stats.refutations + c.stats.refutations > 0
    assert a.stats.push_pulls["reconnect"] + b.stats.push_pulls["reconnect"] > 0
    assert a.stats.deaths > 0 and a.stats.suspicions > 0


async def test_a_seed_that_comes_up_late_is_still_joined(make_node):
    early = await make_node()
    late_port = free_udp_port()
    joiner = await make_node(early, f"127.0.0.1:{late_port}", reconnect_interval_s=60.0, sync_interval_s=60.0)
    await until(lambda: all_alive([early, joiner]), "the early seed joined")
    await asyncio.sleep(5 * FAST["probe_interval_s"])
    late = await make_node(bind_port=late_port, sync_interval_s=60.0)     # no seeds of its own
    await until(lambda: all_alive([early, joiner, late]), "the late seed joined too")
    assert joiner.stats.push_pulls["join"] >= 3


async def test_a_member_heard_of_from_a_third_node_gets_a_push_pull(make_node):
    """a and b each know only c; a and c learn of each other's members from c's tables: each pushes
    its table to the member it has just heard of, without waiting for sync_interval_s."""
    c = await make_node(sync_interval_s=60.0)
    a = await make_node(c, sync_interval_s=60.0)
    await until(lambda: all_alive([a, c]), "a joined c")
    b = await make_node(c, sync_interval_s=60.0)
    await until(lambda: all_alive([a, b, c]), "all three alive at all three")
    assert a.stats.push_pulls["new_member"] + b.stats.push_pulls["new_member"] > 0
    assert all(n.stats.push_pulls["periodic"] == 0 for n in (a, b, c))


async def test_a_seed_named_by_dns_is_resolved_and_joined_and_a_bad_name_is_not_fatal(make_node, caplog):
    seed = await make_node()
    caplog.set_level(logging.WARNING, logger="inferd.cluster")
    node = await make_node(f"localhost:{seed.address[1]}", "no-such-seed.invalid:7946")
    await until(lambda: all_alive([seed, node]), "joined through localhost")
    await until(lambda: "gossip_seed_unresolved" in caplog.text, "the unresolvable name logged")


async def test_resolve_seeds_keeps_the_sockets_family_and_counts_what_did_not_resolve():
    found, failed = await resolve_seeds(["localhost:7000", "10.0.0.9:1", "no-such-seed.invalid:1"], socket.AF_INET)
    assert ("127.0.0.1", 7000) in found and ("10.0.0.9", 1) in found and failed == 1
    assert all(":" not in host for host, _ in found)


def test_seeds_may_be_dns_names_but_not_malformed_ones():
    good = ClusterConfig(key_file="k", seeds=("localhost:7946", "seeds.example.internal:7946", "[::1]:1"))
    assert cluster_errors(good) == []
    bad = ClusterConfig(key_file="k", seeds=("-bad.example:1", "host_x:1", "a..b:1", "10.0.0:1", "ok.example:0"))
    assert len(cluster_errors(bad)) == 5
    assert "IP address or a DNS name" in cluster_errors(bad)[0]
    assert cluster_errors(ClusterConfig(key_file="k", reconnect_interval_s=0, reconnect_timeout_s=-1)) == [
        "cluster.reconnect_interval_s: must be > 0, got 0", "cluster.reconnect_timeout_s: must be > 0, got -1"]


class Recorder:
    """A Joiner's send_sync that only records (address, reason, receiver)."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, str, str]] = []

    def __call__(self, to, reason: str, receiver: str) -> None:
        self.sent.append((to, reason, receiver))


def joiner_of(clock, **config):
    membership = Membership("me", "127.0.0.1:1", "http://me", ClusterConfig(**config), clock=clock)
    recorder = Recorder()
    joiner = Joiner(membership, recorder, own={("127.0.0.1", 1)}, family=socket.AF_INET,
                    config=lambda: membership.config, clock=clock, rng=random.Random(3))
    return membership, joiner, recorder


def member(node: str, port: int, state: State = State.ALIVE, incarnation: int = 0, by: str = "third") -> MemberUpdate:
    return MemberUpdate(node, f"127.0.0.1:{port}", f"http://{node}", state, incarnation, by)


def test_a_member_heard_of_gets_a_push_pull_again_until_it_answers_at_most_three_tries():
    now = [100.0]
    membership, joiner, sent = joiner_of(lambda: now[0], probe_interval_s=1.0, probe_timeout_s=0.5)
    membership.apply(member("x", 2))
    membership.apply(member("y", 3))
    joiner.arrivals("y")                            # y told us about itself: no push-pull for y
    assert sent.sent == [("127.0.0.1:2", "new_member", "x")]
    for _ in range(5):
        now[0] += 1.0
        joiner.retry()
    assert [s[1:] for s in sent.sent] == [("new_member", "x")] * 3
    membership.apply(member("z", 4))
    joiner.arrivals("y")
    joiner.answered(("127.0.0.1", 4), "z")          # z's table came back: no second try
    now[0] += 1.0
    joiner.retry()
    assert [s[2] for s in sent.sent] == ["x", "x", "x", "z"]


def test_a_member_back_from_dead_gets_a_push_pull_but_once_per_sync_interval():
    now = [100.0]
    membership, joiner, sent = joiner_of(lambda: now[0], sync_interval_s=30.0)
    membership.apply(member("x", 2))
    joiner.arrivals("third")
    joiner.answered(("127.0.0.1", 2), "x")
    membership.apply(member("x", 2, State.DEAD))
    membership.apply(member("x", 2, State.ALIVE, 1))
    joiner.arrivals("third")
    assert len(sent.sent) == 1                      # within sync_interval_s of the first
    now[0] += 30.0
    membership.apply(member("x", 2, State.DEAD, 1))
    membership.apply(member("x", 2, State.ALIVE, 2))
    joiner.arrivals("third")
    assert len(sent.sent) == 2


async def test_reconnect_push_pulls_with_a_dead_member_and_re_resolves_seeds_that_are_not_live():
    membership, joiner, sent = joiner_of(lambda: 0.0, seeds=("localhost:7001", "127.0.0.1:7002"))
    membership.apply(member("dead-one", 7003))
    membership.apply(member("dead-one", 7003, State.DEAD))
    membership.apply(member("seed-two", 7002))      # a live member at the second seed's address
    await joiner.reconnect()
    assert sent.sent == [(("127.0.0.1", 7003), "reconnect", "dead-one"), (("127.0.0.1", 7001), "join", "")]
    membership.apply(member("seed-one", 7001))
    sent.sent.clear()
    await joiner.reconnect()
    assert sent.sent == [(("127.0.0.1", 7003), "reconnect", "dead-one")]


def test_new_member_push_pulls_beyond_the_burst_wait_for_the_next_tick():
    from inferd.cluster.joining import NEW_MEMBER_BURST

    membership, joiner, sent = joiner_of(lambda: 100.0)
    for i in range(NEW_MEMBER_BURST + 5):
        membership.apply(member(f"m{i:02d}", 2000 + i))
    joiner.arrivals("third")
    assert len(sent.sent) == NEW_MEMBER_BURST
    joiner.retry()
    assert len(sent.sent) == NEW_MEMBER_BURST + 5 and len({s[2] for s in sent.sent}) == NEW_MEMBER_BURST + 5


def test_the_periodic_push_pull_may_pick_a_dead_member_but_never_a_left_one():
    membership, joiner, sent = joiner_of(lambda: 0.0)
    membership.apply(member("gone", 7001))
    membership.apply(member("gone", 7001, State.LEFT))
    joiner.push_pull()
    assert sent.sent == []
    membership.apply(member("dead-one", 7002))
    membership.apply(member("dead-one", 7002, State.DEAD))
    joiner.push_pull()
    assert sent.sent == [("127.0.0.1:7002", "periodic", "dead-one")]


async def test_a_seed_name_that_does_not_resolve_is_asked_again_only_after_a_pause(monkeypatch):
    """Only an unresolvable name left to join: the join waits its retry interval before asking the
    resolver again (before, it asked again at once, thousands of times a second, for JOIN_PATIENCE_S)."""
    import inferd.cluster.joining as joining

    loop = asyncio.get_running_loop()
    asked: list[float] = []

    async def unresolvable(seeds, family):
        asked.append(loop.time())
        return set(), len(seeds)

    monkeypatch.setattr(joining, "resolve_seeds", unresolvable)
    membership, joiner, sent = joiner_of(loop.time, probe_interval_s=0.1, probe_timeout_s=0.05)
    joiner.join(["no-such-seed.invalid:7946"])
    try:
        await until(lambda: len(asked) >= 3, "three resolutions")
    finally:
        await joiner.close()
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert min(gaps) >= 0.09 and sent.sent == []


def test_a_reconnect_timeout_shorter_than_claims_circulate_or_than_the_reconnect_interval_is_refused():
    assert cluster_errors(ClusterConfig(key_file="k", probe_interval_s=1.0, reconnect_timeout_s=60.0)) == [
        "cluster.reconnect_timeout_s: must be at least 100 (reconnect_interval_s and 100 probe intervals), got 60"]
    assert cluster_errors(ClusterConfig(key_file="k", reconnect_interval_s=300.0, reconnect_timeout_s=200.0)) == [
        "cluster.reconnect_timeout_s: must be at least 300 (reconnect_interval_s and 100 probe intervals), got 200"]
    assert cluster_errors(ClusterConfig(key_file="k", reconnect_timeout_s=100.0)) == []
