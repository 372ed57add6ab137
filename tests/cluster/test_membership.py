from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from inferd.cluster.membership import Member, Membership
from inferd.cluster.messages import MemberUpdate, State
from inferd.config import ClusterConfig


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make(clock: FakeClock):
    """Membership of node "a" with `peers` other members alive at incarnation 0 (named "n0", "n1", ...)."""
    def make(peers: int = 0, **config: object) -> Membership:
        m = Membership("a", "10.0.0.1:7946", "http://10.0.0.1:8000", ClusterConfig(**config),
                       clock=clock, rng=random.Random(7))
        for i in range(peers):
            m.apply(alive(f"n{i}"))
        return m
    return make


def alive(node: str, incarnation: int = 0, by: str = "x", addr: str = "", http: str = "") -> MemberUpdate:
    return MemberUpdate(node, addr or f"{node}:7946", http or f"http://{node}", State.ALIVE, incarnation, by)


def claim(node: str, state: State, incarnation: int = 0, by: str = "x") -> MemberUpdate:
    return MemberUpdate(node, f"{node}:7946", f"http://{node}", state, incarnation, by)


def queued(m: Membership, node: str) -> MemberUpdate | None:
    return next((u for u in m.pending() if u.node == node), None)


def test_table_includes_self_but_members_and_live_exclude_it(make) -> None:
    m = make(peers=2)
    assert m.get("a").state == State.ALIVE and m.incarnation == 0 and m.node_id == "a"
    assert sorted(x.node for x in m.members()) == ["n0", "n1"]
    assert sorted(x.node for x in m.live()) == ["n0", "n1"]
    assert m.counts() == {State.ALIVE: 3, State.SUSPECT: 0, State.DEAD: 0, State.LEFT: 0}


def test_new_member_is_added_queued_and_reported(make) -> None:
    m = make()
    changes: list[tuple[str, State, State | None]] = []
    m.on_change = lambda member, previous: changes.append((member.node, member.state, previous))
    assert m.apply(alive("b", 3, by="c"))
    assert (m.get("b").addr, m.get("b").incarnation) == ("b:7946", 3)
    assert queued(m, "b") == alive("b", 3, by="c")
    assert changes == [("b", State.ALIVE, None)]
    assert not m.apply(alive("b", 3))


def test_suspect_about_unknown_node_ignored(make) -> None:
    m = make()
    for state in (State.SUSPECT, State.DEAD, State.LEFT):
        assert not m.apply(claim("b", state, 5))
    assert not m.apply_leave("b", 5)
    assert m.get("b") is None and m.pending() == []


def test_suspicion_becomes_dead_after_timeout(make, clock: FakeClock) -> None:
    m = make(peers=9)
    dead: list[tuple[str, State | None]] = []
    m.on_change = lambda member, previous: dead.append((member.node, previous))
    m.probe_failed("n0")
    assert m.get("n0").state == State.SUSPECT and queued(m, "n0") == claim("n0", State.SUSPECT, by="a")
    timeout = m.suspicion_timeout(0)
    clock.now += timeout - 0.01
    assert m.tick() == []
    clock.now += 0.01
    assert m.tick() == ["n0"]
    assert m.get("n0").state == State.DEAD and queued(m, "n0") == claim("n0", State.DEAD, by="a")
    assert dead == [("n0", State.ALIVE), ("n0", State.SUSPECT)]
    assert m.tick() == [] and "n0" not in [x.node for x in m.live()]


def test_confirmations_shorten_suspicion_timeout(make, clock: FakeClock) -> None:
    m = make(peers=9)
    assert m.apply(claim("n0", State.SUSPECT, by="n1"))
    assert m.apply(claim("n0", State.SUSPECT, by="n2"))       # one confirmation
    assert queued(m, "n0").by == "n2"                         # re-announced, so others count it too
    clock.now += m.suspicion_timeout(1)
    assert m.suspicion_timeout(1) < m.suspicion_timeout(0)
    assert m.tick() == ["n0"]


def test_repeated_confirmation_from_same_member_is_not_counted(make, clock: FakeClock) -> None:
    m = make(peers=9)
    m.apply(claim("n0", State.SUSPECT, by="n1"))
    assert not m.apply(claim("n0", State.SUSPECT, by="n1"))
    m.probe_failed("n0")
    m.probe_failed("n0")                                      # self counted once
    clock.now += m.suspicion_timeout(1)
    assert m.tick() == ["n0"]
    m2 = make(peers=9)
    m2.apply(claim("n0", State.SUSPECT, by="n1"))
    m2.apply(claim("n0", State.SUSPECT, by="n1"))
    clock.now += m2.suspicion_timeout(1)
    assert m2.tick() == []


