"""The fair order of an admission queue: weighted virtual token counters and class shares.

Classes are served interactive > standard > batch, except that a lower class keeps a share of the cost
served while it waits (`AdmissionConfig.reserved_share`). Within a class the backlogged tenant with the
smallest virtual token counter goes next (VTC, Sheng et al. 2024). A tenant's counter grows by the cost
served to it / its weight, so backlogged tenants are served in proportion to their weights. A tenant
that becomes backlogged again is lifted to the smallest counter among the backlogged tenants, so idling
never banks credit.

No engine and no clock: the queue says who is backlogged, which queue heads may go now and which
tenants are light, and charges the cost it serves (inferd.admission.fair_queue: the prompt at dispatch;
inferd.admission.stream: the output as it is delivered).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from inferd.admission.ticket import Ticket
from inferd.config import CLASSES_BY_RANK, AdmissionConfig, PriorityClass


class FairOrder:
    """Per-tenant counters and per-class served cost of one admission queue. Loop-thread only."""

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        self._floor = 0.0                             # last min counter of the backlogged tenants
        self._class_served = {c: 0.0 for c in CLASSES_BY_RANK}
        self._served_total = 0.0
        # (class served, total served) when the class last became backlogged: its share counts from there
        self._class_mark: dict[PriorityClass, tuple[float, float]] = {}
        self._class_queued = {c: 0 for c in CLASSES_BY_RANK}

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)

    def charge(self, tenant: str, cls: PriorityClass, cost: float, weight: float) -> None:
        self.counters[tenant] = self.counters.get(tenant, 0.0) + cost / weight
        self._class_served[cls] += cost
        self._served_total += cost

    def lift(self, tenant: str, backlogged: Iterable[str]) -> None:
        """`tenant` becomes backlogged beside `backlogged` (the others): no credit banked while idle.
        With nobody else backlogged, the last minimum seen is the floor."""
        others = [self.counters.get(n, 0.0) for n in backlogged]
        floor = min(others) if others else self._floor
        self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)

    def note_floor(self, backlogged: Iterable[str]) -> None:
        """Remember the smallest counter among these backlogged tenants (non-empty)."""
        self._floor = max(self._floor, min(self.counters.get(n, 0.0) for n in backlogged))

    def joined(self, cls: PriorityClass) -> None:
        """A request of `cls` was queued."""
        if not self._class_queued[cls]:
            self._class_mark[cls] = (self._class_served[cls], self._served_total)
        self._class_queued[cls] += 1

    def left(self, cls: PriorityClass) -> None:
        """A request of `cls` left the queue (released, refused or gone)."""
        self._class_queued[cls] -= 1
        if not self._class_queued[cls]:
            self._class_mark.pop(cls, None)

    def next_class(self, backlogged: set[PriorityClass],
                   reserved_share: Callable[[PriorityClass], float]) -> PriorityClass:
        """The highest backlogged class, unless a lower one has had less than its reserved share of the
        cost served since it began waiting."""
        cls = min(backlogged, key=lambda c: c.rank)
        for lower in CLASSES_BY_RANK[cls.rank + 1:]:
            mark = self._class_mark.get(lower)
            if lower in backlogged and mark is not None and (
                    self._class_served[lower] - mark[0] < reserved_share(lower) * (self._served_total - mark[1])):
                return lower
        return cls

    def pick(self, heads: Sequence[Ticket], policy: AdmissionConfig, is_light: Callable[[str], bool],
             queued: Callable[[str], int]) -> Ticket:
        """The next request among the tenants' queue heads that may go (non-empty). FCFS: the oldest.
        Else, in the class `next_class` names: light tenants (under their weighted share of slots)
        first, as a tenant using less than its share is owed service and need not wait behind one
        using more, even right after its own counter moved past theirs; then the counter; ties (a
        tenant just lifted) go to the shorter queue (`queued(tenant)`), then the older request."""
        if policy.scheduling == "fcfs":
            return min(heads, key=lambda h: h.seq)
        cls = self.next_class({h.cls for h in heads}, policy.reserved_share)
        self.note_floor(h.tenant for h in heads)
        counter = self.counter
        return min((h for h in heads if h.cls is cls),
                   key=lambda h: (not is_light(h.tenant), counter(h.tenant), queued(h.tenant), h.seq))
