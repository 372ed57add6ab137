
import pytest

from inferd.config.tenants import TenantConfig, TenantRegistry
from inferd.tenancy.quota import LimitExceeded, Quota, QuotaExceeded, TokenBucket, format_duration
from inferd.types import Usage


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return FakeClock()


def make_quota(clock, **tenant):
    return Quota(TenantRegistry({"acme": TenantConfig(**tenant)}), clock=clock)


def test_bucket_refills_continuously_and_caps_at_capacity():
    b = TokenBucket(60, 1.0, now=0.0)
    b.take(60, 0.0)
    assert b.level(0.0) == 0
    assert b.wait_s(10, 0.0) == pytest.approx(10.0)
    assert b.level(30.0) == pytest.approx(30.0)
    assert b.level(1000.0) == 60


def test_more_than_the_capacity_fits_a_full_bucket_and_leaves_it_in_debt():
    b = TokenBucket(60, 1.0, now=0.0)
    b.take(30, 0.0)
    assert b.wait_s(90, 0.0) == pytest.approx(30.0)      # until full
    assert b.wait_s(90, 30.0) == 0
    b.take(90, 30.0)
    assert b.level(30.0) == -30
    assert b.wait_s(1, 30.0) == pytest.approx(31.0)


def test_bucket_refund_never_exceeds_capacity():
    b = TokenBucket(100, 1.0, now=0.0)
    b.take(30, 0.0)
    b.refund(50, 0.0)
    assert b.level(0.0) == 100


def test_a_lease_that_used_more_than_it_was_charged_pays_the_rest(clock):
    # a cold model's spill is charged on an estimate before it is tokenized; the peer's usage settles it
    q = make_quota(clock, tokens_per_minute=1000)
    lease = q.acquire("acme", prompt_tokens=10, max_tokens=0)
    lease.release(Usage(prompt_tokens=30, completion_tokens=20))
    assert q.headers("acme")["X-RateLimit-Remaining-Tokens"] == "950"


def test_rpm_rejects_with_retry_after_when_a_request_refills(clock):
    q = make_quota(clock, requests_per_minute=2)
    q.acquire("acme", prompt_tokens=1, max_tokens=1)
    q.acquire("acme", prompt_tokens=1, max_tokens=1)
    with pytest.raises(QuotaExceeded) as exc:
        q.acquire("acme", prompt_tokens=1, max_tokens=1)
    assert exc.value.reason == "quota_rpm"
    assert exc.value.retry_after_s == pytest.approx(30.0)      # 2/min refills one every 30 s
    assert exc.value.headers["X-RateLimit-Remaining-Requests"] == "0"
    clock.t += 30.0
    q.acquire("acme", prompt_tokens=1, max_tokens=1)


def test_tpm_charges_prompt_plus_max_tokens_and_refunds_unused(clock):
    q = make_quota(clock, tokens_per_minute=1000)
    lease = q.acquire("acme", prompt_tokens=100, max_tokens=500)
    assert lease.headers["X-RateLimit-Remaining-Tokens"] == "400"
    with pytest.raises(QuotaExceeded) as exc:
        q.acquire("acme", prompt_tokens=100, max_tokens=500)
    assert exc.value.reason == "quota_tpm"
    assert exc.value.retry_after_s == pytest.approx(200 / (1000 / 60))
    lease.release(Usage(prompt_tokens=100, completion_tokens=50))   # 450 unused come back
    assert q.headers("acme")["X-RateLimit-Remaining-Tokens"] == "850"
    q.acquire("acme", prompt_tokens=100, max_tokens=500)


def test_rejection_charges_nothing(clock):
    q = make_quota(clock, requests_per_minute=10, tokens_per_minute=100)
    q.acquire("acme", prompt_tokens=50, max_tokens=40)
    with pytest.raises(QuotaExceeded):
        q.acquire("acme", prompt_tokens=50, max_tokens=40)
    h = q.headers("acme")
    assert h["X-RateLimit-Remaining-Requests"] == "9" and h["X-RateLimit-Remaining-Tokens"] == "10"


def test_concurrency_cap_frees_on_release_and_release_is_idempotent(clock):
    q = make_quota(clock, max_concurrent_requests=1)
    lease = q.acquire("acme", prompt_tokens=1, max_tokens=1)
    with pytest.raises(QuotaExceeded) as exc:
        q.acquire("acme", prompt_tokens=1, max_tokens=1)
    assert exc.value.reason == "concurrency" and exc.value.retry_after_s > 0
    lease.release(None)
    lease.release(None)
    q.acquire("acme", prompt_tokens=1, max_tokens=1)
    assert q.snapshot()["acme"]["in_flight"] == 1
    assert q.snapshot()["acme"]["rejections"] == {"concurrency": 1}


def test_reset_headers_use_openai_duration_format(clock):
    q = make_quota(clock, requests_per_minute=60, tokens_per_minute=600)
    lease = q.acquire("acme", prompt_tokens=300, max_tokens=0)
    assert lease.headers["X-RateLimit-Limit-Requests"] == "60"
    assert lease.headers["X-RateLimit-Reset-Requests"] == "1s"
    assert lease.headers["X-RateLimit-Reset-Tokens"] == "30s"
    assert format_duration(0.0199) == "20ms" and format_duration(360) == "6m0s"


