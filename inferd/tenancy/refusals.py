"""Front-end fairness: a tenant whose requests keep being refused as invalid is paced, not served first.

A refused request still costs the node: its body is read and decoded, its prompt measured, sometimes
tokenized, and on a node whose engine shares the CPU (the reference engine) every refusal a client
sends in a tight loop comes straight out of other tenants' latency. RPM does not help (a 400 is not
charged against it, and a client can send ten 900 KB prompts under any sane RPM). So each tenant has a
debt of refused body bytes, paid off at `server.refused_bytes_per_s` (a GCRA: `tat` is when the debt
is paid), with `server.refused_burst_bytes` of debt allowed before pacing starts:

- a refusal for the client's own fault (400, 403, 404, 413, 415, 422), or a client that left after
  sending its body (499), adds the bytes the node read (at least MIN_CHARGE_BYTES; a 413 counts at most
  `max_body_bytes`, whatever its Content-Length claimed) to the tenant's debt;
- while the tenant is over its burst, each new request of that tenant waits, before its body is read,
  until its turn (`Pacer.enter`), and reserves its Content-Length (at most `max_body_bytes`) as if it
  would be refused too, so concurrent requests are spread out instead of all released at once; one
  that passes its checks gets that reservation back;
- a turn further away than the longest wait (MAX_WAIT_S, or half the body timeout), or MAX_WAITING of
  the tenant's requests already asleep (they hold connections), is a 429 at once, with the wait as its
  Retry-After.

Waiting costs a timer, not CPU: a client sending refused requests in a loop gets about
`refused_bytes_per_s` of them processed, and a tenant that sends valid requests never waits. Pure and
synchronous with an injected clock; the API sleeps.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

Clock = Callable[[], float]

# Statuses that mean "the request was wrong", decided after the body was read (or its length seen).
# 499: the client sent its body, then left before the answer (a send-and-forget client pays like the rest).
CLIENT_FAULT = frozenset({400, 403, 404, 413, 415, 422, 499})
MIN_CHARGE_BYTES = 4096       # a refusal of a tiny body still cost a request's worth of work
MAX_WAIT_S = 5.0
MAX_WAITING = 8               # a tenant's requests asleep at once: beyond, 429 (they hold connections)


class Paced(Exception):
    """The tenant's turn is further away than a request may wait: 429 with Retry-After."""

    def __init__(self, tenant: str, retry_after_s: float) -> None:
        super().__init__(f"Tenant `{tenant}` sent more requests that were refused as invalid than this server "
                         f"processes; its requests are paced. Fix the requests, and retry after "
                         f"{math.ceil(retry_after_s)} s.")
        self.retry_after_s = retry_after_s


class Turn:
    """One request's passage through the pacer: `refused(status, nbytes)` if it is refused, then `close()`
    (in a finally) gives back what it reserved unless it was refused. A paced turn is `waiting` until
    `waited()`: a tenant has at most MAX_WAITING requests asleep at once."""

    __slots__ = ("_pacer", "_tenant", "_reserved_s", "_refused", "waiting")

    def __init__(self, pacer: Pacer | None, tenant: str, reserved_s: float = 0.0) -> None:
        self._pacer = pacer
        self._tenant = tenant
        self._reserved_s = reserved_s   # debt charged up front, in seconds (paced requests only)
        self._refused = False
        self.waiting = reserved_s > 0

    def waited(self) -> None:
        if self.waiting and self._pacer is not None:
            self.waiting = False
            self._pacer.woke(self._tenant)

    def refused(self, status: int, nbytes: int) -> None:
        if self._pacer is None or status not in CLIENT_FAULT or self._refused:
            return
        self._refused = True
        self._pacer.refusal(self._tenant, max(nbytes, MIN_CHARGE_BYTES), self._reserved_s)

    def close(self) -> None:
        self.waited()
        if self._pacer is not None and not self._refused and self._reserved_s:
            self._pacer.charge_s(self._tenant, -self._reserved_s)
        self._pacer = None


NO_TURN = Turn(None, "")       # requests the pacer does not see (internal batch lines, peers' spills)


class Pacer:
    """Per-tenant refused-bytes debt. `rate` bytes/s (0: off), `burst` bytes of debt before pacing. The debt
    is kept in seconds (when it is paid off), so a reload that changes the rate leaves it as it was."""

    def __init__(self, rate: float, burst: float, *, max_wait_s: float = MAX_WAIT_S,
                 clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.configure(rate, burst, max_wait_s)
        self._tat: dict[str, float] = {}           # tenant -> when its debt is paid off
        self._waiting: dict[str, int] = {}         # tenant -> its requests asleep now
        self.refused_bytes: dict[str, int] = {}     # cumulative, for metrics
        self.delayed: dict[str, int] = {}           # requests that waited for their turn

    def configure(self, rate: float, burst: float, max_wait_s: float = MAX_WAIT_S) -> None:
        self.rate = float(rate)
        self.burst_s = burst / rate if rate > 0 else 0.0
        self.max_wait_s = max_wait_s

    def refusal(self, tenant: str, nbytes: int, reserved_s: float = 0.0) -> None:
        """A request of `nbytes` was refused for the client's fault; `reserved_s` of it is already charged."""
        self.refused_bytes[tenant] = self.refused_bytes.get(tenant, 0) + nbytes
        if self.rate > 0:
            self.charge_s(tenant, nbytes / self.rate - reserved_s)

    def charge_s(self, tenant: str, seconds: float) -> None:
        """Add `seconds` to the tenant's debt (negative: give a reservation back)."""
        now = self.clock()
        tat = max(self._tat.get(tenant, now), now) + seconds
        if tat > now and self.rate > 0:
            self._tat[tenant] = tat
        else:
            self._tat.pop(tenant, None)             # no debt left (or pacing off): nothing to keep

    def enter(self, tenant: str, content_length: int | None, max_body_bytes: int) -> tuple[Turn, float]:
        """This request's turn and how long it must wait for it (0: at once, the usual case). Raises
        Paced when the wait would be longer than `max_wait_s`, or MAX_WAITING of the tenant's requests
        are already waiting."""
        if self.rate <= 0:
            return NO_TURN, 0.0
        tat = self._tat.get(tenant)
        now = self.clock()
        if tat is None or tat - self.burst_s <= now:
            return Turn(self, tenant), 0.0
        wait = tat - self.burst_s - now
        if wait > self.max_wait_s or self._waiting.get(tenant, 0) >= MAX_WAITING:
            raise Paced(tenant, wait)
        # A body is never more than max_body_bytes (413 beyond): a Content-Length of 10 TB reserves that.
        reserve_s = min(max(content_length or 0, MIN_CHARGE_BYTES), max(max_body_bytes, MIN_CHARGE_BYTES)) / self.rate
        self._tat[tenant] = tat + reserve_s         # the next one waits behind this one
        self.delayed[tenant] = self.delayed.get(tenant, 0) + 1
        self._waiting[tenant] = self._waiting.get(tenant, 0) + 1
        return Turn(self, tenant, reserve_s), wait

    def woke(self, tenant: str) -> None:
        n = self._waiting.get(tenant, 0) - 1
        if n > 0:
            self._waiting[tenant] = n
        else:
            self._waiting.pop(tenant, None)

    def debt_s(self, tenant: str) -> float:
        """Seconds until the tenant's refused-bytes debt is paid off (0: none)."""
        tat = self._tat.get(tenant)
        return max(0.0, tat - self.clock()) if tat is not None else 0.0
