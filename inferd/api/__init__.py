"""The OpenAI-compatible HTTP/SSE front: `make_app(state)` builds the aiohttp application."""
from __future__ import annotations

from inferd.api.app import make_app
from inferd.api.errors import (
    SERVER_HEADER,
    internal_error_response,
    protocol_error_response,
    too_many_connections_response,
)
from inferd.api.pipeline.internal import HEADER as BATCH_CALLER_HEADER
from inferd.api.pipeline.internal import header_value as batch_caller_header
from inferd.api.state import ServerState, StoreServices
from inferd.api.state_builder import build_state
from inferd.api.routes.batch_input import BatchLine, InputError, parse_lines, stored_lines
from inferd.api.routes.batch_output import expired_results, http_result, output_files

__all__ = [
    "BATCH_CALLER_HEADER", "BatchLine", "InputError", "SERVER_HEADER", "ServerState", "StoreServices",
    "batch_caller_header", "build_state", "expired_results", "http_result", "internal_error_response", "make_app",
    "output_files", "parse_lines", "protocol_error_response", "stored_lines", "too_many_connections_response",
]
