"""Edge quota checks: per-tenant limits, token buckets (RPM, TPM) and the concurrency cap.

Pure and synchronous with an injected clock, so every rule is tested without sleeping. The API calls
`precheck` before it reads and tokenizes the body (RPM and concurrency only, nothing charged),
`check_limits` (400/403, nothing charged), then `acquire`, which either charges everything (one
request, prompt + max_tokens tokens, one concurrency slot) and returns a Lease, or charges nothing
and raises QuotaExceeded (429) with `retry_after_s` computed from when the buckets will actually
have room. `Lease.release(usage)` at the end refunds the tokens the request did not use.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

from inferd.config import TenantConfig, TenantRegistry
from inferd.tenancy.demand import DecayingRate
from inferd.types import Usage

Clock = Callable[[], float]
Share = Callable[[str], float]      # tenant -> the fraction of its limits this node enforces (cluster)


class LimitExceeded(Exception):
    """The request breaks a tenant limit outright; retrying unchanged cannot help (400/403)."""

    def __init__(self, message: str, *, param: str | None, code: str, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status


class QuotaExceeded(Exception):
    """Over a rate or concurrency quota: 429 with Retry-After; the reason is a metric label."""

    status = 429

    def __init__(self, message: str, *, reason: str, retry_after_s: float, headers: dict[str, str]) -> None:
        super().__init__(message)
        self.reason = reason                # quota_rpm | quota_tpm | concurrency
        self.retry_after_s = retry_after_s
        self.headers = headers              # X-RateLimit-* values at rejection time


class TokenBucket:
    """`capacity` units, refilled continuously at `rate` per second, starting full."""

    __slots__ = ("capacity", "rate", "_level", "_at")

    def __init__(self, capacity: float, rate: float, now: float) -> None:
        self.capacity = float(capacity)
        self.rate = float(rate)
        self._level = float(capacity)
        self._at = now

    def level(self, now: float) -> float:
        if now > self._at:
            self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
            self._at = now
        return self._level

    def wait_s(self, n: float, now: float) -> float:
        """Seconds until `n` units fit (0 = now). More than the capacity fits once the bucket is full, and
        leaves it in debt: a cluster node's share of a limit can be smaller than one request that the
        whole limit allows (single-node requests over the limit are refused before, in check_limits)."""
        return max(0.0, (min(n, self.capacity) - self.level(now)) / self.rate)

    def take(self, n: float, now: float) -> None:
        self._level = self.level(now) - n

    def refund(self, n: float, now: float) -> None:
        self._level = min(self.capacity, self.level(now) + n)

    def reset_s(self, now: float) -> float:
        """Seconds until the bucket is full again (OpenAI's X-RateLimit-Reset-*)."""
        return max(0.0, (self.capacity - self.level(now)) / self.rate)


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, secs = divmod(seconds, 60)
    secs_text = f"{secs:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{secs_text}s" if minutes else f"{secs_text}s"


class _TenantState:
    __slots__ = ("config", "rpm", "tpm", "in_flight", "hold_ema_s", "rejections", "admitted", "demand", "share")

    def __init__(self, config: TenantConfig, now: float) -> None:
        self.config = config
        self.rpm = TokenBucket(config.requests_per_minute, config.requests_per_minute / 60, now) \
            if config.requests_per_minute else None
        self.tpm = TokenBucket(config.tokens_per_minute, config.tokens_per_minute / 60, now) \
            if config.tokens_per_minute else None
        self.in_flight = 0
        self.hold_ema_s = 1.0               # how long a lease is held; guides Retry-After for `concurrency`
        self.rejections: dict[str, int] = {}
        self.admitted = 0
        self.demand = DecayingRate(now)     # requests attempted here (refused ones too), for cluster shares
        self.share = 1.0                    # the fraction of the limits this node enforces

    def apply_share(self, share: float, now: float) -> None:
        """Scale the buckets to `share` of the configured limits (a cluster node's part of them)."""
        if share == self.share:
            return
        self.share = share
        for bucket, limit in ((self.rpm, self.config.requests_per_minute), (self.tpm, self.config.tokens_per_minute)):
            if bucket is not None and limit:
                level = bucket.level(now)
                bucket.capacity, bucket.rate = limit * share, limit * share / 60
                bucket._level = min(level, bucket.capacity)

    def headers(self, now: float) -> dict[str, str]:
        # Limit: the configured (cluster-wide) limit; Remaining and Reset: this node's bucket.
        h: dict[str, str] = {}
        if self.rpm is not None:
            h["X-RateLimit-Limit-Requests"] = str(self.config.requests_per_minute)
            h["X-RateLimit-Remaining-Requests"] = str(max(0, int(self.rpm.level(now))))
            h["X-RateLimit-Reset-Requests"] = format_duration(self.rpm.reset_s(now))
        if self.tpm is not None:
            h["X-RateLimit-Limit-Tokens"] = str(self.config.tokens_per_minute)
            h["X-RateLimit-Remaining-Tokens"] = str(max(0, int(self.tpm.level(now))))
            h["X-RateLimit-Reset-Tokens"] = format_duration(self.tpm.reset_s(now))
        return h


class Lease:
    """What one admitted request holds against its tenant's quota until `release`."""

    __slots__ = ("tenant", "prompt_tokens", "max_tokens", "headers", "_quota", "_acquired_at", "_released")

    def __init__(self, quota: Quota, tenant: str, prompt_tokens: int, max_tokens: int,
                 headers: dict[str, str], now: float) -> None:
        self._quota = quota
        self.tenant = tenant
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.headers = headers              # X-RateLimit-* after this request was charged
        self._acquired_at = now
        self._released = False

    def release(self, usage: Usage | None) -> None:
        """Give back the concurrency slot and the unused tokens. `usage=None`: the request never ran
        (rejected or dropped before the engine), so all its tokens come back. Idempotent."""
        if self._released:
            return
        self._released = True
        self._quota._release(self, usage)


class Quota:
    """Per-tenant quota state for the whole node. Loop-thread only."""

    def __init__(self, tenants: TenantRegistry, clock: Clock = time.monotonic) -> None:
        self._tenants = tenants
        self._clock = clock
        self._state: dict[str, _TenantState] = {}
        self._share: Share | None = None
        self._share_concurrency = False

    def set_share(self, share: Share | None, *, concurrency: bool = False) -> None:
        """Cluster-wide quotas (inferd.cluster): enforce `share(tenant)` of each tenant's RPM and TPM (and,
        with `concurrency`, of its concurrency cap) here. None: the whole limits, a single node."""
        self._share, self._share_concurrency = share, concurrency
        if share is None:
            now = self._clock()
            for st in self._state.values():
                st.apply_share(1.0, now)

    @property
    def share(self) -> Share | None:
        return self._share

    def reshare(self) -> None:
        """Apply the shares as they are now to every tenant's buckets, so each stretch of time refills at
        the share it had (else a request applies its share to the whole gap since the tenant's last one)."""
        if self._share is None:
            return
        now = self._clock()
        for name, st in self._state.items():
            st.apply_share(self._share(name), now)

    def demand(self) -> list[tuple[str, float, int]]:
        """(tenant, requests attempted per second lately, in flight) for every tenant seen lately."""
        now = self._clock()
        return [(name, rate, st.in_flight) for name, st in self._state.items()
                if (rate := st.demand.rate(now)) > 1e-3 or st.in_flight]

    def set_tenants(self, tenants: TenantRegistry) -> None:
        """Config reload: tenants whose settings changed get fresh buckets; in-flight counts carry over."""
        self._tenants = tenants
        now = self._clock()
        for name, st in list(self._state.items()):
            cfg = tenants.get(name)
            if cfg != st.config:
                fresh = _TenantState(cfg, now)
                fresh.in_flight, fresh.hold_ema_s = st.in_flight, st.hold_ema_s
                fresh.rejections, fresh.admitted, fresh.demand = st.rejections, st.admitted, st.demand
                self._state[name] = fresh

    def _get(self, tenant: str) -> _TenantState:
        st = self._state.get(tenant)
        if st is None:
            st = self._state[tenant] = _TenantState(self._tenants.get(tenant), self._clock())
        return st

    def check_limits(self, tenant: str, *, model: str, prompt_tokens: int, max_tokens: int | None,
                     context_len: int) -> int:
        """Per-request limits. Returns the max_tokens to use (the tenant's cap or what fits the
        context when the request set none). Raises LimitExceeded naming the field."""
        cfg = self._tenants.get(tenant)
        if not cfg.allows_model(model):
            raise LimitExceeded(f"tenant {tenant!r} may not use model {model!r}", param="model",
                                code="model_not_allowed", status=403)
        if cfg.max_prompt_tokens is not None and prompt_tokens > cfg.max_prompt_tokens:
            raise LimitExceeded(f"prompt has {prompt_tokens} tokens; this tenant's limit is {cfg.max_prompt_tokens}",
                                param="messages", code="prompt_too_long")
        if max_tokens is None:
            room = max(1, context_len - prompt_tokens)
            return min(room, cfg.max_output_tokens) if cfg.max_output_tokens is not None else room
        if cfg.max_output_tokens is not None and max_tokens > cfg.max_output_tokens:
            raise LimitExceeded(f"max_tokens is {max_tokens}; this tenant's limit is {cfg.max_output_tokens}",
                                param="max_tokens", code="max_tokens_too_large")
        if cfg.tokens_per_minute is not None and prompt_tokens + max_tokens > cfg.tokens_per_minute:
            # It could never fit the TPM bucket: a 429 would only make the client retry forever.
            raise LimitExceeded(f"prompt + max_tokens = {prompt_tokens + max_tokens} exceeds this tenant's "
                                f"{cfg.tokens_per_minute} tokens per minute", param="max_tokens",
                                code="request_too_large")
        return max_tokens

    def precheck(self, tenant: str) -> None:
        """Would `acquire` refuse this tenant whatever the request? Its requests-per-minute bucket and
        concurrency cap, peeked without charging: the API asks before reading and tokenizing a body.
        Raises the same QuotaExceeded (counted the same); tokens per minute need the request's size,
        so only `acquire` checks them."""
        now = self._clock()
        st = self._get(tenant)
        st.demand.add(1, now)
        refusal = self._refusal(tenant, st, now, cost=None)
        if refusal is not None:
            raise refusal

    def acquire(self, tenant: str, *, prompt_tokens: int, max_tokens: int) -> Lease:
        """Charge one request and prompt + max_tokens tokens, or raise QuotaExceeded charging nothing."""
        now = self._clock()
        st = self._get(tenant)
        cost = prompt_tokens + max_tokens
        refusal = self._refusal(tenant, st, now, cost)
        if refusal is not None:
            raise refusal
        if st.rpm is not None:
            st.rpm.take(1, now)
        if st.tpm is not None:
            st.tpm.take(cost, now)
        st.in_flight += 1
        st.admitted += 1
        return Lease(self, tenant, prompt_tokens, max_tokens, st.headers(now), now)

    def _refusal(self, tenant: str, st: _TenantState, now: float, cost: int | None) -> QuotaExceeded | None:
        """The QuotaExceeded for one more request costing `cost` tokens (None: leave TPM out), counted;
        None when it fits."""
        waits: dict[str, float] = {}
        cap = st.config.max_concurrent_requests
        if self._share is not None:
            share = self._share(tenant)
            st.apply_share(share, now)
            if self._share_concurrency and cap is not None:
                cap = max(1, math.ceil(cap * share))
        if cap is not None and st.in_flight >= cap:
            # Leases end one by one; with n held for ~hold_ema_s each, one frees about every hold/n.
            waits["concurrency"] = max(0.05, st.hold_ema_s / max(1, st.in_flight))
        if st.rpm is not None:
            w = st.rpm.wait_s(1, now)
            if w > 0:
                waits["quota_rpm"] = w
        if st.tpm is not None and cost is not None:
            w = st.tpm.wait_s(cost, now)
            if w > 0:
                waits["quota_tpm"] = w
        if not waits:
            return None
        reason = next(iter(waits))
        st.rejections[reason] = st.rejections.get(reason, 0) + 1
        retry = max(waits.values())     # the request needs every one of them to have room
        return QuotaExceeded(f"tenant {tenant!r} is over its {_DESCRIBE[reason]}; retry in {retry:.2f}s",
                             reason=reason, retry_after_s=retry, headers=st.headers(now))

    def _release(self, lease: Lease, usage: Usage | None) -> None:
        now = self._clock()
        st = self._get(lease.tenant)
        st.in_flight = max(0, st.in_flight - 1)
        st.hold_ema_s += 0.2 * ((now - lease._acquired_at) - st.hold_ema_s)
        if st.tpm is not None:
            used = 0 if usage is None else usage.prompt_tokens + usage.completion_tokens
            unused = lease.prompt_tokens + lease.max_tokens - used
            if unused > 0:
                st.tpm.refund(unused, now)
            elif unused < 0:        # charged on an estimate that fell short (a cold model's spill): the rest
                st.tpm.take(-unused, now)

    def headers(self, tenant: str) -> dict[str, str]:
        return self._get(tenant).headers(self._clock())

    def snapshot(self) -> dict[str, dict]:
        """Per metric label: in-flight requests, bucket levels, admitted and rejections by reason."""
        now = self._clock()
        out: dict[str, dict] = {}
        for name, st in self._state.items():
            row = out.setdefault(self._tenants.label(name), {
                "in_flight": 0, "admitted": 0, "rejections": {},
                "remaining_requests": None, "remaining_tokens": None})
            row["in_flight"] += st.in_flight
            row["admitted"] += st.admitted
            for reason, n in st.rejections.items():
                row["rejections"][reason] = row["rejections"].get(reason, 0) + n
            if st.rpm is not None:
                row["remaining_requests"] = st.rpm.level(now)
            if st.tpm is not None:
                row["remaining_tokens"] = st.tpm.level(now)
        return out


_DESCRIBE = {"concurrency": "concurrent request limit", "quota_rpm": "requests per minute",
             "quota_tpm": "tokens per minute"}
