"""The console's sessions and form tokens: what a browser holds instead of the admin key.

Logging in with an admin key issues a short-lived session token, HMAC-SHA256-signed with a secret that
lives only in this daemon's memory (a restart signs everyone out); the cookie carrying it is HttpOnly,
SameSite=Strict, and Secure when the listener is TLS. The key itself is never stored or sent back. Each
request checks the signature, the expiry, and that the key the session was opened with is still active (a
revoked key ends its sessions at once).

Every form that changes something carries a token bound to its session and to a fresh nonce; a token is
accepted once (a replayed form is refused) and only with its own session (a forged one is refused).
Used nonces are remembered until their session could have expired, at most MAX_USED of them.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

import msgspec

SESSION_TTL_S = 30 * 60.0
MAX_USED = 65536           # form nonces remembered (a bound: older ones expire with their sessions anyway)


class Session(msgspec.Struct, frozen=True):
    """Who is signed in: the admin key's id (None: auth mode "none") and tenant, and the session's nonce."""

    key_id: str | None
    tenant: str
    nonce: str
    expires: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ConsoleSessions:
    def __init__(self, ttl_s: float = SESSION_TTL_S, clock: Callable[[], float] = time.time) -> None:
        self._secret = secrets.token_bytes(32)
        self.ttl_s = ttl_s
        self._clock = clock
        self._used: OrderedDict[str, float] = OrderedDict()     # form nonce -> when it may be forgotten

    def _mac(self, *parts: str) -> bytes:
        return hmac.new(self._secret, "\x00".join(parts).encode(), hashlib.sha256).digest()

    # -- sessions --------------------------------------------------------------------------
    def issue(self, key_id: str | None, tenant: str) -> str:
        session = Session(key_id=key_id, tenant=tenant, nonce=secrets.token_urlsafe(16),
                          expires=self._clock() + self.ttl_s)
        payload = msgspec.json.encode(session)
        return f"{_b64(payload)}.{_b64(self._mac('session', payload.decode()))}"

    def verify(self, token: str | None) -> Session | None:
        """The session a cookie holds, or None (absent, malformed, forged or expired)."""
        if not token or token.count(".") != 1 or len(token) > 1024:
            return None
        payload_text, mac_text = token.split(".")
        try:
            payload, mac = _unb64(payload_text), _unb64(mac_text)
            if not hmac.compare_digest(mac, self._mac("session", payload.decode())):
                return None
            session = msgspec.json.decode(payload, type=Session)
        except (ValueError, UnicodeDecodeError, msgspec.DecodeError):
            return None
        return session if session.expires > self._clock() else None

    # -- form tokens -----------------------------------------------------------------------
    def form_token(self, session: Session) -> str:
        """A token for one form of `session`: accepted once, by that session only."""
        nonce = secrets.token_urlsafe(12)
        return f"{nonce}.{_b64(self._mac('form', session.nonce, nonce))}"

    def use_form_token(self, session: Session, token: str | None) -> bool:
        """Whether `token` was made for `session` and not used before (it is used up now)."""
        if not token or token.count(".") != 1 or len(token) > 256:
            return False
        nonce, mac_text = token.split(".")
        try:
            good = hmac.compare_digest(_unb64(mac_text), self._mac("form", session.nonce, nonce))
        except ValueError:
            return False
        now = self._clock()
        while self._used and (next(iter(self._used.values())) < now or len(self._used) >= MAX_USED):
            self._used.popitem(last=False)
        if not good or nonce in self._used:
            return False
        self._used[nonce] = session.expires
        return True


class SignInLimiter:
    """At most MAX_FAILURES failed sign-ins per client address in WINDOW_S; past it, sign-in waits. A bound on
    guessing (admin keys are 256-bit, so this is defence in depth) that costs one dict per address, 4096 at most."""

    MAX_FAILURES = 10
    WINDOW_S = 60.0
    MAX_ADDRESSES = 4096

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: OrderedDict[str, list[float]] = OrderedDict()

    def wait_s(self, address: str) -> float:
        """Seconds until `address` may try again (0: now)."""
        now = self._clock()
        times = [t for t in self._failures.get(address, ()) if t > now - self.WINDOW_S]
        if len(times) < self.MAX_FAILURES:
            return 0.0
        return times[0] + self.WINDOW_S - now

    def failed(self, address: str) -> None:
        now = self._clock()
        times = [t for t in self._failures.pop(address, []) if t > now - self.WINDOW_S] + [now]
        self._failures[address] = times[-self.MAX_FAILURES:]
        while len(self._failures) > self.MAX_ADDRESSES:
            self._failures.popitem(last=False)