def test_limits_name_the_field(clock):
    q = make_quota(clock, max_prompt_tokens=10, max_output_tokens=20, allowed_models=("small",),
                   tokens_per_minute=25)
    with pytest.raises(LimitExceeded) as exc:
        q.check_limits("acme", model="big", prompt_tokens=1, max_tokens=1, context_len=100)
    assert exc.value.status == 403 and exc.value.param == "model"
    with pytest.raises(LimitExceeded, match="prompt") as exc:
        q.check_limits("acme", model="small", prompt_tokens=11, max_tokens=1, context_len=100)
    with pytest.raises(LimitExceeded) as exc:
        q.check_limits("acme", model="small", prompt_tokens=1, max_tokens=21, context_len=100)
    assert exc.value.param == "max_tokens"
    with pytest.raises(LimitExceeded) as exc:
        q.check_limits("acme", model="small", prompt_tokens=10, max_tokens=20, context_len=100)
    assert exc.value.code == "request_too_large"
    assert q.check_limits("acme", model="small", prompt_tokens=5, max_tokens=None, context_len=100) == 20


def test_unlimited_tenant_sends_no_ratelimit_headers(clock):
    q = Quota(TenantRegistry(), clock=clock)
    assert q.acquire("local", prompt_tokens=10**6, max_tokens=10**6).headers == {}
    assert q.check_limits("local", model="m", prompt_tokens=90, max_tokens=None, context_len=100) == 10


def test_precheck_refuses_over_rpm_or_concurrency_and_charges_nothing(clock):
    q = make_quota(clock, requests_per_minute=1, tokens_per_minute=100, max_concurrent_requests=1)
    q.precheck("acme")                                  # room: passes, takes nothing
    assert q.headers("acme")["X-RateLimit-Remaining-Requests"] == "1"
    lease = q.acquire("acme", prompt_tokens=10, max_tokens=10)
    with pytest.raises(QuotaExceeded) as exc:
        q.precheck("acme")
    assert exc.value.reason == "concurrency"            # the first reason, as acquire reports it
    assert exc.value.retry_after_s == pytest.approx(60.0)   # and the longest wait: the RPM bucket's
    lease.release(Usage(prompt_tokens=10, completion_tokens=10))
    with pytest.raises(QuotaExceeded) as exc:
        q.precheck("acme")
    assert exc.value.reason == "quota_rpm"
    assert exc.value.headers["X-RateLimit-Remaining-Tokens"] == "80"
    assert q.snapshot()["acme"]["rejections"] == {"concurrency": 1, "quota_rpm": 1}
    clock.t += 60
    q.precheck("acme")


def test_precheck_leaves_tokens_per_minute_to_acquire(clock):
    q = make_quota(clock, tokens_per_minute=100)
    q.acquire("acme", prompt_tokens=50, max_tokens=50)  # the bucket is empty
    q.precheck("acme")                                  # the next request's size is not known yet
    with pytest.raises(QuotaExceeded) as exc:
        q.acquire("acme", prompt_tokens=1, max_tokens=1)
    assert exc.value.reason == "quota_tpm"


def test_a_cluster_share_scales_the_buckets_and_headers_keep_the_cluster_wide_limit(clock):
    q = make_quota(clock, requests_per_minute=60, max_concurrent_requests=1000)
    q.set_share(lambda tenant: 0.25)
    for _ in range(15):                           # a quarter of 60
        q.acquire("acme", prompt_tokens=1, max_tokens=1)
    with pytest.raises(QuotaExceeded) as exc:
        q.acquire("acme", prompt_tokens=1, max_tokens=1)
    assert exc.value.retry_after_s == pytest.approx(4.0)       # refills at 60 * 0.25 per minute
    assert exc.value.headers["X-RateLimit-Limit-Requests"] == "60"
    q.set_share(None)
    clock.t += 60
    for _ in range(60):                           # the whole limit again, a single node
        q.acquire("acme", prompt_tokens=1, max_tokens=1)


def test_reshare_refills_each_stretch_at_the_share_it_had_not_at_the_share_of_the_next_request(clock):
    q = make_quota(clock, requests_per_minute=60)
    shares = {"acme": 0.5}
    q.set_share(lambda tenant: shares["acme"])
    for _ in range(30):                           # empty: half of 60
        q.acquire("acme", prompt_tokens=1, max_tokens=1)
    clock.t += 10                                 # 10 s at half the limit: 5 requests' worth
    shares["acme"] = 0.1
    q.reshare()
    clock.t += 10                                 # 10 s at a tenth: 1 more
    assert q.snapshot()["acme"]["remaining_requests"] == pytest.approx(6.0)


def test_a_shared_concurrency_cap_is_split_only_when_asked(clock):
    q = make_quota(clock, max_concurrent_requests=4)
    q.set_share(lambda tenant: 0.5)
    leases = [q.acquire("acme", prompt_tokens=1, max_tokens=1) for _ in range(4)]
    q.set_share(lambda tenant: 0.5, concurrency=True)
    with pytest.raises(QuotaExceeded) as exc:
        q.acquire("acme", prompt_tokens=1, max_tokens=1)
    assert exc.value.reason == "concurrency"
    for lease in leases:
        lease.release(None)


def test_demand_counts_every_attempt_including_refused_ones(clock):
    q = make_quota(clock, requests_per_minute=1)
    q.precheck("acme")
    q.acquire("acme", prompt_tokens=1, max_tokens=1)
    for _ in range(9):
        with pytest.raises(QuotaExceeded):
            q.precheck("acme")
    [(tenant, rate, in_flight)] = q.demand()
    assert tenant == "acme" and in_flight == 1
    assert rate == pytest.approx(10 / 5.0)        # ten attempts over the 5 s time constant
    clock.t += 60
    assert q.demand() == [("acme", pytest.approx(0.0, abs=1e-4), 1)]