def test_suspicion_timeout_matches_memberlist_formula(make) -> None:
    m = make(peers=9)                                         # n = 10: min = 4 * log10(10) * 1 s, max = 6 * min
    assert m.suspicion_timeout(0) == pytest.approx(24.0)
    assert m.suspicion_timeout(1) == pytest.approx(24.0 - 20.0 * math.log(2) / math.log(3))
    assert m.suspicion_timeout(2) == pytest.approx(4.0)       # k = suspicion_mult - 2 = 2 confirmations
    assert m.suspicion_timeout(5) == pytest.approx(4.0)
    m = make(peers=99, probe_interval_s=0.5)                  # n = 100: min = 4 * 2 * 0.5 s
    assert m.suspicion_timeout(0) == pytest.approx(24.0)
    assert m.suspicion_timeout(2) == pytest.approx(4.0)
    m = make(peers=2)                                         # n = 3 < k + 2: no confirmations expected
    assert m.suspicion_timeout(0) == pytest.approx(4.0)


def test_refutes_suspicion_of_itself_with_higher_incarnation(make) -> None:
    m = make(peers=1)
    assert m.apply(claim("a", State.SUSPECT, 4, by="n0"))
    assert m.incarnation == 5 and m.get("a").state == State.ALIVE
    assert queued(m, "a") == MemberUpdate("a", "10.0.0.1:7946", "http://10.0.0.1:8000", State.ALIVE, 5, "a")
    assert m.apply(claim("a", State.DEAD, 5, by="n0"))
    assert m.incarnation == 6


def test_stale_suspicion_of_itself_is_refuted_without_raising_incarnation(make) -> None:
    m = make()
    m.apply(claim("a", State.SUSPECT, 4))
    assert m.apply(claim("a", State.SUSPECT, 2))
    assert m.incarnation == 5 and queued(m, "a").incarnation == 5


def test_alive_about_itself_is_ignored_unless_its_addresses_are_stale(make) -> None:
    m = make()
    assert not m.apply(MemberUpdate("a", "10.0.0.1:7946", "http://10.0.0.1:8000", State.ALIVE, 3, "b"))
    assert m.incarnation == 0 and m.pending() == []
    assert m.apply(MemberUpdate("a", "10.0.0.1:7946", "http://old:8000", State.ALIVE, 3, "b"))
    assert m.incarnation == 4 and queued(m, "a").http == "http://10.0.0.1:8000"


def test_alive_at_higher_incarnation_clears_suspicion(make, clock: FakeClock) -> None:
    m = make(peers=9)
    changes: list[State | None] = []
    m.on_change = lambda member, previous: changes.append(previous)
    m.probe_failed("n0")
    assert m.apply(alive("n0", 1, addr="n0:9000"))
    member = m.get("n0")
    assert (member.state, member.incarnation, member.addr) == (State.ALIVE, 1, "n0:9000")
    assert changes == [State.ALIVE, State.SUSPECT]
    clock.now += 1000
    assert m.tick() == []


def test_stale_alive_does_not_override_suspect(make) -> None:
    m = make(peers=9)
    m.apply(alive("n0", 2))
    m.apply(claim("n0", State.SUSPECT, 2))
    assert not m.apply(alive("n0", 2))
    assert not m.apply(alive("n0", 1))
    assert m.get("n0").state == State.SUSPECT


def test_stale_suspect_is_ignored_and_newer_suspect_restarts_suspicion(make, clock: FakeClock) -> None:
    m = make(peers=9)
    m.apply(alive("n0", 3))
    assert not m.apply(claim("n0", State.SUSPECT, 2))
    assert m.apply(claim("n0", State.SUSPECT, 3, by="n1"))
    clock.now += 10
    assert m.apply(claim("n0", State.SUSPECT, 4, by="n2"))   # the member refuted meanwhile; suspected again
    assert m.get("n0").incarnation == 4
    clock.now += m.suspicion_timeout(0) - 1
    assert m.tick() == []


def test_dead_member_stays_in_table_and_revives_at_higher_incarnation(make) -> None:
    m = make(peers=2)
    assert m.apply(claim("n0", State.DEAD, 0))
    assert m.counts()[State.DEAD] == 1 and m.get("n0").state == State.DEAD
    assert not m.apply(claim("n0", State.SUSPECT, 0)) and not m.apply(claim("n0", State.LEFT, 0))
    assert not m.apply(alive("n0", 0))
    assert m.apply(alive("n0", 1))
    assert m.get("n0").state == State.ALIVE
    assert "n0" in [m.next_probe().node for _ in range(2)]


