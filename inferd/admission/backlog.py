"""The requests waiting in one admission queue: a FIFO per tenant, and the totals that the queue's
bounds, wait estimates and shedding read."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

from inferd.admission.ticket import Ticket
from inferd.config import CLASSES_BY_RANK


class Backlog:
    """Loop-thread only. `fifos` is never replaced (the capacity gate reads it)."""

    def __init__(self) -> None:
        self.fifos: dict[str, deque[Ticket]] = {}
        self.cost: dict[str, float] = {}          # estimated cost queued, per tenant
        self.tokens: dict[str, int] = {}          # prompt + max_tokens queued, per tenant
        self.requests = 0
        self.total_tokens = 0
        self.by_class = [0] * len(CLASSES_BY_RANK)    # requests queued per priority class (by rank)
        # Places held for the parts of requests let in but not entered yet (AdmissionQueue.enter's
        # `hold`): they count against the bounds like queued requests.
        self.held: dict[str, int] = {}
        self.held_total = 0

    def hold(self, tenant: str, n: int) -> None:
        """Hold `n` places for `tenant` (negative: give them back)."""
        self.held[tenant] = self.held.get(tenant, 0) + n
        self.held_total += n
        if not self.held[tenant]:
            del self.held[tenant]

    def append(self, t: Ticket) -> None:
        q = self.fifos.get(t.tenant)
        if not q:
            q = self.fifos[t.tenant] = deque()
            self.cost[t.tenant] = 0.0
            self.tokens[t.tenant] = 0
        q.append(t)
        self.cost[t.tenant] += t.est_cost
        self.tokens[t.tenant] += t.tokens
        self.requests += 1
        self.total_tokens += t.tokens
        self.by_class[t.cls.rank] += 1

    def remove(self, t: Ticket) -> None:
        self.fifos[t.tenant].remove(t)
        self.cost[t.tenant] -= t.est_cost
        self.tokens[t.tenant] -= t.tokens
        self.requests -= 1
        self.total_tokens -= t.tokens
        self.by_class[t.cls.rank] -= 1

    def backlogged(self, besides: str) -> list[str]:
        """Tenants with requests queued, other than `besides`."""
        return [n for n, q in self.fifos.items() if q and n != besides]

    def total_cost(self) -> float:
        return sum(self.cost.values())

    def shed_for(self, t: Ticket, need_requests: int, need_tokens: int,
                 counter: Callable[[str], float]) -> list[Ticket] | None:
        """Queued requests of classes below `t`'s whose removal frees `need_requests` and `need_tokens`:
        batch first; within a class the tenant most over its share (highest counter), newest request
        first. None if even all of them would not free enough."""
        victims: list[Ticket] = []
        for cls in reversed(CLASSES_BY_RANK):
            if cls.rank <= t.cls.rank:
                break
            tenants = sorted((n for n, q in self.fifos.items() if q and q[0].cls is cls), key=lambda n: -counter(n))
            for n in tenants:
                for v in reversed(self.fifos[n]):
                    if need_requests <= 0 and need_tokens <= 0:
                        break
                    if v.grouped:           # a part of a request already let in: never refused partway
                        continue
                    victims.append(v)
                    need_requests -= 1
                    need_tokens -= v.tokens
        return victims if need_requests <= 0 and need_tokens <= 0 else None
