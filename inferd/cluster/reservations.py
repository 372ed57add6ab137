"""Slots this node has taken on its peers since their last load hints (spillover's local reservation).

A peer's hint says how many sequence slots it had free when it was measured, up to `load_interval_s`
ago. Every request this node forwards there since takes one of them, but the hint cannot say so until
the next one: without counting them, a burst goes whole to the peer that looked emptiest, which then
refuses most of it while other peers idle. So each forward holds a reservation on (peer, model,
version) from before it is sent until it ends, and a hint counts only the reservations its
measurement could not have seen: those the peer had not yet answered (before the answer the request
may not have reached the peer's queue) or answered after the hint was measured. A reservation the peer
answered before a hint was measured is in that hint already (a taken slot, or a queued request).

A peer that refused a forward for lack of room (429/503) has none until a hint measured after the
refusal says otherwise.

State is bounded: one entry per forward in flight (released in `finally`, and at most
MAX_OPEN_PER_KEY per peer and version), and refusal marks are dropped once every fresh hint is newer
than them (older than `load_max_age_s`).
"""
from __future__ import annotations

import time
from collections.abc import Callable

MAX_OPEN_PER_KEY = 1024      # forwards counted against one peer's version; beyond, the oldest stop counting
ANY_VERSION = ""             # a cold forward's reservation (the peer routes it): counts against every version

Key = tuple[str, str, str]   # (node, model, version)


class Reservation:
    """One forward's hold on a peer's slot. `answered()` once the peer answered; `release()` when the
    request ended (idempotent)."""

    __slots__ = ("_owner", "key", "seq", "answered_at")

    def __init__(self, owner: Reservations, key: Key, seq: int) -> None:
        self._owner, self.key, self.seq = owner, key, seq
        self.answered_at: float | None = None       # on this node's clock; None: not answered yet

    def answered(self) -> None:
        if self.answered_at is None:
            self.answered_at = self._owner.clock()

    def release(self) -> None:
        self._owner._release(self)


class Reservations:
    """Loop thread only."""

    def __init__(self, max_age_s: Callable[[], float], clock: Callable[[], float] = time.monotonic) -> None:
        self._max_age_s = max_age_s      # load_max_age_s as now configured: older hints are ignored anyway
        self.clock = clock
        self._open: dict[Key, dict[int, Reservation]] = {}
        self._refused: dict[Key, float] = {}        # key -> when the peer last refused for room
        self._seq = 0

    def reserve(self, node: str, model: str, version: str | None) -> Reservation:
        """Hold one slot of `node`'s `model` at `version` (None: whichever version it routes to)."""
        key = (node, model, version if version is not None else ANY_VERSION)
        self._seq += 1
        held = Reservation(self, key, self._seq)
        open_ = self._open.setdefault(key, {})
        if len(open_) >= MAX_OPEN_PER_KEY:
            del open_[next(iter(open_))]            # the oldest (dicts keep insertion order)
        open_[held.seq] = held
        return held

    def refused(self, node: str, model: str, version: str | None) -> None:
        """The peer refused a forward for lack of room: none there until a newer hint."""
        self._refused[(node, model, version if version is not None else ANY_VERSION)] = self.clock()
        self._prune_refusals()

    def held(self, node: str, model: str, version: str, hint_at: float) -> int | None:
        """Slots this node holds on `node`'s `model`@`version` that the hint measured at `hint_at` (this
        node's clock) does not show; None: the peer refused since that hint (no room)."""
        count = 0
        for key in ((node, model, version), (node, model, ANY_VERSION)):
            refused_at = self._refused.get(key)
            if refused_at is not None and refused_at >= hint_at:
                return None
            for r in self._open.get(key, {}).values():
                if r.answered_at is None or r.answered_at > hint_at:
                    count += 1
        return count

    def in_flight(self) -> int:
        """Reservations held now (a bounded figure for tests and /admin views)."""
        return sum(len(v) for v in self._open.values())

    def _release(self, r: Reservation) -> None:
        open_ = self._open.get(r.key)
        if open_ is not None and open_.pop(r.seq, None) is not None and not open_:
            del self._open[r.key]

    def _prune_refusals(self) -> None:
        """A mark older than max_age_s predates every fresh hint: it no longer says anything."""
        horizon = self.clock() - self._max_age_s()
        for key in [k for k, at in self._refused.items() if at < horizon]:
            del self._refused[key]
