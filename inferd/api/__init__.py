"""The OpenAI-compatible HTTP/SSE front: `make_app(state)` builds the aiohttp application."""
from __future__ import annotations

from inferd.api.app import make_app
from inferd.api.batch_runner import BatchRunner, listener_url
from inferd.api.errors import (
    SERVER_HEADER,
    internal_error_response,
    protocol_error_response,
    too_many_connections_response,
)
from inferd.api.state import ServerState, StoreServices
from inferd.api.state_builder import build_state

__all__ = [
    "SERVER_HEADER", "ServerState", "internal_error_response", "make_app", "protocol_error_response",
    "too_many_connections_response",
]
__all__ += ["BatchRunner", "StoreServices", "build_state", "listener_url"]
