"""Who is calling and what they may spend: API keys, quota buckets, the node's live tenancy."""
from __future__ import annotations

from inferd.tenancy.budget import BudgetExceeded, Budgets, budgeted, load_spend, period_start
from inferd.tenancy.keys import (
    SCOPES,
    AuthError,
    InsufficientScope,
    KeyFileError,
    Principal,
    create_key,
    load_authenticator,
    revoke_key,
)
from inferd.tenancy.keys_cli import keys_main
from inferd.tenancy.tenancy import Tenancy
from inferd.tenancy.quota import Lease, LimitExceeded, QuotaExceeded
from inferd.tenancy.refusals import NO_TURN, Paced, Turn

__all__ = [
    "AuthError", "BudgetExceeded", "Budgets", "InsufficientScope", "KeyFileError", "Lease", "LimitExceeded",
    "NO_TURN", "Paced", "Principal", "QuotaExceeded", "SCOPES", "Tenancy", "Turn", "budgeted", "create_key",
    "keys_main", "load_authenticator", "load_spend", "period_start", "revoke_key",
]
