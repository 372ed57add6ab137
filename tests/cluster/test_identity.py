"""inferd.cluster.identity: signing and checking the identity a forwarded request carries."""
from __future__ import annotations

import base64
import hashlib
import math
import random

import msgspec
import pytest

from inferd.cluster.identity import MAX_TOKEN_CHARS, ForwardedIdentity, open_identity, sign_identity
from inferd.cluster.keyring import FORWARD, Keyring
from inferd.cluster.wire import Rejected

KEY = bytes(range(32))
OTHER_KEY = bytes(range(100, 132))
NOW = 1_700_000_000.0
BODY = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}'


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ident(body: bytes = BODY, expires: float = NOW + 30.0, key_id: str | None = "k1") -> ForwardedIdentity:
    return ForwardedIdentity("acme", key_id, "node-a", "node-b", "req-1", hashlib.sha256(body).digest(), expires)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def reason(keyring: Keyring, token: object, body: object = BODY, now: float = NOW) -> str:
    with pytest.raises(Rejected) as info:
        open_identity(keyring, token, body, wall_clock=lambda: now)  # type: ignore[arg-type]
    return info.value.reason


@pytest.fixture
def keyring() -> Keyring:
    return Keyring(KEY, clock=FakeClock())


def test_signed_identity_round_trips(keyring: Keyring) -> None:
    for key_id in ("k1", None):
        token = sign_identity(keyring, ident(key_id=key_id))
        assert "=" not in token and token.count(".") == 1
        assert open_identity(keyring, token, BODY, wall_clock=lambda: NOW) == ident(key_id=key_id)


def test_identity_verifies_until_it_expires(keyring: Keyring) -> None:
    token = sign_identity(keyring, ident(expires=NOW + 30.0))
    assert open_identity(keyring, token, BODY, wall_clock=lambda: NOW + 30.0).tenant == "acme"
    assert reason(keyring, token, now=NOW + 30.001) == "stale"


def test_nan_expiry_is_stale(keyring: Keyring) -> None:
    assert reason(keyring, sign_identity(keyring, ident(expires=math.nan))) == "stale"


def test_other_body_is_rejected_as_body(keyring: Keyring) -> None:
    token = sign_identity(keyring, ident())
    assert reason(keyring, token, body=BODY + b" ") == "body"
    assert reason(keyring, token, body=b"") == "body"
    assert reason(keyring, token, body="not bytes") == "body"


def test_tampered_payload_is_rejected_as_bad_mac(keyring: Keyring) -> None:
    token = sign_identity(keyring, ident())
    payload, mac = token.split(".")
    forged = msgspec.msgpack.encode(ForwardedIdentity("other-tenant", "k1", "node-a", "node-b", "req-1",
                                                      hashlib.sha256(BODY).digest(), NOW + 30.0))
    assert reason(keyring, b64(forged) + "." + mac) == "bad_mac"
    flipped = bytearray(base64.urlsafe_b64decode(mac + "="))
    flipped[0] ^= 1
    assert reason(keyring, payload + "." + b64(bytes(flipped))) == "bad_mac"


def test_identity_signed_with_another_key_is_rejected_as_bad_mac(keyring: Keyring) -> None:
    assert reason(keyring, sign_identity(Keyring(OTHER_KEY), ident())) == "bad_mac"


def test_another_purposes_mac_does_not_pass_for_an_identity(keyring: Keyring) -> None:
    payload = msgspec.msgpack.encode(ident())
    assert reason(keyring, b64(payload) + "." + b64(keyring.mac(b"other", payload))) == "bad_mac"


def test_identity_signed_with_any_key_in_the_file_verifies() -> None:
    token = sign_identity(Keyring([OTHER_KEY, KEY]), ident())         # a peer already using the new key
    assert open_identity(Keyring([KEY, OTHER_KEY]), token, BODY, wall_clock=lambda: NOW).origin == "node-a"
    assert reason(Keyring(KEY), token) == "bad_mac"


def test_identity_signed_before_rotation_verifies_during_grace() -> None:
    clock = FakeClock()
    keyring = Keyring(KEY, clock=clock)
    token = sign_identity(keyring, ident())
    keyring.update([OTHER_KEY], grace_s=5.0)
    assert open_identity(keyring, token, BODY, wall_clock=lambda: NOW).origin == "node-a"
    clock.now = 5.0
    assert reason(keyring, token) == "bad_mac"


@pytest.mark.parametrize("token", [
    "", ".", "abc", "a.b.c", "abc.", ".abc", "ab=.cd", "a b.cd", "é.cd", "x" * (MAX_TOKEN_CHARS + 1),
    "AA.AAAA",                                             # a MAC of the wrong length
    "abcde.AAAA",                                          # impossible base64 length
])
def test_malformed_token_is_rejected_as_malformed(keyring: Keyring, token: str) -> None:
    assert reason(keyring, token) == "malformed"


def test_non_string_token_is_rejected_as_malformed(keyring: Keyring) -> None:
    assert reason(keyring, None) == "malformed"
    assert reason(keyring, b"a.b") == "malformed"


def test_maced_payload_that_is_not_an_identity_is_rejected_as_malformed(keyring: Keyring) -> None:
    for payload in (b"\xc1", msgspec.msgpack.encode(["acme", None, "a", "b", "r", "not bytes", 1.0]),
                    msgspec.msgpack.encode(["acme", None, "a", "r", b"x" * 32, 1.0]),    # no destination
                    msgspec.msgpack.encode({"tenant": "acme"})):
        assert reason(keyring, b64(payload) + "." + b64(keyring.mac(FORWARD, payload))) == "malformed"


def test_random_tokens_never_raise_anything_but_rejected(keyring: Keyring) -> None:
    rng = random.Random(99)
    valid = sign_identity(keyring, ident())
    alphabet = "ABCxyz019-_.=+/ é\x00"
    for i in range(2000):
        if i % 2:
            chars = list(valid)
            for _ in range(rng.randrange(1, 4)):
                chars[rng.randrange(len(chars))] = rng.choice(alphabet)
            token = "".join(chars)
        else:
            token = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
        try:
            open_identity(keyring, token, BODY, wall_clock=lambda: NOW)
        except Rejected as e:
            assert e.reason in ("malformed", "bad_mac", "stale", "body")


def test_a_token_is_good_for_one_request_until_it_expires():
    from inferd.cluster.identity import UsedTokens

    now = [1000.0]
    used = UsedTokens(wall_clock=lambda: now[0])
    first = ForwardedIdentity(tenant="t", key_id=None, origin="a", destination="b", request_id="r1",
                              body_sha256=b"x" * 32, expires=1030.0)
    used.use(first)
    with pytest.raises(Rejected) as exc:
        used.use(first)
    assert exc.value.reason == "replay"
    used.use(msgspec.structs.replace(first, request_id="r2"))     # another request: fine
    now[0] = 1031.0                                               # expired entries are forgotten
    used.use(first)
