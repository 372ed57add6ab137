"""Shared by the metrics tests: an engine that only has `info` and `stats()`, scrape helpers, and the
`engines` / `metrics` fixtures (a Metrics collector reading a mutable dict of such engines)."""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferd.engine.base import EngineInfo, EngineStats
from inferd.observability.metrics import Metrics

SIM_LABELS = {"model": "small", "version": "v1", "backend": "sim"}


class StatsOnlyEngine:
    """What the metrics collector reads of an engine: `info` and `stats()`."""

    def __init__(self, backend: str = "sim", version: str = "v1", used: int = 10, running: int = 2,
                 waiting: int = 1, fail: bool = False) -> None:
        self.info = EngineInfo(backend=backend, model_name="m", version=version, max_model_len=4096,
                               block_size=16, num_kv_blocks=100, max_batch_size=8, max_num_tokens=256,
                               simulated=backend == "sim")
        self.used, self.running, self.waiting, self.fail = used, running, waiting, fail

    def stats(self) -> EngineStats:
        if self.fail:
            raise RuntimeError("engine is gone")
        return EngineStats(running=self.running, waiting=self.waiting, kv_blocks_total=100,
                           kv_blocks_used=self.used, prefix_cache_hit_rate=0.0, step_latency_s=0.01,
                           steps_total=1, prompt_tokens_total=0, generation_tokens_total=0,
                           prefix_cache_hit_tokens_total=0, tokens_per_s=0.0)


@pytest.fixture
def engines():
    return {"small": StatsOnlyEngine()}


@pytest.fixture
def metrics(engines):
    return Metrics(lambda: engines)


def scrape(metrics: Metrics) -> dict[str, list]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    families = text_string_to_metric_families(body.decode())
    return {f.name: f.samples for f in families}


def value(samples, name: str, **labels) -> float:
    matches = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, (name, labels, samples)
    return matches[0]
