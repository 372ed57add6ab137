"""inferd.cluster.wire: sealing datagrams (encrypted for one receiver) and opening them again."""
from __future__ import annotations

import math
import random

import msgspec
import pytest

from inferd.cluster.messages import MAX_DATAGRAM, Ack, Broadcast, Load, MemberUpdate, Packet, Ping, State, Sync
from inferd.cluster.keyring import FORWARD, SEAL_OVERHEAD
from inferd.cluster.wire import MAGIC, REJECT_REASONS, REPLAY_WINDOW, Keyring, Opener, Rejected, Sealer

KEY = bytes(range(32))
OTHER_KEY = bytes(range(100, 132))
NOW = 1_700_000_000.0
ME = "node-b"                   # the opener's own node id


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def keyring() -> Keyring:
    return Keyring(KEY, clock=FakeClock())


@pytest.fixture
def sealer(keyring: Keyring, wall: FakeClock) -> Sealer:
    return Sealer("node-a", keyring, wall_clock=wall)


@pytest.fixture
def opener(keyring: Keyring, wall: FakeClock) -> Opener:
    return Opener(keyring, node_id=ME, window_s=10.0, wall_clock=wall)


def update(i: int, pad: int = 0) -> MemberUpdate:
    return MemberUpdate(f"node-{i}", f"10.0.0.{i % 250}:7946", "http://h:8000" + "x" * pad, State.ALIVE, i, "node-a")


def craft(keyring: Keyring, payload: bytes, receiver: str = ME) -> bytes:
    """A correctly encrypted datagram around any payload (what a key holder could send)."""
    return MAGIC + keyring.encrypt(MAGIC + receiver.encode(), payload)


def packet(seq: int, ts: float = NOW, sender: str = "node-c") -> bytes:
    return msgspec.msgpack.encode(Packet(sender, seq, ts, Ping(1, "node-a")))


# Sealer and Opener

def test_sealed_packet_opens_to_the_same_packet(sealer: Sealer, opener: Opener) -> None:
    body = Load(0.5, (), ())
    datagram, carried = sealer.seal(body, [update(1), update(2)], ME)
    assert carried == 2 and datagram.startswith(MAGIC)
    got = opener.open(datagram)
    assert (got.sender, got.ts, got.body, got.updates) == ("node-a", NOW, body, (update(1), update(2)))


def test_seq_starts_at_wall_clock_microseconds_and_rises_per_seal(sealer: Sealer, opener: Opener) -> None:
    seqs = [opener.open(sealer.seal(Ack(i, "node-a"), (), ME)[0]).seq for i in range(3)]
    assert seqs == [int(NOW * 1e6), int(NOW * 1e6) + 1, int(NOW * 1e6) + 2]


def test_seal_fits_as_many_updates_as_fit_under_mtu(sealer: Sealer, opener: Opener) -> None:
    rng = random.Random(7)
    for _ in range(40):
        updates = [update(i, pad=rng.randrange(0, 120)) for i in range(rng.randrange(0, 60))]
        datagram, n = sealer.seal(Ping(3, "x"), updates, ME)
        assert len(datagram) <= MAX_DATAGRAM
        got = opener.open(datagram)
        assert got.updates == tuple(updates[:n])
        if n < len(updates):                                  # one more would not have fitted
            bigger = Packet("node-a", got.seq, NOW, Ping(3, "x"), tuple(updates[:n + 1]))
            assert len(MAGIC) + len(msgspec.msgpack.encode(bigger)) + SEAL_OVERHEAD > MAX_DATAGRAM


def test_seal_carries_more_than_sixteen_small_updates(sealer: Sealer, opener: Opener) -> None:
    updates = [update(i) for i in range(200)]
    datagram, n = sealer.seal(Broadcast(), updates, ME)
    assert 16 < n < 200 and len(datagram) <= MAX_DATAGRAM
    assert opener.open(datagram).updates == tuple(updates[:n])


def test_seal_raises_value_error_when_the_body_alone_does_not_fit(sealer: Sealer) -> None:
    big = Sync(tuple(update(i, pad=50) for i in range(30)), reply=True)
    assert not sealer.fits(big)
    with pytest.raises(ValueError, match="at most 1400"):
        sealer.seal(big)
    small = Sync(tuple(update(i) for i in range(3)), reply=False)
    assert sealer.fits(small)
    assert sealer.seal(small)[1] == 0


def test_replayed_datagram_is_rejected_as_replay(sealer: Sealer, opener: Opener) -> None:
    datagram, _ = sealer.seal(Broadcast(), (), ME)
    opener.open(datagram)
    with pytest.raises(Rejected) as info:
        opener.open(datagram)
    assert info.value.reason == "replay"


