"""inferd.cluster.keyring: the key file (one key a line, the first primary) and rotation on reload."""
from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from inferd.cluster.keyring import (FORWARD, MAC_BYTES, SEAL_OVERHEAD, ClusterKeyError, Keyring, fingerprint,
                                    load_key, load_keys)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(100, 132))
THIRD_KEY = bytes(range(150, 182))
AAD = b"IG\x02node-b"


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write(tmp_path: Path, content: bytes | str) -> str:
    path = tmp_path / "cluster.key"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return str(path)


# the key file

def test_load_key_reads_hex_digits_as_bytes(tmp_path: Path) -> None:
    assert load_key(write(tmp_path, "  " + KEY.hex() * 2 + "\n")) == KEY * 2


def test_load_key_reads_raw_bytes_with_whitespace_stripped(tmp_path: Path) -> None:
    raw = b"not-hex-but-long-enough-to-be-a-key-" + bytes([200, 201])
    assert load_key(write(tmp_path, b"\n" + raw + b" \n")) == raw


def test_load_key_short_hex_is_taken_as_raw_bytes(tmp_path: Path) -> None:
    assert load_key(write(tmp_path, "ab" * 20)) == b"ab" * 20


def test_several_keys_one_a_line_first_is_primary_comments_and_blanks_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, f"# the new key, in use since the second SIGHUP\n{OTHER_KEY.hex()}\n\n"
                           f"  {KEY.hex()}  \n# old: remove after every node uses the new one\n")
    assert load_keys(path) == [OTHER_KEY, KEY]
    assert load_key(path) == OTHER_KEY


@pytest.mark.parametrize(("content", "problem"), [
    (None, "does not exist"),
    (b"short\n", r"too short \(5 bytes"),
    (b" \n\t", "is empty"),
    ("dir", "is a directory"),
    (f"{KEY.hex()}\n{KEY.hex()[:-2]}\n".encode(), r"line 2: expected a key of at least 64 hex digits"),
    (f"{KEY.hex()}\nnot a key at all, but long enough\n".encode(), "line 2: expected"),
    (f"# keys\n{KEY.hex()}\n\n{KEY.hex()}\n".encode(), "line 4: the same key as line 2"),
])
def test_key_file_errors_name_the_path_and_the_problem(tmp_path: Path, content: bytes | str | None,
                                                       problem: str) -> None:
    path = tmp_path / "key"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(ClusterKeyError, match=problem) as info:
        load_keys(str(path))
    assert str(path) in str(info.value)


def test_load_key_unreadable_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, KEY)

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(builtins, "open", denied)
    with pytest.raises(ClusterKeyError, match="not readable") as info:
        load_keys(path)
    assert path in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


# MACs and encryption

def test_mac_is_32_bytes_and_depends_on_the_purpose() -> None:
    keyring = Keyring(KEY)
    mac = keyring.mac(FORWARD, b"data")
    assert len(mac) == MAC_BYTES
    assert keyring.verify(FORWARD, b"data", mac)
    assert not keyring.verify(b"other", b"data", mac)
    assert not keyring.verify(FORWARD, b"datA", mac)
    assert not keyring.verify(FORWARD, b"data", mac[:-1])


def test_purpose_is_length_prefixed_so_it_cannot_slide_into_data() -> None:
    keyring = Keyring(KEY)
    assert keyring.mac(b"ab", b"c") != keyring.mac(b"a", b"bc")


def test_encryption_round_trips_only_with_the_same_associated_data() -> None:
    keyring = Keyring(KEY)
    sealed = keyring.encrypt(AAD, b"hello")
    assert len(sealed) == 5 + SEAL_OVERHEAD and b"hello" not in sealed
    assert keyring.decrypt(AAD, sealed) == b"hello"
    assert keyring.decrypt(b"IG\x02node-c", sealed) is None
    assert keyring.decrypt(AAD, sealed[:-1]) is None and keyring.decrypt(AAD, b"") is None


