"""Spillover's local reservation: Cluster.peer_with_room counts each peer's hint less the slots this
node's forwards took there since that hint was measured (inferd.cluster.reservations)."""
from inferd.cluster.cluster import Cluster
from inferd.cluster.membership import Member
from inferd.cluster.messages import Load, State, VersionLoad
from inferd.cluster.reservations import MAX_PER_KEY, VISIBLE_AFTER_S, Reservations
from inferd.config import ClusterConfig


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def hint(free_slots: int, wait: float = 0.0, version: str = "v1") -> VersionLoad:
    return VersionLoad(model="m", version=version, ready=True, free_slots=free_slots, free_kv_blocks=100,
                       queued=(0, 0, 0), est_wait_s=wait, tokens_per_s=1000.0)


def cluster_with_peers(clock: Clock, **settings) -> Cluster:
    """A Cluster (not started) whose alive peers are b and c, as peer_with_room sees them."""
    cluster = Cluster(ClusterConfig(key_file="k", load_max_age_s=3.0, **settings), tenancy=None,
                      http_url="http://a", clock=clock)
    peers = [Member(n, f"{n}:1", f"http://{n}", State.ALIVE, 0, clock()) for n in ("b", "c")]
    cluster._alive = lambda: peers
    return cluster


def heard(cluster: Cluster, node: str, free_slots: int, wait: float = 0.0, age_s: float = 0.0) -> None:
    cluster._heard(node, Load(age_s=age_s, versions=(hint(free_slots, wait),), demand=()))


def spread(cluster: Cluster, n: int) -> list[str]:
    """Where `n` forwards in a row go (each reserving its slot, none ended); '-' for none."""
    out = []
    for _ in range(n):
        peer = cluster.peer_with_room("m", "v1")
        if peer is None:
            out.append("-")
            continue
        cluster.reservations.reserve(peer.node, "m", "v1")
        out.append(peer.node)
    return out


def test_a_burst_between_two_hints_is_spread_over_peers_and_stops_at_their_free_slots():
    clock = Clock()
    cluster = cluster_with_peers(clock)
    heard(cluster, "b", free_slots=3)
    heard(cluster, "c", free_slots=2)
    placed = spread(cluster, 7)
    assert placed.count("b") == 3 and placed.count("c") == 2 and placed[5:] == ["-", "-"]
    assert placed[:2] == ["b", "c"] or placed[:2] == ["b", "b"]      # most free first, then alternating


def test_a_forward_that_ended_gives_its_slot_back_before_the_next_hint():
    clock = Clock()
    cluster = cluster_with_peers(clock)
    heard(cluster, "b", free_slots=1)
    held = cluster.reservations.reserve("b", "m", "v1")
    assert cluster.peer_with_room("m", "v1") is None
    held.release()
    held.release()                                   # idempotent
    assert cluster.peer_with_room("m", "v1").node == "b"


def test_a_hint_measured_after_the_peer_took_a_forward_in_shows_it_so_it_is_not_counted_twice():
    clock = Clock()
    cluster = cluster_with_peers(clock)
    heard(cluster, "b", free_slots=2)
    clock.t += 0.01
    cluster.reservations.reserve("b", "m", "v1").answered()     # a stream: the peer answered at once
    clock.t += 0.05
    cluster.reservations.reserve("b", "m", "v1")                # unary: no answer until it ends
    assert cluster.peer_with_room("m", "v1") is None
    clock.t += 0.1
    heard(cluster, "b", free_slots=1)       # measured after the first was answered, too soon for the second
    assert cluster.peer_with_room("m", "v1") is None
    clock.t += VISIBLE_AFTER_S
    heard(cluster, "b", free_slots=1)       # the peer has had the second in long enough: this shows both
    assert cluster.peer_with_room("m", "v1").node == "b"


def test_a_forward_the_last_hint_showed_running_gives_its_slot_back_when_it_ends():
    clock = Clock()
    cluster = cluster_with_peers(clock)
    held = cluster.reservations.reserve("b", "m", "v1")
    held.answered()
    clock.t += 0.1
    heard(cluster, "b", free_slots=0)                # it runs there: no slot free
    assert cluster.peer_with_room("m", "v1") is None
    clock.t += 0.1
    held.release()                                   # it ended before the next hint
    assert cluster.peer_with_room("m", "v1").node == "b"
    clock.t += 0.5
    heard(cluster, "b", free_slots=1)                # the next hint shows it gone: not credited twice
    cluster.reservations.reserve("b", "m", "v1")
    assert cluster.peer_with_room("m", "v1") is None


def test_a_peer_that_refused_for_room_has_none_until_a_newer_hint():
    clock = Clock()
    cluster = cluster_with_peers(clock)
    heard(cluster, "b", free_slots=4)
    clock.t += 0.1
    cluster.reservations.refused("b", "m", "v1")
    assert cluster.peer_with_room("m", "v1") is None
    clock.t += 0.4
    heard(cluster, "b", free_slots=4, age_s=0.1)
    assert cluster.peer_with_room("m", "v1").node == "b"


def test_a_peer_is_chosen_only_within_the_wait_asked_for_and_a_cold_forward_counts_against_every_version():
    clock = Clock()
    cluster = cluster_with_peers(clock, spill_wait_s=0.25)
    heard(cluster, "b", free_slots=2, wait=0.3)
    heard(cluster, "c", free_slots=1, wait=0.1)
    assert cluster.peer_with_room("m", "v1").node == "c"
    assert cluster.peer_with_room("m", "v1", within_s=0.05) is None
    assert cluster.peer_with_room("m", "v1", within_s=0.5).node == "c"     # shortest wait first
    cluster.reservations.reserve("c", "m", None)                            # a cold forward: the peer routes it
    assert cluster.peer_with_room("m", "v1", within_s=0.5).node == "b"


def test_reservation_state_is_bounded():
    clock = Clock()
    reservations = Reservations(lambda: 3.0, clock)
    held = [reservations.reserve("b", "m", "v1") for _ in range(MAX_PER_KEY + 10)]
    assert reservations.in_flight() == MAX_PER_KEY
    for r in held:
        r.release()
    assert reservations.in_flight() == 0
    for node in ("b", "c", "d"):
        reservations.refused(node, "m", "v1")
        clock.t += 2.0
    assert len(reservations._refused) == 2           # the first mark is older than every fresh hint


def test_what_ended_is_forgotten_once_every_fresh_hint_is_newer_even_for_a_peer_gone_since():
    clock = Clock()
    reservations = Reservations(lambda: 3.0, clock)
    for node in ("gone", "b"):
        held = reservations.reserve(node, "m", "v1")
        held.answered()
        clock.t += 1.0
        held.release()
    assert set(k[0] for k in reservations._ended) == {"gone", "b"}
    clock.t += 5.0
    held = reservations.reserve("c", "m", "v1")
    held.answered()
    clock.t += 1.0
    held.release()
    assert set(k[0] for k in reservations._ended) == {"c"}