def test_out_of_order_within_window_is_accepted_once(keyring: Keyring, opener: Opener) -> None:
    opener.open(craft(keyring, packet(1000)))
    for seq in (990, 1000 - REPLAY_WINDOW + 1, 999):
        assert opener.open(craft(keyring, packet(seq))).seq == seq
    for seq in (990, 999, 1000):
        with pytest.raises(Rejected, match="replay"):
            opener.open(craft(keyring, packet(seq)))


def test_seq_a_full_window_below_the_highest_is_rejected_as_replay(keyring: Keyring, opener: Opener) -> None:
    opener.open(craft(keyring, packet(1000)))
    with pytest.raises(Rejected) as info:
        opener.open(craft(keyring, packet(1000 - REPLAY_WINDOW)))
    assert info.value.reason == "replay"


def test_window_slides_with_the_highest_seq(keyring: Keyring, opener: Opener) -> None:
    opener.open(craft(keyring, packet(1000)))
    opener.open(craft(keyring, packet(1010)))                 # 1000 still remembered as seen
    with pytest.raises(Rejected, match="replay"):
        opener.open(craft(keyring, packet(1000)))
    opener.open(craft(keyring, packet(1005)))
    opener.open(craft(keyring, packet(5000)))                 # a jump past the window forgets the rest
    opener.open(craft(keyring, packet(5000 - REPLAY_WINDOW + 1)))
    with pytest.raises(Rejected, match="replay"):
        opener.open(craft(keyring, packet(5000 - REPLAY_WINDOW)))


def test_senders_have_separate_replay_windows(keyring: Keyring, opener: Opener) -> None:
    opener.open(craft(keyring, packet(7, sender="b")))
    assert opener.open(craft(keyring, packet(7, sender="c"))).sender == "c"


def test_least_recently_heard_sender_is_forgotten_first(keyring: Keyring, wall: FakeClock) -> None:
    opener = Opener(keyring, node_id=ME, window_s=10.0, wall_clock=wall, max_senders=2)
    opener.open(craft(keyring, packet(1, sender="a")))
    opener.open(craft(keyring, packet(1, sender="b")))
    opener.open(craft(keyring, packet(2, sender="a")))        # a heard more recently than b
    opener.open(craft(keyring, packet(1, sender="c")))        # b forgotten
    assert opener.open(craft(keyring, packet(1, sender="b"))).sender == "b"   # a forgotten now
    with pytest.raises(Rejected, match="replay"):
        opener.open(craft(keyring, packet(1, sender="c")))    # c still remembered
    assert opener.open(craft(keyring, packet(2, sender="a"))).sender == "a"


def test_stale_timestamp_rejected(keyring: Keyring, opener: Opener, wall: FakeClock) -> None:
    for ts in (NOW - 10.5, NOW + 10.5, math.nan, math.inf):
        with pytest.raises(Rejected) as info:
            opener.open(craft(keyring, packet(1, ts=ts)))
        assert info.value.reason == "stale"
    assert opener.open(craft(keyring, packet(1, ts=NOW - 10.0))).seq == 1


def test_window_s_change_applies_to_the_next_datagram(keyring: Keyring, opener: Opener) -> None:
    opener.window_s = 60.0
    assert opener.open(craft(keyring, packet(1, ts=NOW - 30.0))).seq == 1


def test_altered_byte_is_rejected_as_bad_mac(sealer: Sealer, opener: Opener) -> None:
    datagram, _ = sealer.seal(Ping(1, "node-b"), [update(1)], ME)
    for i in range(len(MAGIC), len(datagram)):
        altered = bytearray(datagram)
        altered[i] ^= 0x01
        with pytest.raises(Rejected) as info:
            opener.open(bytes(altered))
        assert info.value.reason == "bad_mac"


def test_forged_packet_with_another_key_rejected(opener: Opener, wall: FakeClock) -> None:
    forged, _ = Sealer("node-a", Keyring(OTHER_KEY), wall_clock=wall).seal(Broadcast(), (), ME)
    with pytest.raises(Rejected) as info:
        opener.open(forged)
    assert info.value.reason == "bad_mac"


def test_forward_mac_does_not_pass_for_a_datagram(keyring: Keyring, opener: Opener) -> None:
    signed = MAGIC + bytes(12) + packet(1)
    with pytest.raises(Rejected, match="bad_mac"):
        opener.open(signed + keyring.mac(FORWARD, signed)[:16])


def test_oversize_datagram_rejected_as_oversize(opener: Opener) -> None:
    with pytest.raises(Rejected) as info:
        opener.open(MAGIC + bytes(MAX_DATAGRAM))
    assert info.value.reason == "oversize"


@pytest.mark.parametrize("data", [b"", MAGIC, MAGIC + bytes(SEAL_OVERHEAD), b"XX\x01" + bytes(100),
                                  b"IG\x01" + bytes(100)])          # the clear, MAC'd format before encryption
def test_short_or_foreign_datagram_rejected_as_malformed(opener: Opener, data: bytes) -> None:
    with pytest.raises(Rejected) as info:
        opener.open(data)
    assert info.value.reason == "malformed"