def test_the_primary_sends_and_every_key_in_the_file_is_accepted() -> None:
    installed = Keyring([KEY, OTHER_KEY])
    old_only, new_first = Keyring(KEY), Keyring([OTHER_KEY, KEY])
    assert old_only.decrypt(AAD, installed.encrypt(AAD, b"x")) == b"x"          # sends with the first
    assert installed.decrypt(AAD, new_first.encrypt(AAD, b"x")) == b"x"         # accepts the second
    assert installed.verify(FORWARD, b"x", new_first.mac(FORWARD, b"x"))
    assert old_only.decrypt(AAD, new_first.encrypt(AAD, b"x")) is None


def test_gossip_encryption_key_is_derived_not_the_cluster_key_itself() -> None:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    sealed = Keyring(KEY).encrypt(AAD, b"x")
    with pytest.raises(InvalidTag):
        AESGCM(KEY).decrypt(sealed[:12], sealed[12:], AAD)


# reloads

def test_update_to_the_same_keys_returns_false_and_a_new_order_true() -> None:
    keyring = Keyring([KEY, OTHER_KEY])
    assert keyring.update([KEY, OTHER_KEY], grace_s=5.0) is False
    assert keyring.update([OTHER_KEY, KEY], grace_s=5.0) is True
    assert keyring.primary_fingerprint == fingerprint(OTHER_KEY)


def test_a_key_that_left_the_file_is_accepted_until_its_grace_ends() -> None:
    clock = FakeClock(100.0)
    keyring = Keyring(KEY, clock=clock)
    old_mac, old_sealed = keyring.mac(FORWARD, b"data"), keyring.encrypt(AAD, b"data")
    assert keyring.update([OTHER_KEY], grace_s=30.0)
    assert keyring.mac(FORWARD, b"data") != old_mac                     # signs with the new key
    clock.now = 129.9
    assert keyring.verify(FORWARD, b"data", old_mac) and keyring.decrypt(AAD, old_sealed) == b"data"
    assert fingerprint(KEY) in keyring.fingerprints()
    clock.now = 130.0
    assert not keyring.verify(FORWARD, b"data", old_mac) and keyring.decrypt(AAD, old_sealed) is None
    clock.now = 100.0                                                   # forgotten for good once the grace ended
    assert not keyring.verify(FORWARD, b"data", old_mac)
    assert keyring.fingerprints() == [fingerprint(OTHER_KEY)]


def test_the_three_step_rotation_never_leaves_a_sender_unaccepted() -> None:
    """Install, use, remove: at every moment of every step, whichever nodes have reloaded, what any
    node sends opens on every other (no grace period needed)."""
    steps = [[KEY], [KEY, OTHER_KEY], [OTHER_KEY, KEY], [OTHER_KEY]]
    for step in range(1, len(steps)):
        ahead, behind = Keyring(steps[step], clock=FakeClock()), Keyring(steps[step - 1], clock=FakeClock())
        for sender, receiver in ((ahead, behind), (behind, ahead)):
            assert receiver.decrypt(AAD, sender.encrypt(AAD, b"ping")) == b"ping", step
    one_step_ahead, behind = Keyring([OTHER_KEY]), Keyring([KEY])
    assert behind.decrypt(AAD, one_step_ahead.encrypt(AAD, b"ping")) is None   # why one step splits


def test_a_key_put_back_before_its_grace_ends_is_in_use_again() -> None:
    clock = FakeClock()
    keyring = Keyring([KEY, OTHER_KEY], clock=clock)
    keyring.update([KEY], grace_s=1.0)
    keyring.update([KEY, OTHER_KEY], grace_s=1.0)
    clock.now = 5.0
    assert keyring.decrypt(AAD, Keyring(OTHER_KEY).encrypt(AAD, b"x")) == b"x"
    keyring.update([THIRD_KEY], grace_s=1.0)
    assert sorted(keyring.fingerprints()) == sorted(fingerprint(k) for k in (THIRD_KEY, KEY, OTHER_KEY))


def test_a_keyring_needs_a_key() -> None:
    with pytest.raises(ValueError):
        Keyring([])
    with pytest.raises(ValueError):
        Keyring([b""])
    with pytest.raises(TypeError):
        Keyring(["text"])  # type: ignore[list-item]
