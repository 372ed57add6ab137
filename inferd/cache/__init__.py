"""The response cache: exact-match generations per tenant, bounded by bytes and age.

`ResponseCache` stores and evicts; `ReplayStream` answers a hit through the normal response path;
`RecordingStream` keeps a streamed miss whole so it can be stored. Which requests may use it and
under what key: inferd.api.pipeline.cached.
"""
from __future__ import annotations

from inferd.cache.replay import RecordingStream, ReplayStream
from inferd.cache.store import ResponseCache

__all__ = ["RecordingStream", "ReplayStream", "ResponseCache"]
