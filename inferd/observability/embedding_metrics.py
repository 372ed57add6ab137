"""Unary (embedding) batcher series: batch size and fill, how long batches waited to close,
their compute time, and deadline misses, per loaded model version (labels as every model series)."""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
FILL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
WAIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
COMPUTE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class EmbeddingMetrics:
    def __init__(self, registry: CollectorRegistry, labels: tuple[str, ...]) -> None:
        self.batch_size = Histogram("inferd_embedding_batch_size", "Requests per embedding batch", labels,
                                    buckets=BATCH_SIZE_BUCKETS, registry=registry)
        self.batch_fill = Histogram("inferd_embedding_batch_fill_ratio", "Embedding batch fill: the larger of "
                                    "requests / max_batch_size and tokens / max_num_tokens", labels,
                                    buckets=FILL_BUCKETS, registry=registry)
        self.batch_wait = Histogram("inferd_embedding_batch_wait_seconds", "How long a batch's oldest request "
                                    "waited for the batch to close", labels, buckets=WAIT_BUCKETS, registry=registry)
        self.compute = Histogram("inferd_embedding_compute_seconds", "Compute time of one embedding batch", labels,
                                 buckets=COMPUTE_BUCKETS, registry=registry)
        self.deadline_misses = Counter("inferd_embedding_deadline_misses", "Embedding requests that missed their "
                                       "deadline: dropped before compute (could not make it) or answered late",
                                       (*labels, "reason"), registry=registry)

    def observers(self, labels: tuple[str, ...]) -> tuple[Callable, Callable[[int], None]]:
        """(batch observer, dropped-requests observer) for one engine's label values."""
        size, fill = self.batch_size.labels(*labels), self.batch_fill.labels(*labels)
        wait, compute = self.batch_wait.labels(*labels), self.compute.labels(*labels)
        late, dropped = self.deadline_misses.labels(*labels, "late"), self.deadline_misses.labels(*labels, "dropped")

        def batch(record) -> None:      # an inferd.engine.unary.BatchRecord
            size.observe(record.size)
            fill.observe(record.fill)
            wait.observe(record.wait_s)
            compute.observe(record.compute_s)
            if record.late:
                late.inc(record.late)

        return batch, dropped.inc
