"""Authenticated datagrams: the cluster key, sealing a Packet into bytes and opening (checking) it again.

A datagram is MAGIC + msgpack(Packet) + HMAC-SHA256(key, MAGIC + payload). `Opener.open` drops, with a
reason it counts, anything that is too big, not ours, altered or forged (bad MAC, under the current key
or the previous one during its grace period), sent outside the timestamp window, or replayed (a
sender's `seq` seen before, or older than its last REPLAY_WINDOW). Nothing malformed raises anything
but `Rejected`. The same Keyring signs forwarded requests' identity (inferd.cluster.identity), under a
different purpose label so a datagram's MAC can never pass for an identity's or the reverse.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import msgspec

from inferd.cluster.messages import MAX_DATAGRAM, Body, MemberUpdate, Packet

MAGIC = b"IG\x01"
MAC_BYTES = 32
REPLAY_WINDOW = 64                 # seqs below a sender's highest by this much are refused as replays
REJECT_REASONS = ("oversize", "malformed", "bad_mac", "stale", "replay")
GOSSIP = b"gossip"                 # Keyring.mac purposes
FORWARD = b"forward"

_MIN_RAW_KEY = 32
_MIN_HEX_KEY = 64
_HEX = re.compile(rb"[0-9a-fA-F]+")
_HEADER = len(MAGIC)
_MIN_DATAGRAM = _HEADER + 1 + MAC_BYTES          # magic, at least one payload byte, MAC
_WINDOW_MASK = (1 << REPLAY_WINDOW) - 1


class ClusterKeyError(Exception):
    """The key file is missing, unreadable or too short; the message names the file."""


class Rejected(Exception):
    """A datagram (or forwarded identity) that is dropped; `reason` is one of REJECT_REASONS."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def load_key(path: str) -> bytes:
    """The cluster key from `path`: at least 64 hex digits, or at least 32 raw bytes (surrounding
    whitespace ignored). Raises ClusterKeyError naming the file."""
    try:
        with open(path, "rb") as f:
            raw = f.read().strip()
    except FileNotFoundError:
        raise ClusterKeyError(f"cluster key file {path}: does not exist") from None
    except IsADirectoryError:
        raise ClusterKeyError(f"cluster key file {path}: is a directory, not a file") from None
    except PermissionError:
        raise ClusterKeyError(f"cluster key file {path}: not readable (permission denied)") from None
    except OSError as e:
        raise ClusterKeyError(f"cluster key file {path}: cannot be read ({e.strerror or e})") from None
    if not raw:
        raise ClusterKeyError(f"cluster key file {path}: is empty (need at least {_MIN_HEX_KEY} hex digits "
                              f"or {_MIN_RAW_KEY} bytes)")
    if len(raw) >= _MIN_HEX_KEY and len(raw) % 2 == 0 and _HEX.fullmatch(raw):
        return bytes.fromhex(raw.decode("ascii"))
    if len(raw) < _MIN_RAW_KEY:
        raise ClusterKeyError(f"cluster key file {path}: too short ({len(raw)} bytes; need at least "
                              f"{_MIN_HEX_KEY} hex digits or {_MIN_RAW_KEY} bytes)")
    return raw


class _Key:
    """One key's HMAC state, with the purpose prefix already fed in (copied per message: cheap)."""

    __slots__ = ("key", "_base", "_by_purpose")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._base = hmac.new(key, digestmod=hashlib.sha256)
        self._by_purpose: dict[bytes, hmac.HMAC] = {}

    def mac(self, purpose: bytes, data: bytes) -> bytes:
        purpose = bytes(purpose)
        h = self._by_purpose.get(purpose)
        if h is None:
            if len(purpose) > 0xFFFF:
                raise ValueError("MAC purpose longer than 65535 bytes")
            h = self._base.copy()
            h.update(len(purpose).to_bytes(2, "big") + purpose)
            self._by_purpose[purpose] = h
        h = h.copy()
        h.update(data)
        return h.digest()


def _check_key(key: bytes) -> bytes:
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(f"cluster key must be bytes, not {type(key).__name__}")
    if not key:
        raise ValueError("cluster key is empty")
    return bytes(key)


