"""Mirrors tensorrt_llm/llmapi/utils.py AsyncQueue: an asyncio queue fed from other threads."""
from __future__ import annotations

import asyncio
import collections
import threading


class _SyncQueue:
    """The producer side: `put` from any thread wakes the consumer on its loop."""

    def __init__(self, aq: "AsyncQueue") -> None:
        self._aq = aq

    def put(self, item) -> None:
        self._aq._put_threadsafe(item)

    def put_nowait(self, item) -> None:
        self._aq._put_threadsafe(item)


class AsyncQueue:
    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._items: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._event = asyncio.Event()
        self.sync_q = _SyncQueue(self)

    def _put_threadsafe(self, item) -> None:
        with self._lock:
            self._items.append(item)
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:
            pass  # loop closed: nobody is listening any more

    def put_nowait(self, item) -> None:
        self._put_threadsafe(item)

    async def get(self, timeout: float | None = None):
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                self._event.clear()
            if timeout is None:
                await self._event.wait()
            else:
                await asyncio.wait_for(self._event.wait(), timeout)
