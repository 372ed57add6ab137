"""Streaming responses: the SSE writer, waiting streams' heartbeats, and several choices answered as one."""