class Keyring:
    """The current key, and the previous one until its grace period ends (rotation on SIGHUP)."""

    def __init__(self, key: bytes, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._current = _Key(_check_key(key))
        self._previous: _Key | None = None
        self._previous_until = 0.0

    def rotate(self, key: bytes, grace_s: float) -> bool:
        """Make `key` current; the old one verifies for `grace_s` more seconds. False (nothing changes)
        when `key` is already current."""
        key = _check_key(key)
        if hmac.compare_digest(key, self._current.key):
            return False
        self._previous = self._current
        self._previous_until = self._clock() + max(0.0, grace_s)
        self._current = _Key(key)
        return True

    def mac(self, purpose: bytes, data: bytes) -> bytes:
        """HMAC-SHA256 under the current key of `purpose` (length-prefixed) + `data`: MAC_BYTES bytes."""
        return self._current.mac(purpose, data)

    def verify(self, purpose: bytes, data: bytes, mac: bytes) -> bool:
        """Constant-time check against the current key, and the previous one within its grace period."""
        if len(mac) != MAC_BYTES:
            return False
        if hmac.compare_digest(self._current.mac(purpose, data), mac):
            return True
        previous = self._previous
        if previous is None:
            return False
        if not self._clock() < self._previous_until:
            self._previous = None                       # its grace period is over: forget it
            return False
        return hmac.compare_digest(previous.mac(purpose, data), mac)


def _array_header_extra(n: int) -> int:
    """Bytes a msgpack array header of `n` items takes beyond the 1-byte fixarray (n < 16)."""
    return 0 if n < 16 else 2 if n <= 0xFFFF else 4


class Sealer:
    """Seals this node's packets: sender id, rising seq (starting at the wall clock in microseconds),
    wall-clock timestamp, MAC."""

    def __init__(self, node_id: str, keyring: Keyring, *, wall_clock: Callable[[], float] = time.time) -> None:
        self._node_id = node_id
        self._keyring = keyring
        self._wall_clock = wall_clock
        self._seq = int(wall_clock() * 1e6)
        self._encoder = msgspec.msgpack.Encoder()

    def seal(self, body: Body, updates: Sequence[MemberUpdate] = ()) -> tuple[bytes, int]:
        """(the datagram, how many of `updates` it carries): as many as fit in MAX_DATAGRAM, in order.
        Raises ValueError if `body` alone does not fit (the caller splits what it sends)."""
        seq, ts = self._seq, float(self._wall_clock())
        encode = self._encoder.encode
        budget = MAX_DATAGRAM - _HEADER - MAC_BYTES
        payload = encode(Packet(self._node_id, seq, ts, body))
        if len(payload) > budget:
            raise ValueError(f"{type(body).__name__} body alone is {len(payload) + _HEADER + MAC_BYTES} bytes "
                             f"sealed; a datagram holds at most {MAX_DATAGRAM}")
        # Each update adds exactly its own encoding, plus the array header growing at 16 items.
        size, taken = len(payload), []
        for update in updates:
            n = len(taken)
            grown = size + len(encode(update)) + _array_header_extra(n + 1) - _array_header_extra(n)
            if grown > budget:
                break
            size = grown
            taken.append(update)
        if taken:
            payload = encode(Packet(self._node_id, seq, ts, body, tuple(taken)))
            while len(payload) > budget and taken:      # never expected: the arithmetic above is exact
                taken.pop()
                payload = encode(Packet(self._node_id, seq, ts, body, tuple(taken)))
        self._seq = seq + 1
        signed = MAGIC + payload
        return signed + self._keyring.mac(GOSSIP, signed), len(taken)

    def fits(self, body: Body) -> bool:
        """Whether `body` alone fits in one datagram."""
        payload = self._encoder.encode(Packet(self._node_id, self._seq, float(self._wall_clock()), body))
        return _HEADER + len(payload) + MAC_BYTES <= MAX_DATAGRAM


class Opener:
    """Checks incoming datagrams. Keeps, per sender (at most `max_senders`, least recently heard
    forgotten first), the highest seq and which of the REPLAY_WINDOW below it were seen."""

    def __init__(self, keyring: Keyring, *, window_s: float, wall_clock: Callable[[], float] = time.time,
                 max_senders: int = 4096) -> None:
        if max_senders < 1:
            raise ValueError(f"max_senders must be at least 1, not {max_senders}")
        self._keyring = keyring
        self.window_s = window_s
        self._wall_clock = wall_clock
        self._max_senders = max_senders
        self._decoder = msgspec.msgpack.Decoder(Packet)
        # sender -> [highest seq, bitmap]: bit i set when seq highest - i was seen (bit 0: highest itself)
        self._senders: OrderedDict[str, list[int]] = OrderedDict()

    window_s: float                 # settable: a reload changes it

    def open(self, data: bytes) -> Packet:
        """The packet, or Rejected(reason). Checks in cost order: size, magic, MAC, decode, timestamp, replay."""
        if not isinstance(data, bytes):
            if not isinstance(data, (bytearray, memoryview)):
                raise Rejected("malformed", f"not bytes: {type(data).__name__}")
            data = bytes(data)
        if len(data) > MAX_DATAGRAM:
            raise Rejected("oversize", f"{len(data)} bytes")
        if len(data) < _MIN_DATAGRAM:
            raise Rejected("malformed", f"{len(data)} bytes is too short")
        if data[:_HEADER] != MAGIC:
            raise Rejected("malformed", "bad magic")
        signed, mac = data[:-MAC_BYTES], data[-MAC_BYTES:]
        if not self._keyring.verify(GOSSIP, signed, mac):
            raise Rejected("bad_mac")
        try:
            packet = self._decoder.decode(signed[_HEADER:])
        except (msgspec.MsgspecError, ValueError, TypeError, OverflowError, RecursionError) as e:
            raise Rejected("malformed", str(e)[:200]) from None
        skew = self._wall_clock() - packet.ts
        if not abs(skew) <= self.window_s:            # NaN and inf timestamps are stale too
            raise Rejected("stale", f"{packet.sender} is {skew:.3f}s off")
        self._check_replay(packet.sender, packet.seq)
        return packet

    def _check_replay(self, sender: str, seq: int) -> None:
        senders = self._senders
        state = senders.get(sender)
        if state is None:
            senders[sender] = [seq, 1]
            if len(senders) > self._max_senders:
                senders.popitem(last=False)
            return
        highest, seen = state
        if seq > highest:
            shift = seq - highest
            state[0] = seq
            state[1] = ((seen << shift) | 1) & _WINDOW_MASK if shift < REPLAY_WINDOW else 1
        else:
            back = highest - seq
            if back >= REPLAY_WINDOW:
                raise Rejected("replay", f"{sender} seq {seq} is {back} below its highest")
            if (seen >> back) & 1:
                raise Rejected("replay", f"{sender} seq {seq} seen before")
            state[1] = seen | (1 << back)
        senders.move_to_end(sender)


__all__ = ["FORWARD", "GOSSIP", "MAC_BYTES", "MAX_DATAGRAM", "REJECT_REASONS", "ClusterKeyError", "Keyring",
           "Opener", "Rejected", "Sealer", "load_key"]
