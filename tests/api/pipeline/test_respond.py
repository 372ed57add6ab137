"""inferd.api.pipeline.respond: how a generation's end is recorded, whatever way its stream ends."""
from __future__ import annotations

from types import SimpleNamespace

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.errors import CLIENT_GONE
from inferd.api.pipeline import respond
from inferd.api.pipeline.timeline import Timeline
from inferd.api.streaming.accepted import SocketAccepted
from inferd.api.wire.responses import Identity


class _Request(dict):
    """What the stream stage reads of a request: its keys, and the app's in-flight registry."""

    def __init__(self) -> None:
        super().__init__()
        self.app = {keys.INFLIGHT: None}


async def test_a_stream_whose_client_left_before_its_final_delta_is_recorded_as_client_gone(monkeypatch):
    """The writer noticed the client had gone and returned (the handler was not cancelled): the row
    is the client's 499 with what it got, never a row without a status."""
    recorded = []

    async def record(ctx, final, status, *, withhold=False):
        recorded.append((final, status))

    async def writer_that_saw_the_client_leave(request, stream, entry, *args, **kwargs):
        entry.client_gone = True
        return web.StreamResponse()

    monkeypatch.setattr(respond, "record_usage_once", record)
    monkeypatch.setattr(respond, "stream_response", writer_that_saw_the_client_leave)
    ctx = SimpleNamespace(
        prepared=SimpleNamespace(kind="completion", continuous_usage=False, include_usage=False), prompt_ids=[[1, 2]],
        extras={"ident": Identity("completion", "cmpl-1", 0, "m@v", "fp")}, forwarded=False,
        state=SimpleNamespace(ledger=None), timeline=Timeline(0.0), headers={}, request=_Request(), queued=None,
        log_fields={}, status=None, last=None, obs=None)
    entry = SimpleNamespace(final=None, client_gone=False, failed=False, timed_out=False, accepted=SocketAccepted())
    await respond._stream(ctx, object(), entry)
    assert recorded == [(None, CLIENT_GONE)] and ctx.status == CLIENT_GONE
