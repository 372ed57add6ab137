"""The front middleware: request ids, and every kind of bad input answered in the OpenAI envelope."""
from __future__ import annotations

import asyncio
import json
import logging

import pytest

from inferd.engine.sim.engine import SimEngine
from inferd.observability.log import JsonFormatter

GOOD = {"model": "sim", "prompt": "hi", "max_tokens": 2}


async def post(served, body: bytes | dict, path: str = "/v1/completions", **kwargs):
    kw = {"json": body} if isinstance(body, dict) else {"data": body, "headers": {"Content-Type": "application/json"}}
    kw.update(kwargs)
    async with served.http.post(served.base_url + path, **kw) as resp:
        return resp.status, await resp.json(content_type=None), resp.headers


def assert_envelope(payload: dict) -> dict:
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize("body,status,param", [
    (b'{"model": "sim", "prompt": ', 400, None),                  # malformed JSON
    (b'{"model": "sim", "prompt": "\xc3\x28"}', 400, None),        # invalid UTF-8
    (b'{"prompt": "x"}', 400, "model"),                            # missing field
    (b'{"model": "sim", "prompt": 5}', 400, "prompt"),             # wrong type
    (b'{"model": "sim", "prompt": ""}', 400, "prompt"),            # empty prompt
    (b'{"model": "sim", "prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
    (b'{"model": "sim", "prompt": "x", "max_tokens": 100000}', 400, "max_tokens"),
    (b'{"model": "sim", "prompt": "x", "stream": "yes"}', 400, "stream"),
    (b'{"model": "nope", "prompt": "x"}', 404, "model"),
    (b'null', 400, None),
])
async def test_bad_bodies_get_a_clear_4xx_envelope(served, body, status, param):
    got, payload, headers = await post(served, body)
    assert got == status
    assert assert_envelope(payload)["param"] == param
    assert headers["X-Request-Id"].startswith("req-")


async def test_body_over_the_limit_is_413_by_length_and_while_reading(serve):
    served = await serve(max_body_bytes=1000)
    big = b'{"model": "sim", "prompt": "' + b"x" * 2000 + b'"}'
    status, payload, _ = await post(served, big)
    assert status == 413 and "1000" in assert_envelope(payload)["message"]

    async def chunked():                  # no Content-Length: the limit holds while reading
        for i in range(0, len(big), 100):
            yield big[i:i + 100]
    status, payload, _ = await post(served, chunked())
    assert status == 413
    assert (await post(served, GOOD))[0] == 200


async def test_non_json_content_type_is_415(served):
    status, payload, _ = await post(served, b"model=sim", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 415 and assert_envelope(payload)["code"] == "unsupported_media_type"


async def test_unknown_route_and_wrong_method_use_the_envelope(served):
    async with served.http.get(served.base_url + "/v1/nothing") as resp:
        assert resp.status == 404
        assert_envelope(await resp.json())
    async with served.http.get(served.base_url + "/v1/completions") as resp:
        assert resp.status == 405 and "POST" in resp.headers["Allow"]
        assert_envelope(await resp.json())


async def test_well_formed_request_id_is_kept_and_bad_one_replaced(served):
    _, _, headers = await post(served, GOOD, headers={"X-Request-Id": "client-42:a.b"})
    assert headers["X-Request-Id"] == "client-42:a.b"
    _, _, headers = await post(served, GOOD, headers={"X-Request-Id": "bad id with spaces"})
    assert headers["X-Request-Id"].startswith("req-")
    _, _, headers = await post(served, GOOD, headers={"X-Request-Id": "x" * 129})
    assert headers["X-Request-Id"].startswith("req-")


class ExplodingEngine(SimEngine):
    """A sim engine with a bug in submit: the API must hide it behind a 500 envelope."""

    def submit(self, request):
        raise RuntimeError("secret internal detail")


async def test_unexpected_error_is_a_500_envelope_with_request_id_and_no_traceback(serve):
    served = await serve({"sim": ExplodingEngine("tiny", time_scale=0.0, max_model_len=512)})
    async with served.http.post(served.base_url + "/v1/completions", json=GOOD) as resp:
        raw = await resp.read()
        assert resp.status == 500
        rid = resp.headers["X-Request-Id"]
    assert b"secret" not in raw and b"Traceback" not in raw
    assert rid in assert_envelope(json.loads(raw))["message"]


async def test_flood_of_malformed_requests_leaves_the_daemon_serving(served):
    bad = [b"{", b'{"model": 1}', b'{"model": "sim", "prompt": "x", "n": 17}', b"\xff\xfe", b"[]",
           b'{"model": "sim", "messages": "no"}', b'{"model": "sim", "prompt": [1, "a", [2]]}']
    paths = ["/v1/completions", "/v1/chat/completions"]
    results = await asyncio.gather(*(post(served, bad[i % len(bad)], path=paths[i % 2]) for i in range(200)))
    assert {status for status, _, _ in results} == {400}
    assert all(assert_envelope(payload) for _, payload, _ in results)
    resp = await served.sdk.completions.create(model="sim", prompt="still here", max_tokens=3)
    assert resp.usage.completion_tokens == 3
    assert served.state.in_flight == 0


async def test_a_long_path_is_logged_cut_to_256_characters_with_how_much_was_cut(served, caplog):
    caplog.set_level(logging.INFO)
    path = "/v1/models/" + "a" * 7_989            # 8,000 characters, as a client may send
    async with served.http.get(served.base_url + path) as resp:
        assert resp.status == 404
    [line] = [r for r in caplog.records if r.getMessage() == "request"]
    assert line.fields["path"] == path[:256] + "...(+7744 chars)"
    assert len(JsonFormatter().format(line)) < 1_000            # not the 8 KB a line carried before
    async with served.http.get(served.base_url + "/v1/models") as resp:
        assert resp.status == 200
    assert [r for r in caplog.records if r.getMessage() == "request"][-1].fields["path"] == "/v1/models"
