"""Wire formats of the admin routes' request bodies that the OpenAPI document describes too."""
from __future__ import annotations

from typing import Literal

import msgspec


class AdapterAction(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /admin/adapters: load or unload one LoRA adapter of a model now."""

    model: str
    adapter: str
    action: Literal["load", "unload"]
    reason: str | None = None
