"""inferd.tenancy.budget: spend per UTC day or month, tokens per day, warnings, peers' spend."""
from datetime import datetime, timezone

import pytest

from inferd.config.tenants import TenantConfig, TenantRegistry
from inferd.tenancy.budget import BudgetExceeded, Budgets, period_end, period_start


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


class Clock:
    def __init__(self, when: str) -> None:
        self.t = ts(when)

    def __call__(self) -> float:
        return self.t


def budgets(clock, **tenant) -> Budgets:
    return Budgets(TenantRegistry({"acme": TenantConfig(**tenant)}), clock=clock)


def test_periods_are_utc_days_and_months():
    now = ts("2026-12-31T23:30:00")
    assert period_start(now, "day") == ts("2026-12-31T00:00:00")
    assert period_start(now, "month") == ts("2026-12-01T00:00:00")
    assert period_end(now, "month") == ts("2027-01-01T00:00:00")
    assert period_end(now, "day") == ts("2027-01-01T00:00:00")


def test_a_spent_monthly_budget_refuses_until_the_next_month_and_says_so():
    clock = Clock("2026-11-24T12:00:00")
    b = budgets(clock, max_spend=10.0)
    b.load("acme", 9.5, 0)                      # from the ledger at start
    b.check("acme")
    b.add("acme", 0.5, 100)
    with pytest.raises(BudgetExceeded) as exc:
        b.check("acme")
    assert "monthly budget of 10" in str(exc.value) and "2026-12-01T00:00:00Z" in str(exc.value)
    assert exc.value.retry_after_s == pytest.approx(ts("2026-12-01T00:00:00") - clock.t)
    clock.t = ts("2026-12-01T00:00:01")
    b.check("acme")                             # a new period: nothing spent yet


def test_tokens_per_day_reset_at_midnight_utc():
    clock = Clock("2026-11-24T23:59:00")
    b = budgets(clock, max_tokens_per_day=1000)
    b.add("acme", 0.0, 1000)
    with pytest.raises(BudgetExceeded, match="1000 tokens for today"):
        b.check("acme")
    clock.t += 120
    b.check("acme")


def test_crossing_the_warning_threshold_is_reported_once_a_period():
    clock = Clock("2026-11-24T12:00:00")
    b = budgets(clock, max_spend=10.0, budget_warn_fraction=0.5)
    assert b.add("acme", 4.0, 0) is None
    assert "50%" in b.add("acme", 1.0, 0)
    assert b.add("acme", 1.0, 0) is None
    assert b.snapshot() == {"acme": pytest.approx(0.6)}


def test_peers_spend_counts_towards_the_budget_and_unbudgeted_tenants_are_never_refused():
    clock = Clock("2026-11-24T12:00:00")
    b = budgets(clock, max_spend=10.0)
    b.add("acme", 4.0, 0)
    b.set_peers(lambda tenant, period_start, day_start: (6.0, 0))
    with pytest.raises(BudgetExceeded):
        b.check("acme")
    assert b.own("acme") == (4.0, 0)
    b.add("other", 1e9, 10**9)                  # no budget configured for it
    b.check("other")
    assert b.used("other") is None
