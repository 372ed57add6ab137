"""The OpenAI-compatible HTTP/SSE front: `make_app(state)` builds the aiohttp application."""
from __future__ import annotations

from inferd.api.app import make_app
from inferd.api.state import ServerState

__all__ = ["ServerState", "make_app"]
