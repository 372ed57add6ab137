"""The identity a forwarded request carries: who the caller is, signed by the node that authenticated them.

A node that spills a request to a peer does not pass the client's API key on: it sends
`X-Inferd-Forwarded: <token>`, the tenant (and key id) it authenticated, its own node id, the node id
of the peer it sends it to, the request id, a hash of the exact body forwarded and an expiry, MAC'd
with the cluster's primary key (purpose FORWARD). The peer trusts the tenant in a token that verifies
under any key of its keyring, names it as the destination (inferd.cluster.Cluster.verify), for that
body only, once, and until it expires; such a request is never forwarded again (one hop) and is not
charged against the tenant's quota again (the origin charged it).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections import OrderedDict
from collections.abc import Callable

import msgspec

from inferd.cluster.keyring import FORWARD, MAC_BYTES, Keyring
from inferd.cluster.wire import Rejected

HEADER = "X-Inferd-Forwarded"
TOKEN_TTL_S = 30.0
MAX_TOKEN_CHARS = 4096           # a longer header value is refused as malformed before any decoding

_B64URL = re.compile(r"[A-Za-z0-9_-]+")


class ForwardedIdentity(msgspec.Struct, array_like=True, frozen=True):
    tenant: str
    key_id: str | None
    origin: str                  # node id of the node that authenticated the caller
    destination: str             # node id of the peer it was sent to: refused by any other node
    request_id: str
    body_sha256: bytes           # the body this identity may be used with
    expires: float               # wall clock


def sign_identity(keyring: Keyring, ident: ForwardedIdentity) -> str:
    """The header value: base64url(msgpack(ident)) + "." + base64url(MAC)."""
    payload = _encoder.encode(ident)
    return _b64encode(payload) + "." + _b64encode(keyring.mac(FORWARD, payload))


def open_identity(keyring: Keyring, token: str, body: bytes, *,
                  wall_clock: Callable[[], float] = time.time) -> ForwardedIdentity:
    """The identity in `token`, if its MAC verifies, it has not expired and `body` is the one it was
    signed for; else raises inferd.cluster.wire.Rejected ("malformed", "bad_mac", "stale", or "body")."""
    ident = verify_token(keyring, token, wall_clock=wall_clock)
    check_body(ident, body)
    return ident


def verify_token(keyring: Keyring, token: str, *, wall_clock: Callable[[], float] = time.time) -> ForwardedIdentity:
    """`open_identity` without the body check: a receiving node refuses a bad token before it reads
    the body, then calls `check_body`."""
    if not isinstance(token, str):
        raise Rejected("malformed", f"token is {type(token).__name__}, not str")
    if len(token) > MAX_TOKEN_CHARS:
        raise Rejected("malformed", f"token longer than {MAX_TOKEN_CHARS} characters")
    parts = token.strip().split(".")
    if len(parts) != 2:
        raise Rejected("malformed", "token is not <payload>.<mac>")
    payload, mac = _b64decode(parts[0]), _b64decode(parts[1])
    if len(mac) != MAC_BYTES:
        raise Rejected("malformed", f"MAC is {len(mac)} bytes, not {MAC_BYTES}")
    if not keyring.verify(FORWARD, payload, mac):
        raise Rejected("bad_mac")
    try:
        ident = _decoder.decode(payload)
    except (msgspec.MsgspecError, ValueError, TypeError, OverflowError, RecursionError) as e:
        raise Rejected("malformed", str(e)[:200]) from None
    if not wall_clock() <= ident.expires:               # a NaN expiry never verifies either
        raise Rejected("stale", f"expired at {ident.expires}")
    return ident


def check_body(ident: ForwardedIdentity, body: bytes) -> None:
    """Rejected("body") unless `body` is the one `ident` was signed for."""
    try:
        digest = hashlib.sha256(body).digest()
    except TypeError:
        raise Rejected("body", f"body is {type(body).__name__}, not bytes") from None
    if not hmac.compare_digest(digest, ident.body_sha256):
        raise Rejected("body", "body is not the one the identity was signed for")


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ForwardedIdentity)


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    """Strict base64url without padding: any other character, or an impossible length, is malformed."""
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise Rejected("malformed", "not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise Rejected("malformed", "not base64url") from None


class UsedTokens:
    """The (origin, request id) of every token accepted and not expired yet: a token is good for one
    request, so one seen on the wire cannot be replayed (uncharged) within its TTL. Bounded by what
    TOKEN_TTL_S of forwarded requests holds; expired entries leave first (they expire in arrival order)."""

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self._clock = wall_clock
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()

    def use(self, ident: ForwardedIdentity) -> None:
        """Rejected("replay") if this identity's request was already accepted."""
        now = self._clock()
        while self._seen and next(iter(self._seen.values())) < now:
            self._seen.popitem(last=False)
        key = (ident.origin, ident.request_id)
        if key in self._seen:
            raise Rejected("replay", f"request {ident.request_id} from {ident.origin} was already forwarded")
        self._seen[key] = ident.expires
