"""Background work the daemon runs through its own API: the Batch API's runner."""
from __future__ import annotations

from inferd.jobs.batch_runner import BatchRunner, listener_url

__all__ = ["BatchRunner", "listener_url"]
