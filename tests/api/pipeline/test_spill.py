"""inferd.api.pipeline.spill: what a forwarded request must prove, and the relay of a peer's stream.

Spilling between real daemons is tested end to end in tests/daemon/test_cluster.py."""
from inferd.api.wire.responses import usage_comment
from inferd.api.pipeline.spill import _UsageFilter
from inferd.types import Usage


def test_the_usage_comment_is_taken_out_of_the_stream_even_split_across_chunks():
    frames = b'data: {"a":1}\n\n' + usage_comment(Usage(prompt_tokens=7, completion_tokens=12)) + b"data: [DONE]\n\n"
    for cut in range(1, len(frames)):
        f = _UsageFilter()
        out = f.feed(frames[:cut]) + f.feed(frames[cut:]) + f.rest()
        assert out.replace(b"\n\n\n", b"\n\n") == b'data: {"a":1}\n\ndata: [DONE]\n\n', cut
        assert f.usage == Usage(prompt_tokens=7, completion_tokens=12), cut


def test_a_stream_without_the_comment_passes_through_unchanged():
    frames = b'data: {"a":1}\n\n: ping\n\ndata: [DONE]\n\n'
    f = _UsageFilter()
    assert f.feed(frames[:5]) + f.feed(frames[5:]) + f.rest() == frames and f.usage is None


async def test_a_node_outside_a_cluster_refuses_a_forwarded_request_before_reading_it(served):
    body = {"model": "sim", "prompt": "hi", "max_tokens": 2}
    async with served.http.post(served.base_url + "/v1/completions", json=body,
                                headers={"X-Inferd-Forwarded": "x.y"}) as resp:
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "invalid_forwarded_identity"