def test_left_member_is_not_probed_or_refuted(make) -> None:
    m = make(peers=2)
    assert m.apply_leave("n0", 0)
    assert m.get("n0").state == State.LEFT and queued(m, "n0") == claim("n0", State.LEFT, by="n0")
    assert not m.apply(claim("n0", State.DEAD, 0))
    assert [m.next_probe().node for _ in range(4)] == ["n1"] * 4
    update = m.leave()
    assert update == MemberUpdate("a", "10.0.0.1:7946", "http://10.0.0.1:8000", State.LEFT, 1, "a")
    assert queued(m, "a") == update and m.counts()[State.LEFT] == 2
    assert not m.apply(claim("a", State.DEAD, 1))
    assert m.incarnation == 1 and m.get("a").state == State.LEFT


def test_update_retransmitted_at_most_limit_times(make) -> None:
    m = make(peers=9, retransmit_mult=3)                      # n = 10: limit = 3 * ceil(log10(11)) = 6
    m.sent(m.pending())                                       # the joins
    m.sent(m.pending())
    m.probe_failed("n0")
    (update,) = [u for u in m.pending() if u.node == "n0"]
    sends = 0
    while queued(m, "n0") is not None:
        m.sent([update])
        sends += 1
    assert sends == 6


def test_newer_claim_replaces_queued_older_claim(make) -> None:
    m = make(peers=3)
    first = queued(m, "n0")
    m.sent([first, first])
    m.apply(claim("n0", State.SUSPECT, 0, by="n1"))
    assert [u for u in m.pending() if u.node == "n0"] == [claim("n0", State.SUSPECT, by="n1")]
    assert m.pending()[0].node == "n0"                        # its count started again: newest among the unsent
    m.sent([first])                                           # a stale acknowledgement changes nothing
    assert m.pending()[0] == claim("n0", State.SUSPECT, by="n1")


def test_pending_lists_least_transmitted_first_newest_on_ties(make) -> None:
    m = make(peers=3)
    assert [u.node for u in m.pending()] == ["n2", "n1", "n0"]
    m.sent([queued(m, "n2")])
    assert [u.node for u in m.pending()] == ["n1", "n0", "n2"]


def test_every_member_probed_once_per_round(make) -> None:
    m = make(peers=7)
    rounds = [[m.next_probe().node for _ in range(7)] for _ in range(3)]
    for probed in rounds:
        assert sorted(probed) == [f"n{i}" for i in range(7)]
    assert len({tuple(r) for r in rounds}) > 1                # reshuffled between rounds


def test_probe_round_skips_dead_members_and_includes_new_ones(make) -> None:
    m = make(peers=4)
    first = m.next_probe().node
    rest = [n for n in ("n0", "n1", "n2", "n3") if n != first]
    m.apply(claim(rest[0], State.DEAD, 0))
    m.apply(alive("new"))
    probed = [m.next_probe().node for _ in range(3)]
    assert sorted(probed) == sorted([*rest[1:], "new"])
    assert m.next_probe() is not None


def test_next_probe_is_none_when_alone(make) -> None:
    m = make(peers=1)
    m.apply(claim("n0", State.DEAD, 0))
    assert m.next_probe() is None
    assert make().next_probe() is None


def test_helpers_exclude_target_and_suspects(make) -> None:
    m = make(peers=6)
    m.probe_failed("n1")
    m.apply(claim("n2", State.DEAD, 0))
    seen: Counter[str] = Counter()
    for _ in range(50):
        helpers = m.helpers("n0", 2)
        assert len(helpers) == 2 and len({h.node for h in helpers}) == 2
        seen.update(h.node for h in helpers)
    assert set(seen) == {"n3", "n4", "n5"}
    assert {h.node for h in m.helpers("n0", 10)} == {"n3", "n4", "n5"}
    assert m.helpers("n0", 0) == []


def test_probe_failed_ignores_unknown_dead_and_self(make) -> None:
    m = make(peers=1)
    m.apply(claim("n0", State.DEAD, 0))
    m.sent(m.pending())
    for node in ("n0", "zz", "a"):
        m.probe_failed(node)
    assert m.get("n0").state == State.DEAD and m.get("a").state == State.ALIVE and m.get("zz") is None


