"""inferd.cluster.wire: the cluster key file, the keyring, sealing and opening datagrams."""
from __future__ import annotations

import builtins
import math
import random
from pathlib import Path

import msgspec
import pytest

from inferd.cluster.messages import MAX_DATAGRAM, Ack, Broadcast, Load, MemberUpdate, Packet, Ping, State, Sync
from inferd.cluster.wire import (
    FORWARD,
    GOSSIP,
    MAC_BYTES,
    MAGIC,
    REJECT_REASONS,
    REPLAY_WINDOW,
    ClusterKeyError,
    Keyring,
    Opener,
    Rejected,
    Sealer,
    load_key,
)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(100, 132))
NOW = 1_700_000_000.0


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
    return Opener(keyring, window_s=10.0, wall_clock=wall)


def update(i: int, pad: int = 0) -> MemberUpdate:
    return MemberUpdate(f"node-{i}", f"10.0.0.{i % 250}:7946", "http://h:8000" + "x" * pad, State.ALIVE, i, "node-a")


def craft(keyring: Keyring, payload: bytes) -> bytes:
    """A correctly MAC'd datagram around any payload (what a key holder could send)."""
    signed = MAGIC + payload
    return signed + keyring.mac(GOSSIP, signed)


def packet(seq: int, ts: float = NOW, sender: str = "node-b") -> bytes:
    return msgspec.msgpack.encode(Packet(sender, seq, ts, Ping(1, "node-a")))


# load_key

