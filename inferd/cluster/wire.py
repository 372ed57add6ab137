"""Encrypted datagrams: sealing a Packet into bytes for one receiver and opening (checking) it again.

A datagram is MAGIC + a 12-byte random nonce + the AES-256-GCM ciphertext and tag of msgpack(Packet)
under the primary cluster key (inferd.cluster.keyring), with MAGIC + the receiving node's id as
associated data: nothing of it is readable on the wire, and a datagram sealed for B does not open on
C. A Sync to a seed whose node id is not known yet is sealed for "" (no receiver); any other body
sealed so is refused. `Opener.open` drops, with a reason it counts, anything that is too big, not
ours, altered, forged or sealed for another node (bad_mac: no accepted key opens it for this node),
addressed to nobody but not a Sync (unaddressed), sent outside the timestamp window, or replayed (a
sender's `seq` seen before, or older than its last REPLAY_WINDOW). Nothing malformed raises anything
but `Rejected`.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import msgspec

from inferd.cluster.keyring import FORWARD, MAC_BYTES, SEAL_OVERHEAD, ClusterKeyError, Keyring, load_key, load_keys
from inferd.cluster.messages import MAX_DATAGRAM, Body, MemberUpdate, Packet, Sync

MAGIC = b"IG\x02"
REPLAY_WINDOW = 64                 # seqs below a sender's highest by this much are refused as replays
REJECT_REASONS = ("oversize", "malformed", "bad_mac", "unaddressed", "stale", "replay")

_HEADER = len(MAGIC)
_MIN_DATAGRAM = _HEADER + SEAL_OVERHEAD + 1      # magic, nonce, at least one payload byte, tag
_WINDOW_MASK = (1 << REPLAY_WINDOW) - 1


class Rejected(Exception):
    """A datagram (or forwarded identity) that is dropped; `reason` is one of REJECT_REASONS (or, for an
    identity, inferd.cluster.identity's)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def _aad(receiver: str) -> bytes:
    return MAGIC + receiver.encode("utf-8")


def _array_header_extra(n: int) -> int:
    """Bytes a msgpack array header of `n` items takes beyond the 1-byte fixarray (n < 16)."""
    return 0 if n < 16 else 2 if n <= 0xFFFF else 4


class Sealer:
    """Seals this node's packets: sender id, rising seq (starting at the wall clock in microseconds),
    wall-clock timestamp; encrypted for one receiver."""

    def __init__(self, node_id: str, keyring: Keyring, *, wall_clock: Callable[[], float] = time.time) -> None:
        self._node_id = node_id
        self._keyring = keyring
        self._wall_clock = wall_clock
        self._seq = int(wall_clock() * 1e6)
        self._encoder = msgspec.msgpack.Encoder()

    def seal(self, body: Body, updates: Sequence[MemberUpdate] = (), receiver: str = "") -> tuple[bytes, int]:
        """(the datagram for node `receiver`, how many of `updates` it carries): as many as fit in
        MAX_DATAGRAM, in order. `receiver` "": a Sync to a seed whose node id is unknown (receivers refuse
        any other body sealed so). Raises ValueError if `body` alone does not fit (the caller splits)."""
        seq, ts = self._seq, float(self._wall_clock())
        encode = self._encoder.encode
        budget = MAX_DATAGRAM - _HEADER - SEAL_OVERHEAD          # AES-GCM's ciphertext is as long as its input
        payload = encode(Packet(self._node_id, seq, ts, body))
        if len(payload) > budget:
            raise ValueError(f"{type(body).__name__} body alone is {len(payload) + _HEADER + SEAL_OVERHEAD} bytes "
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
        return MAGIC + self._keyring.encrypt(_aad(receiver), payload), len(taken)

    def fits(self, body: Body) -> bool:
        """Whether `body` alone fits in one datagram."""
        payload = self._encoder.encode(Packet(self._node_id, self._seq, float(self._wall_clock()), body))
        return _HEADER + len(payload) + SEAL_OVERHEAD <= MAX_DATAGRAM


class Opener:
    """Checks incoming datagrams for node `node_id`. Keeps, per sender (at most `max_senders`, least
    recently heard forgotten first), the highest seq and which of the REPLAY_WINDOW below it were seen."""

    def __init__(self, keyring: Keyring, *, node_id: str, window_s: float,
                 wall_clock: Callable[[], float] = time.time, max_senders: int = 4096) -> None:
        if max_senders < 1:
            raise ValueError(f"max_senders must be at least 1, not {max_senders}")
        self._keyring = keyring
        self.node_id = node_id
        self.window_s = window_s
        self._wall_clock = wall_clock
        self._max_senders = max_senders
        self._decoder = msgspec.msgpack.Decoder(Packet)
        # sender -> [highest seq, bitmap]: bit i set when seq highest - i was seen (bit 0: highest itself)
        self._senders: OrderedDict[str, list[int]] = OrderedDict()

    window_s: float                 # settable: a reload changes it
    node_id: str                    # settable: gossip knows its own id once its socket is bound

    def open(self, data: bytes) -> Packet:
        """The packet, or Rejected(reason). Checks in cost order: size, magic, decryption (for this node, else
        for nobody: then only a Sync), decode, timestamp, replay."""
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
        sealed = data[_HEADER:]
        payload = self._keyring.decrypt(_aad(self.node_id), sealed) if self.node_id else None
        addressed = payload is not None
        if payload is None:
            payload = self._keyring.decrypt(_aad(""), sealed)
        if payload is None:
            raise Rejected("bad_mac")
        try:
            packet = self._decoder.decode(payload)
        except (msgspec.MsgspecError, ValueError, TypeError, OverflowError, RecursionError) as e:
            raise Rejected("malformed", str(e)[:200]) from None
        if not addressed and not isinstance(packet.body, Sync):
            raise Rejected("unaddressed", f"a {type(packet.body).__name__} from {packet.sender} names no receiver")
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


__all__ = ["FORWARD", "MAC_BYTES", "MAGIC", "MAX_DATAGRAM", "REJECT_REASONS", "ClusterKeyError", "Keyring",
           "Opener", "Rejected", "Sealer", "load_key", "load_keys"]
