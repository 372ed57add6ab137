"""The refusal pacer (inferd.tenancy.refusals) on a clock the test moves: refused bytes become a tenant's
debt, paid off at the rate; over the burst, requests wait their turn or are refused (Paced)."""
from __future__ import annotations

import pytest

from inferd.tenancy.refusals import MAX_WAITING, MIN_CHARGE_BYTES, NO_TURN, Paced, Pacer

RATE, BURST = 100_000, 50_000        # bytes/s and bytes: 0.5 s of debt allowed before pacing
LIMIT = 1 << 20                      # server.max_body_bytes


def pacer(now: list[float], **kwargs) -> Pacer:
    return Pacer(RATE, BURST, clock=lambda: now[0], **kwargs)


def enter(p: Pacer, tenant: str, content_length: int | None):
    return p.enter(tenant, content_length, LIMIT)


def refuse(p: Pacer, tenant: str, nbytes: int, status: int = 400) -> None:
    turn, wait = enter(p, tenant, nbytes)
    assert wait == 0
    turn.refused(status, nbytes)
    turn.close()


def test_a_tenant_under_its_burst_never_waits_and_valid_requests_cost_nothing():
    now = [100.0]
    p = pacer(now)
    for _ in range(100):                 # valid requests: entered and closed, never refused
        turn, wait = enter(p, "a", 900_000)
        assert wait == 0
        turn.close()
    assert p.debt_s("a") == 0
    refuse(p, "a", 40_000)               # 0.4 s of debt: under the 0.5 s burst
    assert enter(p, "a", 10)[1] == 0
    assert p.debt_s("a") == pytest.approx(0.4)


def test_over_the_burst_the_next_request_waits_until_the_debt_is_back_under_it():
    now = [100.0]
    p = pacer(now)
    refuse(p, "a", 80_000)               # 0.8 s of debt; 0.3 s over the burst
    turn, wait = enter(p, "a", 20_000)
    assert wait == pytest.approx(0.3)
    assert enter(p, "b", 20_000)[1] == 0  # another tenant is not paced
    assert p.delayed == {"a": 1}
    now[0] += wait
    turn.close()                         # it passed its checks: its reservation goes back
    assert p.debt_s("a") == pytest.approx(0.5)


def test_concurrent_paced_requests_are_spread_out_by_what_they_reserve():
    now = [100.0]
    p = pacer(now)
    refuse(p, "a", 60_000)               # 0.1 s over the burst
    waits = [enter(p, "a", 100_000)[1] for _ in range(4)]   # each reserves 1 s
    assert waits == pytest.approx([0.1, 1.1, 2.1, 3.1])


def test_a_paced_request_that_is_refused_pays_its_real_size_not_its_reservation_twice():
    now = [100.0]
    p = pacer(now)
    refuse(p, "a", 60_000)
    turn, wait = enter(p, "a", 30_000)    # reserves 0.3 s
    now[0] += wait                       # 0.1 s later: the debt is back to the burst, +0.3 reserved
    turn.refused(400, 50_000)            # it was 50 KB after all (chunked, say): 0.2 s more
    turn.close()
    assert p.debt_s("a") == pytest.approx(0.5 + 0.5)
    assert p.refused_bytes == {"a": 110_000}


def test_a_turn_further_than_the_longest_wait_is_refused_with_when_to_retry():
    now = [100.0]
    p = pacer(now, max_wait_s=2.0)
    refuse(p, "a", 300_000)              # 3 s of debt: 2.5 s over the burst
    with pytest.raises(Paced) as exc:
        enter(p, "a", 10)
    assert exc.value.retry_after_s == pytest.approx(2.5)
    assert "Tenant `a`" in str(exc.value) and "retry after 3 s" in str(exc.value)
    now[0] += 1.0                        # 1.5 s over: within the wait
    assert enter(p, "a", 10)[1] == pytest.approx(1.5)


def test_only_the_clients_own_faults_are_charged_and_tiny_ones_count_a_minimum():
    now = [100.0]
    p = pacer(now)
    for status in (401, 409, 429, 500, 503, 504):
        refuse(p, "a", 900_000, status)
    assert p.debt_s("a") == 0 and p.refused_bytes == {}
    for status in (400, 403, 404, 413, 415, 422, 499):      # 499: sent its body, then left
        refuse(p, "b", 1, status)
    assert p.refused_bytes == {"b": 7 * MIN_CHARGE_BYTES}
    turn, _ = enter(p, "c", 10)
    turn.refused(400, 10)
    turn.refused(400, 10)                # reported twice (two handlers' paths): charged once
    turn.close()
    assert p.refused_bytes["c"] == MIN_CHARGE_BYTES


def test_rate_zero_turns_pacing_off_and_a_reload_can_turn_it_on():
    now = [100.0]
    p = Pacer(0, 0, clock=lambda: now[0])
    turn, wait = enter(p, "a", 900_000)
    assert turn is NO_TURN and wait == 0
    turn.refused(400, 900_000)
    assert p.refused_bytes == {}
    p.configure(RATE, BURST)
    refuse(p, "a", 100_000)
    assert enter(p, "a", 10)[1] == pytest.approx(0.5)


def test_a_debt_once_paid_leaves_nothing_behind():
    now = [100.0]
    p = pacer(now)
    refuse(p, "a", 10_000)
    now[0] += 1.0
    turn, wait = enter(p, "a", 10)
    turn.close()
    refuse(p, "a", 10_000)               # counted from now, not from the old debt
    assert p.debt_s("a") == pytest.approx(0.1)


def test_a_claimed_content_length_reserves_at_most_the_largest_body():
    now = [100.0]
    p = pacer(now)
    refuse(p, "a", 60_000)
    turn, wait = enter(p, "a", 10 ** 13)     # a lie: the body can be at most LIMIT (413 beyond)
    assert wait == pytest.approx(0.1)
    assert p.debt_s("a") == pytest.approx(0.6 + LIMIT / RATE)
    turn.close()
    assert p.debt_s("a") == pytest.approx(0.6)


def test_a_tenant_has_at_most_max_waiting_requests_asleep():
    now = [100.0]
    p = Pacer(RATE, BURST, clock=lambda: now[0], max_wait_s=1000.0)
    refuse(p, "a", 60_000)
    turns = [enter(p, "a", 10)[0] for _ in range(MAX_WAITING)]
    with pytest.raises(Paced):
        enter(p, "a", 10)                  # its wait is short, but eight already sleep
    turns[0].waited()                      # one woke up (and is being served)
    turn, wait = enter(p, "a", 10)
    assert wait > 0
    for t in (*turns, turn):
        t.close()


def test_a_reload_that_changes_the_rate_keeps_the_debt_and_reservations_as_they_were():
    now = [100.0]
    p = pacer(now)
    refuse(p, "a", 100_000)                # 1 s of debt
    turn, _ = enter(p, "a", 50_000)        # +0.5 s reserved
    p.configure(RATE / 1000, BURST)        # a reload slows the rate 1000x
    turn.close()                           # gives back 0.5 s, not 500 s
    assert p.debt_s("a") == pytest.approx(1.0)
    p.configure(0, 0)                      # off: no debt, nothing paced
    refuse(p, "a", 100_000)
    assert enter(p, "a", 10) == (NO_TURN, 0.0)