def test_snapshot_lists_self_first_claimed_by_self(make) -> None:
    m = make(peers=2)
    m.probe_failed("n1")
    snapshot = m.snapshot()
    assert snapshot[0] == MemberUpdate("a", "10.0.0.1:7946", "http://10.0.0.1:8000", State.ALIVE, 0, "a")
    assert {(u.node, u.state, u.by) for u in snapshot[1:]} == {("n0", State.ALIVE, "a"), ("n1", State.SUSPECT, "a")}


def test_member_update_carries_its_claim() -> None:
    member = Member("b", "b:1", "http://b", State.SUSPECT, 2, 0.0)
    assert member.update("c") == MemberUpdate("b", "b:1", "http://b", State.SUSPECT, 2, "c")


def test_a_member_dead_for_long_is_forgotten_after_the_reconnect_timeout_and_may_join_again(make, clock) -> None:
    m = make(peers=2, reconnect_timeout_s=600.0)
    m.apply(claim("n1", State.DEAD))
    clock.now += 600.0 - 0.01
    m.tick()
    assert m.get("n1").state is State.DEAD and [d.node for d in m.dead()] == ["n1"]
    clock.now += 0.02
    m.tick()
    assert m.get("n1") is None and "n1" not in [u.node for u in m.pending()]
    assert m.get("n0").state is State.ALIVE
    assert m.apply(alive("n1", 0))                  # back under the same id: a new member


def test_a_dead_member_outlives_the_left_reap_so_a_partition_can_still_heal(make, clock: FakeClock) -> None:
    from inferd.cluster.membership import REAP_AFTER_PROBES

    m = make(peers=2)
    m.apply(claim("n0", State.DEAD))
    m.apply(claim("n1", State.LEFT))
    clock.now += REAP_AFTER_PROBES * m.config.probe_interval_s + 1
    m.tick()
    assert m.get("n1") is None                      # left: gone after the old reap
    assert m.get("n0").state is State.DEAD and m.dead() == [m.get("n0")]    # dead: kept for reconnect_timeout_s


def test_both_sides_of_a_healed_partition_take_each_others_refutation(clock: FakeClock) -> None:
    """A holds B dead at incarnation i and B holds A dead: A's table reaches B (a push-pull), B refutes at
    i + 1 and B's reply makes A take B alive; A refutes B's claim about it, and B takes that."""
    config = ClusterConfig()
    a = Membership("A", "10.0.0.1:1", "http://a", config, clock=clock)
    b = Membership("B", "10.0.0.2:1", "http://b", config, clock=clock)
    a.apply(b.snapshot()[0])
    b.apply(a.snapshot()[0])
    assert a.take_arrivals() == ["B"]
    for viewer, other in ((a, b), (b, a)):
        viewer.probe_failed(other.node_id)
        clock.now += viewer.suspicion_timeout(0)
        assert viewer.tick() == [other.node_id]
    assert a.get("B").state is State.DEAD and b.get("A").state is State.DEAD
    dead_at = a.get("B").incarnation
    for update in a.snapshot():                     # A's push-pull to B
        b.apply(update)
    assert b.incarnation == dead_at + 1 and b.stats.refutations == 1
    assert b.get("A").state is State.DEAD           # A's alive claim at the incarnation B holds it dead: not enough
    for update in b.snapshot():                     # B's reply
        a.apply(update)
    assert a.get("B").state is State.ALIVE and a.get("B").incarnation == dead_at + 1
    assert a.incarnation == 1 and a.stats.refutations == 1 and a.take_arrivals() == ["B"]
    for update in a.pending():                      # A's refutation piggybacks on its next datagram to B
        b.apply(update)
    assert b.get("A").state is State.ALIVE and b.get("A").incarnation == 1
    assert (a.stats.suspicions, a.stats.deaths, b.stats.suspicions, b.stats.deaths) == (1, 1, 1, 1)


def test_arrivals_are_new_members_and_members_back_from_dead(make) -> None:
    m = make()
    m.apply(alive("n0"))
    m.apply(alive("n1"))
    assert m.take_arrivals() == ["n0", "n1"] and m.take_arrivals() == []
    m.apply(alive("n0", 1))                         # alive again at a higher incarnation: not an arrival
    m.apply(claim("n1", State.DEAD))
    m.apply(alive("n1", 1))
    assert m.take_arrivals() == ["n1"]


def test_queue_depth_counts_waiting_claims(make) -> None:
    m = make(peers=3)
    assert m.queue_depth() == 3
    m.sent(m.pending() * 100)
    assert m.queue_depth() == 0
