"""inferd.api.pipeline.timeline: each part of a request is booked to the stage it happened in."""
from __future__ import annotations

from inferd.api.pipeline.timeline import ADMISSION, Timeline
from inferd.types import EngineTiming
from tests.api.conftest import metric_value, sim_engine
from tests.api.streaming.test_waiting import hold_the_only_slot


def durations(header: str) -> dict[str, float]:
    """`Server-Timing` as {stage: milliseconds}."""
    out = {}
    for part in header.split(", "):
        name, _, dur = part.partition(";dur=")
        out[name] = float(dur)
    return out


def test_stages_split_the_request_at_the_pipeline_marks_and_the_engine_stamps():
    timeline = Timeline(arrival=10.0)
    timeline.mark(ADMISSION, at=10.5)
    timing = EngineTiming(submitted=12.0, first_scheduled=12.25, first_token=13.0, finished=15.0)
    assert timeline.stages(timing, now=15.5) == {
        "api": (10.0, 10.5), "queue": (10.5, 12.0), "engine_queue": (12.0, 12.25), "prefill": (12.25, 13.0),
        "decode": (13.0, 15.0), "write": (15.0, 15.5)}
    assert timeline.server_timing(timing, now=16.0).endswith("write;dur=1000.000, total;dur=6000.000")


def test_a_request_that_never_reached_the_engine_has_no_stages():
    assert Timeline(arrival=1.0).stages(None, now=2.0) == {}
    assert Timeline(arrival=1.0).server_timing(None, now=2.0) == "total;dur=1000.000"


async def test_a_request_waiting_in_the_fair_queue_books_its_wait_as_queue_not_api(serve):
    served = await serve({"sim": sim_engine(max_batch_size=1, time_scale=1.0)})
    holder = await hold_the_only_slot(served, max_tokens=200)      # the engine's one slot, for a while
    async with served.http.post(served.base_url + "/v1/completions",
                                json={"model": "sim", "prompt": "next", "max_tokens": 2}) as resp:
        assert resp.status == 200
        stages = durations(resp.headers["Server-Timing"])
    assert not holder.done() or holder.result() is None
    await holder
    # it waited for the holder to finish in admission's queue: that wait is `queue`, not `api`
    assert list(stages) == ["api", "queue", "engine_queue", "prefill", "decode", "write", "total"]
    assert stages["queue"] > stages["api"] and stages["queue"] >= 20.0
    # the stage histogram reads the same marks: its queue time holds this request's
    queued_s = metric_value(await served.metrics_text(), "inferd_request_stage_seconds_sum", stage="queue")
    assert queued_s >= stages["queue"] / 1000 - 0.001
