"""inferd.models.prewarm's schedule arithmetic; the lifecycle itself, and a schedule firing, run through the
real daemon in tests/models/test_memory_budget.py."""
from __future__ import annotations

from inferd.config.root import ModelConfig
from inferd.models.prewarm import next_prewarm
from inferd.models.specs import VersionSpec

DAY = 86400


def specs(**times: list[str]) -> dict:
    return {(name, "latest"): VersionSpec(name, "latest", ModelConfig(backend="sim", prewarm_at=tuple(at)))
            for name, at in times.items()}


def test_the_next_prewarm_is_the_soonest_time_of_day_after_now_across_models():
    now = 10 * DAY + 9 * 3600           # 09:00 UTC
    assert next_prewarm(specs(a=["08:00", "17:30"], b=["12:00"]), now) == (10 * DAY + 12 * 3600, [("b", "latest")])
    assert next_prewarm(specs(a=["08:00"]), now) == (11 * DAY + 8 * 3600, [("a", "latest")])   # tomorrow
    at, keys = next_prewarm(specs(a=["12:00"], b=["12:00"]), now)
    assert keys == [("a", "latest"), ("b", "latest")]
    assert next_prewarm(specs(a=["09:00"]), now)[0] == 11 * DAY + 9 * 3600     # now itself is past
    assert next_prewarm(specs(a=[]), now) is None
