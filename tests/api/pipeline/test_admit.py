"""Front-end fairness through the real daemon (inferd.tenancy.refusals): a tenant whose requests keep
being refused as invalid is paced before its next body is read, and other tenants are not.

The pacer's clock is frozen (the test moves it), so the debt is exact; a paced request really sleeps
for its (short) turn.
"""
from __future__ import annotations

import asyncio

import pytest

from tests.api.test_tenancy import metric, node, post

RATE, BURST = 100_000, 50_000          # 0.5 s of refused bytes before pacing
TENANTS = {"a": {}, "b": {}}     # configured: their own metric labels
VALID = {"model": "sim", "prompt": "hi", "max_tokens": 2}


def invalid_body(nbytes: int) -> dict:
    """A request refused with 400 after its body was read and decoded (an unknown parameter), of ~nbytes."""
    return {"model": "sim", "prompt": "x" * nbytes, "max_tokens": 2, "not_a_parameter": 1}


def frozen(n) -> list[float]:
    now = [1000.0]
    n.tenancy.refusals.clock = lambda: now[0]
    return now


async def test_a_tenant_over_its_refused_bytes_waits_its_turn_while_others_are_served_at_once(tmp_path):
    async with node(tmp_path, tenants=TENANTS, refused_bytes_per_s=RATE, refused_burst_bytes=BURST) as n:
        a, b, ops = *await n.inference_keys("a", "b"), n.key("ops", "metrics", "admin")
        await n.tenancy.refresh_keys()
        now = frozen(n)
        for _ in range(2):
            resp = await post(n, a, invalid_body(40_000))
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "not_a_parameter"
        pacer = n.tenancy.refusals
        debt = pacer.debt_s("a")
        assert debt == pytest.approx(0.8, abs=0.01)          # two ~40 KB bodies, paid off at 100 KB/s
        assert (await post(n, b, VALID)).status == 200      # b is not paced
        assert pacer.delayed == {}
        ok = await post(n, a, VALID)                        # a waits ~0.3 s for its turn, then is served
        assert ok.status == 200
        assert pacer.delayed == {"a": 1}
        assert pacer.debt_s("a") == pytest.approx(debt)      # served: its reservation went back
        text = await n.metrics(ops)
        assert metric(text, "inferd_tenant_paced_requests_total", tenant="a") == 1
        assert metric(text, "inferd_tenant_refused_body_bytes_total", tenant="a") > 80_000
        assert metric(text, "inferd_tenant_refused_body_bytes_total", tenant="b") == 0
        now[0] += debt                                      # paid off: no wait
        assert (await post(n, a, VALID)).status == 200
        assert pacer.delayed == {"a": 1}


async def test_a_turn_beyond_the_longest_wait_is_429_before_the_body_is_read(tmp_path):
    async with node(tmp_path, tenants=TENANTS, refused_bytes_per_s=RATE, refused_burst_bytes=BURST) as n:
        a, b, ops = *await n.inference_keys("a", "b"), n.key("ops", "metrics", "admin")
        await n.tenancy.refresh_keys()
        now = frozen(n)
        too_long = await post(n, a, {"model": "sim", "prompt": "x" * 900_000, "max_tokens": 2})
        assert too_long.status == 400                        # context_length_exceeded, from its length alone
        assert (await too_long.json())["error"]["code"] == "context_length_exceeded"
        paced = await post(n, a, invalid_body(900_000))      # 9 s of debt: further than a request may wait
        assert paced.status == 429
        err = (await paced.json())["error"]
        assert err["code"] == "refusals_paced" and err["type"] == "rate_limit_error"
        assert paced.headers["Retry-After"] == "9"           # ceil(9.0 s of debt - 0.5 s of burst)
        assert n.tenancy.refusals.refused_bytes["a"] < 1_000_000   # the paced body was never charged (unread)
        assert (await post(n, b, VALID)).status == 200
        text = await n.metrics(ops)
        assert metric(text, "inferd_tenant_rejections_total", tenant="a", reason="refusals_paced") == 1
        now[0] += 9.0
        assert (await post(n, a, VALID)).status == 200


async def test_pacing_off_never_delays_or_refuses(tmp_path):
    async with node(tmp_path, refused_bytes_per_s=0) as n:
        (a,) = await n.inference_keys("a")
        for _ in range(3):
            assert (await post(n, a, {"model": "sim", "prompt": "x" * 900_000})).status == 400
        assert (await post(n, a, VALID)).status == 200
        assert n.tenancy.refusals.delayed == {} and n.tenancy.refusals.refused_bytes == {}


async def test_embeddings_refusals_count_and_pace_the_same_tenant(tmp_path):
    embed = {"task": "embed", "max_batch_size": 8, "max_num_tokens": 512,
             "sim": {"profile": "tiny", "time_scale": 0.0, "max_model_len": 256}}
    async with node(tmp_path, model=embed, tenants=TENANTS, refused_bytes_per_s=RATE,
                    refused_burst_bytes=BURST) as n:
        a, b = await n.inference_keys("a", "b")
        frozen(n)
        url = n.url + "/v1/embeddings"
        async with n.http.post(url, json={"model": "sim", "input": "x" * 700_000},
                               headers={"Authorization": f"Bearer {a}"}) as resp:
            assert resp.status == 400                       # longer than the context
        async with n.http.post(url, json={"model": "sim", "input": "fine"},
                               headers={"Authorization": f"Bearer {a}"}) as resp:
            assert resp.status == 429 and (await resp.json())["error"]["code"] == "refusals_paced"
        got = await n.sdk(b).embeddings.create(model="sim", input="fine")
        assert len(got.data) == 1


async def test_a_client_that_sends_a_body_and_leaves_before_the_answer_is_charged_for_it(tmp_path):
    from tests.api.pipeline.test_prompt_tokens import CountedEncode

    async with node(tmp_path, tenants=TENANTS, refused_bytes_per_s=RATE, refused_burst_bytes=BURST) as n:
        (a,) = await n.inference_keys("a")
        frozen(n)
        tok = n.daemon.state.engines["sim"].tokenizer        # shared by every sim engine of its vocabulary:
        encode = CountedEncode(tok, block_over=10_000)       # put back below, or later tests block on it
        body = b'{"model": "sim", "max_tokens": 2, "prompt": "' + b"word " * 40_000 + b'"}'
        host, port = n.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + a.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        await encode.blocked_reached(1)          # its prompt is being tokenized: the body was read
        writer.close()                           # and the client leaves (send and forget)

        async def charged() -> None:
            while n.tenancy.refusals.refused_bytes.get("a", 0) < len(body):
                await asyncio.sleep(0.01)        # the handler's cancellation reaches it on the loop

        try:
            await asyncio.wait_for(charged(), 5)
        finally:
            encode.release.set()
            tok.encode = encode._encode
        assert n.tenancy.refusals.refused_bytes["a"] == len(body)
        assert n.tenancy.refusals.debt_s("a") == pytest.approx(len(body) / RATE)
