import pytest

from inferd.config import BreakerConfig, ModelConfig
from inferd.models import BreakerOpen, Breakers
from inferd.types import ModelVersion

V1 = ModelVersion("small", "v1")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Audit:
    def __init__(self):
        self.records = []

    def append(self, actor, action, **fields):
        self.records.append((action, fields))


def breakers(clock, audit=None, **cfg):
    cfg = {"min_requests": 4, "error_rate": 0.5, "window_s": 10, "cooldown_s": 5, "half_open_requests": 2, **cfg}
    return Breakers({"small": ModelConfig(breaker=BreakerConfig(**cfg)), "other": ModelConfig()}, audit=audit,
                    clock=clock)


def fail(b, n, key=V1):
    for _ in range(n):
        b.check(key)
        b.record(key, False, None)


def test_it_opens_once_enough_of_the_window_failed_and_refuses_until_the_cooldown():
    clock, audit = Clock(), Audit()
    b = breakers(clock, audit)
    b.record(V1, True, 0.1)
    b.record(V1, True, 0.1)
    fail(b, 1)
    assert b.open_versions() == {}            # 1 of 3: too few requests, too few failures
    fail(b, 1)                                # 2 of 4 failed
    assert b.open_versions() == {"small@v1": "open"}
    clock.now += 2
    with pytest.raises(BreakerOpen) as exc:
        b.check(V1)
    assert exc.value.retry_after_s == pytest.approx(3)
    action, fields = audit.records[-1]
    assert (action, fields["target"], fields["before"], fields["detail"]["failed"]) == ("breaker.open", "small@v1",
                                                                                       "closed", 2)


def test_half_open_lets_a_few_probes_through_and_closes_on_their_success():
    clock = Clock()
    b = breakers(clock)
    fail(b, 4)
    clock.now += 5
    b.check(V1)
    b.check(V1)                               # two probes
    with pytest.raises(BreakerOpen):
        b.check(V1)                           # a third waits for their results
    assert b.open_versions() == {"small@v1": "half_open"}
    b.record(V1, True, None)
    b.record(V1, True, None)
    assert b.open_versions() == {}
    fail(b, 3)                                # a fresh window: old failures are forgotten
    assert b.open_versions() == {}


def test_a_failed_probe_opens_it_again():
    clock = Clock()
    b = breakers(clock)
    fail(b, 4)
    clock.now += 5
    b.check(V1)
    b.record(V1, False, None)
    with pytest.raises(BreakerOpen):
        b.check(V1)
    assert b.snapshot()[0].transitions == {"closed": 0, "open": 2, "half_open": 1}


def test_probes_that_never_report_are_replaced_after_another_cooldown():
    clock = Clock()
    b = breakers(clock)
    fail(b, 4)
    clock.now += 5
    b.check(V1)
    b.check(V1)                               # both clients leave: no outcome
    clock.now += 5
    b.check(V1)                               # a new probe is allowed


def test_a_slow_first_token_counts_as_a_failure():
    clock = Clock()
    b = breakers(clock, slow_ttft_s=1.0)
    for _ in range(4):
        b.record(V1, True, 2.0)
    assert b.open_versions() == {"small@v1": "open"}


def test_failures_in_an_old_window_do_not_count():
    clock = Clock()
    b = breakers(clock)
    fail(b, 3)
    clock.now += 11
    b.record(V1, True, None)
    fail(b, 1)
    assert b.open_versions() == {}


def test_models_without_a_breaker_table_are_never_refused():
    b = breakers(Clock())
    other = ModelVersion("other", "v1")
    fail(b, 50, other)
    b.check(other)
    assert b.snapshot() == []


def test_a_reload_that_changes_the_breaker_starts_it_afresh():
    clock = Clock()
    b = breakers(clock)
    fail(b, 4)
    b.reconfigure({"small": ModelConfig(breaker=BreakerConfig(min_requests=100))})
    b.check(V1)
    assert b.open_versions() == {}
