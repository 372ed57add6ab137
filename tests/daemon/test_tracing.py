"""[tracing] through the real daemon: spans per stage reach an OTLP/HTTP collector (a fake one on
loopback, decoding the real protobuf), as children of the caller's W3C traceparent."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from tests.daemon.harness import running, sim_model, write_config

trace_pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2",
                               reason="the tracing extra is not installed: pip install 'inferd[tracing]'")

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


async def collector() -> tuple[web.AppRunner, str, list]:
    spans: list = []

    async def traces(request: web.Request) -> web.Response:
        export = trace_pb.ExportTraceServiceRequest.FromString(await request.read())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
        return web.Response(body=trace_pb.ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/v1/traces", spans


async def test_a_completion_is_traced_per_stage_under_the_callers_trace(tmp_path):
    runner, endpoint, spans = await collector()
    try:
        path = write_config(tmp_path / "c.toml", {"small": sim_model()}, f'[tracing]\nendpoint = "{endpoint}"\n')
        async with running(path) as (daemon, url):
            async with aiohttp.ClientSession() as http:
                headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
                async with http.post(url + "/v1/completions", headers=headers,
                                     json={"model": "small", "prompt": "hi", "max_tokens": 4}) as resp:
                    assert resp.status == 200
            assert await asyncio.to_thread(daemon.state.tracing.force_flush)
    finally:
        await runner.cleanup()
    by_name = {s.name: s for s in spans}
    root = by_name["inferd /v1/completions"]
    assert root.trace_id.hex() == CALLER_TRACE and root.parent_span_id.hex() == CALLER_SPAN
    stages = ["api", "queue", "prefill", "decode"]
    assert all(by_name[n].parent_span_id == root.span_id and by_name[n].trace_id == root.trace_id for n in stages)
    times = [(by_name[n].start_time_unix_nano, by_name[n].end_time_unix_nano) for n in stages]
    assert root.start_time_unix_nano <= times[0][0] and times[-1][1] <= root.end_time_unix_nano
    assert all(a[1] <= b[0] + 1000 for a, b in zip(times, times[1:]))     # one after the other (1 us rounding)
    attributes = {a.key: a.value for a in root.attributes}
    assert attributes["http.response.status_code"].int_value == 200
    assert attributes["inferd.model"].string_value == "small"


async def test_without_tracing_nothing_of_opentelemetry_is_built(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model()})
    async with running(path) as (daemon, _):
        assert daemon.state.tracing is None


async def test_a_request_refused_after_routing_still_ends_its_span_with_its_status(tmp_path):
    runner, endpoint, spans = await collector()
    try:
        extra = f'[tracing]\nendpoint = "{endpoint}"\n[tenants.local]\ntokens_per_minute = 60\n'
        path = write_config(tmp_path / "c.toml", {"small": sim_model()}, extra)
        async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
            statuses = []
            for _ in range(10):             # each charges prompt + max_tokens: the bucket empties
                async with http.post(url + "/v1/completions",
                                     json={"model": "small", "prompt": "hi", "max_tokens": 20}) as resp:
                    statuses.append(resp.status)
                if resp.status == 429:
                    break
            assert statuses[-1] == 429
            assert await asyncio.to_thread(daemon.state.tracing.force_flush)
    finally:
        await runner.cleanup()
    roots = [s for s in spans if s.name == "inferd /v1/completions"]
    codes = [{a.key: a.value for a in s.attributes}["http.response.status_code"].int_value for s in roots]
    assert sorted(codes) == sorted(statuses)