def test_load_key_reads_hex_digits_as_bytes(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("  " + KEY.hex() * 2 + "\n")
    assert load_key(str(path)) == KEY * 2


def test_load_key_reads_raw_bytes_with_whitespace_stripped(tmp_path: Path) -> None:
    path = tmp_path / "key"
    raw = b"not-hex-but-long-enough-to-be-a-key-" + bytes([200, 201])
    path.write_bytes(b"\n" + raw + b" \n")
    assert load_key(str(path)) == raw


def test_load_key_short_hex_is_taken_as_raw_bytes(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("ab" * 20)
    assert load_key(str(path)) == b"ab" * 20


@pytest.mark.parametrize(("content", "problem"), [
    (None, "does not exist"),
    (b"short\n", r"too short \(5 bytes"),
    (b" \n\t", "is empty"),
    ("dir", "is a directory"),
])
def test_load_key_errors_name_the_path_and_the_problem(tmp_path: Path, content: bytes | str | None,
                                                       problem: str) -> None:
    path = tmp_path / "key"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(ClusterKeyError, match=problem) as info:
        load_key(str(path))
    assert str(path) in str(info.value)


def test_load_key_unreadable_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "key"
    path.write_bytes(KEY)

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(builtins, "open", denied)
    with pytest.raises(ClusterKeyError, match="not readable") as info:
        load_key(str(path))
    assert str(path) in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


# Keyring

def test_mac_is_32_bytes_and_depends_on_the_purpose(keyring: Keyring) -> None:
    mac = keyring.mac(GOSSIP, b"data")
    assert len(mac) == MAC_BYTES
    assert keyring.verify(GOSSIP, b"data", mac)
    assert not keyring.verify(FORWARD, b"data", mac)
    assert not keyring.verify(GOSSIP, b"datA", mac)
    assert not keyring.verify(GOSSIP, b"data", mac[:-1])


def test_purpose_is_length_prefixed_so_it_cannot_slide_into_data(keyring: Keyring) -> None:
    assert keyring.mac(b"ab", b"c") != keyring.mac(b"a", b"bc")


def test_rotate_to_the_current_key_returns_false(keyring: Keyring) -> None:
    assert keyring.rotate(KEY, grace_s=5.0) is False
    assert keyring.rotate(OTHER_KEY, grace_s=5.0) is True


def test_previous_key_verifies_until_grace_ends() -> None:
    clock = FakeClock(100.0)
    keyring = Keyring(KEY, clock=clock)
    old_mac = keyring.mac(GOSSIP, b"data")
    assert keyring.rotate(OTHER_KEY, grace_s=30.0)
    assert keyring.mac(GOSSIP, b"data") != old_mac            # signs with the new key
    clock.now = 129.9
    assert keyring.verify(GOSSIP, b"data", old_mac)
    clock.now = 130.0
    assert not keyring.verify(GOSSIP, b"data", old_mac)
    clock.now = 100.0                                         # forgotten for good once the grace ended
    assert not keyring.verify(GOSSIP, b"data", old_mac)


def test_datagram_sealed_under_old_key_opens_during_grace(wall: FakeClock) -> None:
    clock = FakeClock()
    old, new = Keyring(KEY, clock=clock), Keyring(OTHER_KEY, clock=clock)
    datagram, _ = Sealer("node-b", old, wall_clock=wall).seal(Broadcast())
    new.rotate(KEY, grace_s=0)
    new.rotate(OTHER_KEY, grace_s=10.0)                      # KEY is now the previous key
    assert Opener(new, window_s=10.0, wall_clock=wall).open(datagram).sender == "node-b"
    clock.now = 10.0
    with pytest.raises(Rejected) as info:
        Opener(new, window_s=10.0, wall_clock=wall).open(datagram)
    assert info.value.reason == "bad_mac"


# Sealer and Opener

def test_sealed_packet_opens_to_the_same_packet(sealer: Sealer, opener: Opener) -> None:
    body = Load(0.5, (), ())
    datagram, carried = sealer.seal(body, [update(1), update(2)])
    assert carried == 2 and datagram.startswith(MAGIC)
    got = opener.open(datagram)
    assert (got.sender, got.ts, got.body, got.updates) == ("node-a", NOW, body, (update(1), update(2)))


def test_seq_starts_at_wall_clock_microseconds_and_rises_per_seal(sealer: Sealer, opener: Opener) -> None:
    seqs = [opener.open(sealer.seal(Ack(i, "node-a"))[0]).seq for i in range(3)]
    assert seqs == [int(NOW * 1e6), int(NOW * 1e6) + 1, int(NOW * 1e6) + 2]


def test_seal_fits_as_many_updates_as_fit_under_mtu(sealer: Sealer, opener: Opener) -> None:
    rng = random.Random(7)
    for _ in range(40):
        updates = [update(i, pad=rng.randrange(0, 120)) for i in range(rng.randrange(0, 60))]
        datagram, n = sealer.seal(Ping(3, "x"), updates)
        assert len(datagram) <= MAX_DATAGRAM
        got = opener.open(datagram)
        assert got.updates == tuple(updates[:n])
        if n < len(updates):                                  # one more would not have fitted
            bigger = Packet("node-a", got.seq, NOW, Ping(3, "x"), tuple(updates[:n + 1]))
            assert len(MAGIC) + len(msgspec.msgpack.encode(bigger)) + MAC_BYTES > MAX_DATAGRAM


def test_seal_carries_more_than_sixteen_small_updates(sealer: Sealer, opener: Opener) -> None:
    updates = [update(i) for i in range(200)]
    datagram, n = sealer.seal(Broadcast(), updates)
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
    datagram, _ = sealer.seal(Broadcast())
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
    opener = Opener(keyring, window_s=10.0, wall_clock=wall, max_senders=2)
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
    datagram, _ = sealer.seal(Ping(1, "node-b"), [update(1)])
    for i in range(len(MAGIC), len(datagram)):
        altered = bytearray(datagram)
        altered[i] ^= 0x01
        with pytest.raises(Rejected) as info:
            opener.open(bytes(altered))
        assert info.value.reason == "bad_mac"


def test_forged_packet_with_another_key_rejected(opener: Opener, wall: FakeClock) -> None:
    forged, _ = Sealer("node-a", Keyring(OTHER_KEY), wall_clock=wall).seal(Broadcast())
    with pytest.raises(Rejected) as info:
        opener.open(forged)
    assert info.value.reason == "bad_mac"


def test_forward_mac_does_not_pass_for_a_datagram(keyring: Keyring, opener: Opener) -> None:
    signed = MAGIC + packet(1)
    with pytest.raises(Rejected, match="bad_mac"):
        opener.open(signed + keyring.mac(FORWARD, signed))


def test_oversize_datagram_rejected_as_oversize(opener: Opener) -> None:
    with pytest.raises(Rejected) as info:
        opener.open(MAGIC + bytes(MAX_DATAGRAM))
    assert info.value.reason == "oversize"


@pytest.mark.parametrize("data", [b"", MAGIC, MAGIC + bytes(MAC_BYTES), b"XX\x01" + bytes(100)])
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
def test_maced_payload_that_is_not_a_packet_is_rejected_as_malformed(keyring: Keyring, opener: Opener,
                                                                     payload: bytes) -> None:
    with pytest.raises(Rejected) as info:
        opener.open(craft(keyring, payload))
    assert info.value.reason == "malformed"


def test_random_bytes_never_raise_anything_but_rejected(sealer: Sealer, keyring: Keyring, opener: Opener) -> None:
    rng = random.Random(1234)
    valid, _ = sealer.seal(Load(1.0, (), ()), [update(i) for i in range(5)])
    payload = valid[len(MAGIC):-MAC_BYTES]
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
            # kind 3 re-MACs the mutation, so the decoder (not the MAC) has to refuse it
            data = craft(keyring, bytes(mutated)) if kind == 3 else MAGIC + bytes(mutated) + valid[-MAC_BYTES:]
        try:
            opener.open(data)
        except Rejected as e:
            assert e.reason in REJECT_REASONS
