import pytest

from inferd.config import PriorityClass, SloConfig
from inferd.slo.events import RequestOutcome, judge, matches


def slo(sli, threshold_ms=None, **kw):
    return SloConfig(model="small", sli=sli, objective=0.99, threshold_ms=threshold_ms, **kw)


def outcome(status=200, **kw):
    base = dict(requested="small", model="small", priority=PriorityClass.STANDARD, status=status, streamed=False)
    return RequestOutcome(**{**base, **kw})


def test_ttft_is_good_within_the_threshold_and_no_event_without_a_token():
    s = slo("ttft", 500)
    assert judge(s, outcome(ttft_s=0.4)) is True
    assert judge(s, outcome(ttft_s=0.6)) is False
    assert judge(s, outcome(status=503)) is None


def test_itl_judges_the_mean_gap():
    s = slo("itl", 50)
    assert judge(s, outcome(itl_s=0.049)) is True
    assert judge(s, outcome(itl_s=0.051)) is False
    assert judge(s, outcome(itl_s=None)) is None


@pytest.mark.parametrize("status,expected", [(200, True), (500, False), (503, False), (504, False),
                                              (429, None), (400, None), (401, None), (499, None)])
def test_availability_counts_server_errors_and_skips_refusals_and_departures(status, expected):
    assert judge(slo("availability"), outcome(status)) is expected


def test_stream_completion_counts_only_streams_whose_headers_went_out():
    s = slo("stream_completion")
    assert judge(s, outcome(200, streamed=True)) is True
    assert judge(s, outcome(504, streamed=True)) is False
    assert judge(s, outcome(200, streamed=False)) is None
    assert judge(s, outcome(499, streamed=True)) is None


def test_an_slo_matches_its_model_or_alias_and_its_class():
    s = slo("availability", priority=PriorityClass.INTERACTIVE)
    assert matches(s, outcome(priority=PriorityClass.INTERACTIVE))
    assert not matches(s, outcome(priority=PriorityClass.BATCH))
    assert matches(slo("availability"), outcome(requested="chat", model="small"))
    assert not matches(slo("availability"), outcome(requested="big", model="big"))


def test_latency_judges_whole_answers_only():
    s = slo("latency", 50)
    assert judge(s, outcome(latency_s=0.049)) is True
    assert judge(s, outcome(latency_s=0.051)) is False
    assert judge(s, outcome(status=504, latency_s=0.01)) is None        # availability's business
    assert judge(s, outcome(latency_s=None)) is None
