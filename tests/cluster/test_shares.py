"""inferd.cluster.shares: each node's share of a tenant's limits, from the demand every live node reports."""
import pytest

from inferd.cluster.loads import PeerLoads
from inferd.cluster.messages import Load, TenantDemand
from inferd.cluster.shares import FLOOR, REFRESH_S, QuotaShares


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def shares_of(mine: dict, peers: dict[str, dict], live=None, clock=None):
    clock = clock or Clock()
    loads = PeerLoads(max_age_s=3.0, clock=clock)
    for node, demand in peers.items():
        loads.heard(node, Load(age_s=0.0, versions=(), demand=tuple(TenantDemand(t, r, 0) for t, r in demand.items())))
    shares = QuotaShares(loads, lambda: list(peers) if live is None else live, clock)
    shares.reported(TenantDemand(t, r, 0) for t, r in mine.items())
    return shares, loads, clock


def test_equal_demand_on_three_nodes_gives_each_a_third():
    share, _, _ = shares_of({"acme": 5.0}, {"b": {"acme": 5.0}, "c": {"acme": 5.0}})
    assert share("acme") == pytest.approx(1 / 3)


def test_shares_follow_demand_and_the_live_nodes_shares_sum_to_one():
    demand = {"a": {"acme": 8.0}, "b": {"acme": 2.0}, "c": {}}
    total = 0.0
    for node in demand:
        share, _, _ = shares_of(demand[node], {n: d for n, d in demand.items() if n != node})
        total += share("acme")
        if node == "a":
            assert share("acme") > 0.75
    assert total == pytest.approx(1.0)


def test_a_tenant_nobody_reported_is_split_equally():
    share, _, _ = shares_of({}, {"b": {}, "c": {}})
    assert share("newcomer") == pytest.approx(1 / 3)


def test_a_stale_or_dead_peer_counts_for_nothing_and_alone_a_node_takes_the_whole_limit():
    share, _, clock = shares_of({"acme": 1.0}, {"b": {"acme": 1.0}})
    assert share("acme") == pytest.approx(0.5)
    clock.t += 4 + REFRESH_S                      # b's report is stale now
    assert share("acme") == 1.0
    dead, _, _ = shares_of({"acme": 1.0}, {"b": {"acme": 1.0}}, live=[])
    assert dead("acme") == 1.0


def test_a_node_counts_its_demand_as_it_reported_it_not_the_live_figure():
    share, _, clock = shares_of({"acme": 1.0}, {"b": {"acme": 1.0}})
    assert share("acme") == pytest.approx(0.5)
    # Requests that arrive after the report change nothing until the next report says so: the peers
    # compute their shares from the reported figure, and the shares must sum to 1.
    clock.t += 2 * REFRESH_S
    assert share("acme") == pytest.approx(0.5)
    share.reported([TenantDemand("acme", 3.0, 0)])
    assert share("acme") == pytest.approx(3.02 / 4.04)


def test_before_its_first_report_a_node_counts_the_floor_as_its_peers_do():
    clock = Clock()
    loads = PeerLoads(max_age_s=3.0, clock=clock)
    loads.heard("b", Load(age_s=0.0, versions=(), demand=(TenantDemand("acme", 1.0, 0),)))
    share = QuotaShares(loads, lambda: ["b"], clock)
    assert share("acme") == pytest.approx(FLOOR / (FLOOR + 1.0 + FLOOR))


def test_an_own_report_as_old_as_a_stale_one_counts_for_the_floor_only():
    share, loads, clock = shares_of({"acme": 5.0}, {"b": {"acme": 1.0}})
    assert share("acme") == pytest.approx(5.02 / 6.04)
    clock.t += 4                                  # no report sent since (no peer was alive), then b's comes
    loads.heard("b", Load(age_s=0.0, versions=(), demand=(TenantDemand("acme", 1.0, 0),)))
    assert share("acme") == pytest.approx(FLOOR / (FLOOR + 1.0 + FLOOR))
