import pytest

from inferd.config import PriorityClass, SloConfig
from inferd.slo import RequestOutcome, SloTracker


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


AVAIL = SloConfig(model="small", sli="availability", objective=0.9)
TTFT = SloConfig(model="chat", sli="ttft", objective=0.5, threshold_ms=100)


def done(status, requested="small", ttft=None):
    return RequestOutcome(requested=requested, model="small", priority=PriorityClass.STANDARD, status=status,
                          streamed=False, ttft_s=ttft)


def test_requests_count_in_every_slo_of_their_model_or_alias():
    tracker = SloTracker({"avail": AVAIL, "ttft": TTFT}, clock=Clock())
    tracker.record(done(200, requested="chat", ttft=0.05))
    tracker.record(done(503, requested="chat"))
    tracker.record(done(429))
    snap = {s.name: s for s in tracker.snapshot()}
    assert (snap["avail"].good, snap["avail"].bad) == (1, 1)
    assert (snap["ttft"].good, snap["ttft"].bad) == (1, 0)
    assert snap["avail"].burn_rates["5m"] == pytest.approx(5.0)    # half bad against a 10% budget
    assert snap["avail"].budget_remaining == pytest.approx(-4.0)


def test_a_reload_keeps_unchanged_slos_and_restarts_changed_ones():
    tracker = SloTracker({"avail": AVAIL, "ttft": TTFT}, clock=Clock())
    tracker.record(done(500))
    tracker.record(done(200, requested="chat", ttft=0.5))
    tracker.reconfigure({"avail": AVAIL, "ttft": SloConfig(model="chat", sli="ttft", objective=0.5,
                                                            threshold_ms=1000)})
    snap = {s.name: s for s in tracker.snapshot()}
    assert snap["avail"].bad == 1
    assert snap["ttft"].bad == 0


def test_no_slos_is_false_and_records_nothing():
    tracker = SloTracker({})
    assert not tracker
    tracker.record(done(500))
    assert tracker.snapshot() == []


def test_a_requests_ttft_budget_is_the_tightest_ttft_threshold_on_its_model_alias_and_class():
    tracker = SloTracker({"ttft": TTFT, "avail": AVAIL,
                          "small_fast": SloConfig(model="small", sli="ttft", objective=0.9, threshold_ms=300),
                          "small_vip": SloConfig(model="small", sli="ttft", objective=0.9, threshold_ms=50,
                                                 priority=PriorityClass.INTERACTIVE)}, clock=Clock())
    assert tracker.ttft_budget_s("chat", "small", PriorityClass.STANDARD) == 0.1       # the alias's, tighter
    assert tracker.ttft_budget_s("small", "small", PriorityClass.STANDARD) == 0.3
    assert tracker.ttft_budget_s("small", "small", PriorityClass.INTERACTIVE) == 0.05
    assert tracker.ttft_budget_s("other", "other", PriorityClass.STANDARD) is None
    tracker.reconfigure({"avail": AVAIL})
    assert tracker.ttft_budget_s("chat", "small", PriorityClass.STANDARD) is None
