from inferd.cache import ResponseCache
from inferd.cache.store import entry_bytes
from inferd.types import Delta, FinishReason, TokenLogprob, Usage


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def gen(text: str) -> Delta:
    return Delta(token_ids=list(range(len(text))), text=text, finish_reason=FinishReason.STOP,
                 usage=Usage(prompt_tokens=2, completion_tokens=len(text)))


def test_a_stored_generation_comes_back_until_its_ttl():
    clock = Clock()
    cache = ResponseCache(10_000, ttl_s=60, clock=clock)
    cache.put(("t", 1), gen("hello"))
    assert cache.get(("t", 1)).text == "hello"
    clock.now = 61
    assert cache.get(("t", 1)) is None and len(cache) == 0 and cache.bytes == 0


def test_the_least_recently_used_entries_leave_when_bytes_run_out():
    one = entry_bytes(gen("x" * 100))
    cache = ResponseCache(3 * one, ttl_s=60)
    for k in "abc":
        cache.put(k, gen("x" * 100))
    cache.get("a")                          # a is now the most recently used
    cache.put("d", gen("x" * 100))
    assert cache.get("b") is None and cache.get("a") is not None and cache.evictions == 1
    assert cache.bytes <= cache.max_bytes


def test_an_entry_larger_than_the_cache_is_never_stored_and_a_shrink_evicts():
    cache = ResponseCache(500, ttl_s=60)
    cache.put("big", gen("x" * 1000))
    assert cache.get("big") is None
    cache.put("small", gen("x"))
    cache.resize(0, 60)
    assert len(cache) == 0


def test_expired_entries_are_swept_and_opted_out_tenants_dropped():
    clock = Clock()
    cache = ResponseCache(10_000, ttl_s=10, clock=clock)
    cache.put(("t1", b"k"), gen("a"))
    clock.now = 5
    cache.put(("t2", b"k"), gen("b"))
    clock.now = 11
    assert cache.sweep() == 1 and len(cache) == 1
    assert cache.retain_tenants(lambda tenant: tenant != "t2") == 1 and len(cache) == 0 and cache.bytes == 0


def test_an_entry_is_costed_for_its_token_ids_as_python_holds_them():
    assert entry_bytes(gen("x" * 10)) - entry_bytes(gen("")) >= 10 + 10 * 36


def test_an_entry_with_logprobs_counts_their_memory():
    plain = Delta(token_ids=[1, 2], text="ab", finish_reason=FinishReason.STOP)
    top = ((1, -0.1), (2, -0.2))
    with_lp = Delta(token_ids=[1, 2], text="ab", finish_reason=FinishReason.STOP,
                    logprobs=[TokenLogprob(1, -0.1, top), TokenLogprob(2, -0.2, top)], prompt_logprobs=[None])
    assert entry_bytes(with_lp) - entry_bytes(plain) >= 2 * 100 + 4 * 100
