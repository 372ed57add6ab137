"""Who is calling and what they may spend: API keys, quota buckets, the node's live tenancy."""
from __future__ import annotations

from inferd.tenancy.keys import AuthError, InsufficientScope, KeyFileError, Principal, load_authenticator
from inferd.tenancy.keys_cli import keys_main
from inferd.tenancy.node import Tenancy
from inferd.tenancy.quota import Lease, LimitExceeded, QuotaExceeded

__all__ = [
    "AuthError", "InsufficientScope", "KeyFileError", "Lease", "LimitExceeded", "Principal", "QuotaExceeded", "Tenancy",
    "keys_main", "load_authenticator",
]
