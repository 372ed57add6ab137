import random

import pytest

from inferd.config.rollouts import PriceConfig
from inferd.models.version_stats import ShadowRecorder, VersionStats
from inferd.types import ModelVersion

SHADOW = ModelVersion("llama", "cccc3333")


def test_version_stats_keep_bounded_memory_and_a_close_p95():
    stats = VersionStats(capacity=512, price=PriceConfig(prompt_per_1k=1.0, completion_per_1k=3.0),
                         rng=random.Random(3))
    for i in range(20_000):
        stats.record(True, (i % 1000) / 1000, None, 3, 1)
    stats.record(False, 99.0, 99.0, 0, 0)        # a failure's latency is not the version's speed
    assert len(stats.ttft.values) == 512 and stats.itl.p95() is None
    assert abs(stats.ttft.p95() - 0.95) < 0.03
    assert stats.cost_per_1k() == pytest.approx(1.5) and stats.error_rate == pytest.approx(1 / 20_001)


def test_shadow_recorder_keeps_shadow_stats_apart():
    rec = ShadowRecorder(prices={"llama": PriceConfig(prompt_per_1k=1.0)})
    rec.mirrored(SHADOW)
    rec.mirrored(SHADOW)
    rec.dropped(SHADOW)
    rec.record(SHADOW, True, 0.2, 0.01, 100, 20)
    summary = rec.summary()
    assert list(summary) == [str(SHADOW)]
    row = summary[str(SHADOW)]
    assert (row["mirrored"], row["dropped"], row["requests"], row["ttft_p95_s"]) == (2, 1, 1, 0.2)
    assert row["cost_per_1k"] == pytest.approx(100 / 120)
