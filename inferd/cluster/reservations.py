"""Slots this node has taken on its peers since their last load hints (spillover's local reservation).

A peer's hint says how many sequence slots it had free when it was measured, up to `load_interval_s`
ago. Every request this node forwards there since takes one of them, but the hint cannot say so until
the next one: without counting them, a burst goes whole to the peer that looked emptiest, which then
queues or refuses what does not fit while other peers idle. So each forward holds a reservation on (peer, model,
version) from before it is sent until it ends, and a hint is corrected by what its measurement could
not have seen:
- a forward still open that the peer had not taken in yet when the hint was measured takes a slot;
- a forward the hint showed running that has ended since gives its slot back.
The peer has taken a forward in once it answered (a stream's headers), or at the latest VISIBLE_AFTER_S
after it was sent (a unary answer only comes at the end): admission takes milliseconds.

A peer that refused a forward for lack of room (429/503) has none until a hint measured after the
refusal says otherwise.

State is bounded: one entry per forward in flight (released in `finally`; at most MAX_PER_KEY per peer
and version, beyond which the oldest stop counting), and what ended or was refused longer than
`load_max_age_s` ago is dropped (every fresh hint is newer: it shows it).
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

MAX_PER_KEY = 1024           # forwards remembered per peer's version (open, and ended lately)
VISIBLE_AFTER_S = 0.2        # a forward the peer has not answered is in its hints measured this long after
ANY_VERSION = ""             # a cold forward's reservation (the peer routes it): counts against every version

Key = tuple[str, str, str]   # (node, model, version)


class Reservation:
    """One forward's hold on a peer's slot. `answered()` once the peer answered; `release()` when the
    request ended (idempotent)."""

    __slots__ = ("_owner", "key", "seq", "visible_at")

    def __init__(self, owner: Reservations, key: Key, seq: int, sent_at: float) -> None:
        self._owner, self.key, self.seq = owner, key, seq
        self.visible_at = sent_at + VISIBLE_AFTER_S     # hints measured later show it (this node's clock)

    def answered(self) -> None:
        self.visible_at = min(self.visible_at, self._owner.clock())

    def release(self) -> None:
        self._owner._release(self)


class Reservations:
    """Loop thread only."""

    def __init__(self, max_age_s: Callable[[], float], clock: Callable[[], float] = time.monotonic) -> None:
        self._max_age_s = max_age_s      # load_max_age_s as now configured: older hints are ignored anyway
        self.clock = clock
        self._open: dict[Key, dict[int, Reservation]] = {}
        self._ended: dict[Key, deque[tuple[float, float]]] = {}   # (visible at, ended at), oldest first
        self._refused: dict[Key, float] = {}        # key -> when the peer last refused for room
        self._seq = 0

    def reserve(self, node: str, model: str, version: str | None) -> Reservation:
        """Hold one slot of `node`'s `model` at `version` (None: whichever version it routes to)."""
        key = (node, model, version if version is not None else ANY_VERSION)
        self._seq += 1
        held = Reservation(self, key, self._seq, self.clock())
        open_ = self._open.setdefault(key, {})
        if len(open_) >= MAX_PER_KEY:
            del open_[next(iter(open_))]            # the oldest (dicts keep insertion order)
        open_[held.seq] = held
        return held

    def refused(self, node: str, model: str, version: str | None) -> None:
        """The peer refused a forward for lack of room: none there until a newer hint."""
        self._refused[(node, model, version if version is not None else ANY_VERSION)] = self.clock()
        horizon = self.clock() - self._max_age_s()
        for key in [k for k, at in self._refused.items() if at < horizon]:
            del self._refused[key]

    def held(self, node: str, model: str, version: str, hint_at: float) -> int | None:
        """Slots this node's forwards take on `node`'s `model`@`version` beyond what the hint measured at
        `hint_at` (this node's clock) shows: open ones it could not see, less ended ones it saw running
        (negative: more free than it says). None: the peer refused since that hint (no room)."""
        count = 0
        for key in ((node, model, version), (node, model, ANY_VERSION)):
            refused_at = self._refused.get(key)
            if refused_at is not None and refused_at >= hint_at:
                return None
            for r in self._open.get(key, {}).values():
                count += r.visible_at > hint_at
            for visible_at, ended_at in self._ended.get(key, ()):
                count -= visible_at <= hint_at < ended_at
        return count

    def in_flight(self) -> int:
        """Reservations held now (a bounded figure for tests)."""
        return sum(len(v) for v in self._open.values())

    def _release(self, r: Reservation) -> None:
        open_ = self._open.get(r.key)
        if open_ is None or open_.pop(r.seq, None) is None:
            return
        if not open_:
            del self._open[r.key]
        now = self.clock()
        horizon = now - self._max_age_s()
        if r.key not in self._ended:        # a key new here: sweep them all (a peer gone leaves its own)
            for key in list(self._ended):
                self._drop_before(key, horizon)
        ended = self._ended.setdefault(r.key, deque(maxlen=MAX_PER_KEY))
        if r.visible_at < now:                      # else no hint showed it running
            ended.append((r.visible_at, now))
        self._drop_before(r.key, horizon)

    def _drop_before(self, key: Key, horizon: float) -> None:
        """Forget what ended before `horizon`: every fresh hint was measured later, and shows it."""
        ended = self._ended[key]
        while ended and ended[0][1] < horizon:
            ended.popleft()
        if not ended:
            del self._ended[key]
