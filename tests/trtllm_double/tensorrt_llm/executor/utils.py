"""Mirrors tensorrt_llm/executor/utils.py: RequestError, ErrorResponse, has_event_loop."""
from __future__ import annotations

import asyncio
from typing import NamedTuple


class RequestError(RuntimeError):
    """A per-request failure; the LLM stays usable."""


class ErrorResponse(NamedTuple):
    client_id: int
    error_msg: str
    request_id: int


def has_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
