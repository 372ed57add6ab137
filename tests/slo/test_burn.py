import pytest

from inferd.slo.burn import WINDOWS, BucketRing, BurnCounter


def test_ring_sums_only_the_buckets_inside_the_span():
    ring = BucketRing(10.0, 6)
    ring.add(0.0, True)
    ring.add(15.0, False)
    ring.add(25.0, False)
    assert ring.totals(25.0, 10.0) == (0, 1)
    assert ring.totals(25.0, 20.0) == (0, 2)
    assert ring.totals(25.0, 60.0) == (1, 2)


def test_ring_forgets_buckets_older_than_its_span():
    ring = BucketRing(10.0, 6)
    ring.add(0.0, False)
    ring.add(55.0, True)
    assert ring.totals(55.0, 60.0) == (1, 1)
    assert ring.totals(65.0, 60.0) == (1, 0)     # the bucket of t=0 was reused for t=60
    assert ring.totals(1000.0, 60.0) == (0, 0)


def test_ring_sums_across_the_wrap():
    ring = BucketRing(1.0, 4)
    for t in range(10):
        ring.add(float(t), t % 2 == 0)
    assert ring.totals(9.0, 4.0) == (2, 2)
    assert ring.totals(9.0, 3.0) == (1, 2)


def test_ring_refuses_a_useless_shape():
    with pytest.raises(ValueError):
        BucketRing(0, 10)


def test_burn_rate_is_the_bad_fraction_over_the_error_budget():
    c = BurnCounter(error_budget=0.01, window_days=30)
    for i in range(100):
        c.add(1000.0 + i, i >= 2)           # 2 bad of 100
    assert c.burn_rate(1100.0, 300) == pytest.approx(2.0)
    assert c.budget_remaining(1100.0) == pytest.approx(1 - 2.0)   # 2% bad spends twice a 1% budget


def test_short_windows_recover_before_long_ones():
    c = BurnCounter(error_budget=0.001, window_days=30)
    for s in range(0, 600):                  # 10 minutes of total failure
        c.add(float(s), False)
    for s in range(600, 4000):               # then an hour of success
        c.add(float(s), True)
    rates = c.burn_rates(4000.0)
    assert rates["5m"] == 0.0
    assert 0 < rates["1h"] < rates["6h"] == pytest.approx(1000 * 600 / 4000, rel=0.01)
    assert [w for w, _ in WINDOWS] == list(rates)


def test_no_events_burn_nothing_and_keep_the_whole_budget():
    c = BurnCounter(error_budget=0.001, window_days=30)
    assert c.burn_rates(50.0) == {w: 0.0 for w, _ in WINDOWS}
    assert c.budget_remaining(50.0) == 1.0