@pytest.mark.parametrize("payload", [
    b"\xc1",                                                   # never valid msgpack
    msgspec.msgpack.encode([1, 2, 3]),
    msgspec.msgpack.encode(["b", "not an int", 1.0, ["ping", 1, "a"]]),
    msgspec.msgpack.encode(["b", 1, NOW, ["nope", 1]]),
    msgspec.msgpack.encode(["b", 1, NOW, ["ping", 1, "a"], [["n", "a", "h", 9, 1, "b"]]]),  # state 9
    packet(1) + b"\x00",                                      # trailing bytes
])
def test_encrypted_payload_that_is_not_a_packet_is_rejected_as_malformed(keyring: Keyring, opener: Opener,
                                                                     payload: bytes) -> None:
    with pytest.raises(Rejected) as info:
        opener.open(craft(keyring, payload))
    assert info.value.reason == "malformed"


def test_random_bytes_never_raise_anything_but_rejected(sealer: Sealer, keyring: Keyring, opener: Opener) -> None:
    rng = random.Random(1234)
    valid, _ = sealer.seal(Load(1.0, (), ()), [update(i) for i in range(5)], ME)
    payload = msgspec.msgpack.encode(opener.open(valid))
    for i in range(3000):
        kind = i % 4
        if kind == 0:
            data = rng.randbytes(rng.randrange(0, MAX_DATAGRAM + 50))
        elif kind == 1:
            data = MAGIC + rng.randbytes(rng.randrange(0, 200))
        else:
            mutated = bytearray(payload)
            for _ in range(rng.randrange(1, 6)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            mutated = mutated[:rng.randrange(len(mutated) + 1)] if rng.random() < 0.3 else mutated
            # kind 3 encrypts the mutation, so the decoder (not the decryption) has to refuse it
            data = craft(keyring, bytes(mutated)) if kind == 3 else MAGIC + valid[len(MAGIC):len(MAGIC) + 12] + \
                bytes(mutated) + valid[-16:]
        try:
            opener.open(data)
        except Rejected as e:
            assert e.reason in REJECT_REASONS


# Encryption for one receiver

def test_a_datagram_sealed_for_one_node_does_not_open_on_another(sealer: Sealer, keyring: Keyring,
                                                                  wall: FakeClock) -> None:
    datagram, _ = sealer.seal(Ping(1, ME), (), ME)
    elsewhere = Opener(keyring, node_id="node-c", window_s=10.0, wall_clock=wall)
    with pytest.raises(Rejected) as info:
        elsewhere.open(datagram)                              # a genuine B-bound datagram replayed to C
    assert info.value.reason == "bad_mac"
    assert Opener(keyring, node_id=ME, window_s=10.0, wall_clock=wall).open(datagram).body == Ping(1, ME)


def test_only_a_sync_may_name_no_receiver(sealer: Sealer, opener: Opener) -> None:
    join = Sync((update(1),), reply=True)
    assert opener.open(sealer.seal(join, (), "")[0]).body == join       # a join to a seed address
    for body in (Ping(1, ME), Load(0.0, (), ()), Broadcast()):
        with pytest.raises(Rejected) as info:
            opener.open(sealer.seal(body, (), "")[0])
        assert info.value.reason == "unaddressed"


def test_nothing_of_the_packet_is_in_clear_on_the_wire(sealer: Sealer, opener: Opener) -> None:
    from inferd.cluster.messages import TenantDemand
    load = Load(0.0, (), (TenantDemand("acme-corp", 6.6, 0, 0.0, 0),))
    datagram, _ = sealer.seal(load, [update(1)], ME)
    clear = msgspec.msgpack.encode(Packet("node-a", 1, NOW, load, (update(1),)))
    assert b"acme-corp" not in datagram and b"node-a" not in datagram and b"10.0.0.1" not in datagram
    assert not any(clear[i:i + 8] in datagram for i in range(len(clear) - 8))   # no 8-byte run of the packet
    assert opener.open(datagram).body == load
    again, _ = sealer.seal(load, [update(1)], ME)
    assert again[len(MAGIC):len(MAGIC) + 12] != datagram[len(MAGIC):len(MAGIC) + 12]      # a fresh nonce


def test_a_datagram_sealed_under_a_second_key_opens(wall: FakeClock) -> None:
    both = Keyring([KEY, OTHER_KEY], clock=FakeClock())
    datagram, _ = Sealer("node-a", Keyring([OTHER_KEY, KEY]), wall_clock=wall).seal(Broadcast(), (), ME)
    assert Opener(both, node_id=ME, window_s=10.0, wall_clock=wall).open(datagram).sender == "node-a"
    with pytest.raises(Rejected, match="bad_mac"):
        Opener(Keyring(KEY), node_id=ME, window_s=10.0, wall_clock=wall).open(datagram)
