"""GET and DELETE /v1/responses/{id}: a stored response by its tenant; what the server does not implement of
GET's query is a 400 naming it; a server without a store has no stored responses (404)."""
from __future__ import annotations

import aiohttp
import pytest

from tests.api.batch_harness import serve

KEPT = '[tenants.local]\nretention = "1h"\n'


@pytest.mark.parametrize(("query", "status", "param"), [
    ("", 200, None), ("?stream=false", 200, None), ("?stream=true", 400, "stream"),
    ("?include_obfuscation=false", 200, None), ("?starting_after=3", 400, "starting_after"),
])
async def test_get_accepts_only_its_no_op_query_parameters(tmp_path, query, status, param):
    async with serve(tmp_path, KEPT) as (node, _), aiohttp.ClientSession() as http:
        made = await node.sdk().responses.create(model="sim", input="x", max_output_tokens=2)
        async with http.get(f"{node.url}/v1/responses/{made.id}{query}") as resp:
            body = await resp.json()
    assert resp.status == status, body
    assert body["id"] == made.id if status == 200 else body["error"]["param"] == param


async def test_a_server_without_a_store_has_no_stored_responses(served):
    for method in ("GET", "DELETE"):
        async with served.http.request(method, served.base_url + "/v1/responses/resp_1") as resp:
            body = await resp.json()
        assert resp.status == 404 and body["error"]["code"] == "response_not_found"
