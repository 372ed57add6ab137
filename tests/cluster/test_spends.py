"""inferd.cluster.spends: peers' spend counts until its period is over, even after the peer is gone."""
from datetime import datetime, timezone

from inferd.cluster.messages import Load, TenantDemand
from inferd.cluster.spends import PeerSpends
from inferd.tenancy.budget import period_start


class WallClock:
    def __init__(self, iso: str) -> None:
        self.t = datetime.fromisoformat(iso).replace(tzinfo=timezone.utc).timestamp()

    def __call__(self) -> float:
        return self.t


def report(tenant: str, spend: float, tokens: int, age_s: float = 0.0) -> Load:
    return Load(age_s=age_s, versions=(), demand=(TenantDemand(tenant=tenant, requests_per_s=0.0, in_flight=0,
                                                               spend=spend, tokens_today=tokens),))


def periods(clock: WallClock) -> tuple[float, float]:
    return period_start(clock(), "month"), period_start(clock(), "day")


def test_every_peers_latest_report_adds_up_and_a_newer_one_replaces_the_older():
    clock = WallClock("2026-11-24T12:00:00")
    spends = PeerSpends(clock)
    spends.heard("a", report("acme", 1.0, 100))
    spends.heard("b", report("acme", 2.0, 200))
    spends.heard("a", report("acme", 1.5, 150))
    assert spends.spend("acme", *periods(clock)) == (3.5, 350)
    assert spends.spend("other", *periods(clock)) == (0.0, 0)


def test_a_peer_that_stopped_reporting_still_counts_until_its_period_is_over():
    clock = WallClock("2026-11-24T23:00:00")
    spends = PeerSpends(clock)
    spends.heard("dead", report("acme", 5.0, 500))
    clock.t += 1800                                 # no news from it for half an hour: still spent
    assert spends.spend("acme", *periods(clock)) == (5.0, 500)
    clock.t += 3600                                 # past midnight: its tokens were yesterday's
    assert spends.spend("acme", *periods(clock)) == (5.0, 0)    # the month's cost still counts
    clock.t = WallClock("2026-12-01T00:30:00")()
    assert spends.spend("acme", *periods(clock)) == (0.0, 0)


def test_a_report_measured_before_the_period_began_is_not_counted_in_it():
    clock = WallClock("2026-11-25T00:00:01")
    spends = PeerSpends(clock)
    spends.heard("a", report("acme", 5.0, 500, age_s=2.0))     # measured at 23:59:59 yesterday
    assert spends.spend("acme", *periods(clock)) == (5.0, 0)


def test_reports_older_than_a_month_are_forgotten():
    clock = WallClock("2026-10-01T00:00:00")
    spends = PeerSpends(clock)
    spends.heard("gone", report("acme", 5.0, 500))
    clock.t += 40 * 86_400
    spends.heard("a", report("acme", 1.0, 10))
    assert list(spends._by_node) == ["a"]
